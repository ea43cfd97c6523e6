// The test control plane itself: a real kube-apiserver, controller manager and scheduler with
// kwok's fake nodes. Jobs run the way the KubernetesLauncher will use them: an Indexed Job's
// pods are scheduled onto fake nodes, and the exit codes a test chooses complete or fail it.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ApiException, BatchV1Api, CoreV1Api, type V1Job, type V1Pod } from '@kubernetes/client-node';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';

let cluster: KubeCluster;
let core: CoreV1Api;
let batch: BatchV1Api;
let nodes: string[];

before(async () => {
  const started = Date.now();
  cluster = await startKubeCluster();
  console.log(`# kube cluster started in ${Date.now() - started} ms`);
  core = cluster.kubeConfig().makeApiClient(CoreV1Api);
  batch = cluster.kubeConfig().makeApiClient(BatchV1Api);
  nodes = await cluster.addFakeNodes(2, { 'moerl.dev/pool': 'trainers' }, { 'nvidia.com/gpu': '8' });
});
after(async () => {
  await cluster?.stop();
});

// An Indexed Job of `completions` trainer ranks, one per node, as the launcher will create.
function indexedJob(name: string, completions: number): V1Job {
  return {
    metadata: { name },
    spec: {
      completionMode: 'Indexed',
      completions,
      parallelism: completions,
      backoffLimit: 0,
      podFailurePolicy: { rules: [{ action: 'FailJob', onExitCodes: { operator: 'In', values: [2] } }] },
      template: {
        metadata: { labels: { 'moerl.dev/role': 'trainer' } },
        spec: {
          restartPolicy: 'Never',
          nodeSelector: { 'moerl.dev/pool': 'trainers' },
          containers: [
            {
              name: 'rank',
              image: 'moerl-test/rank:none',
              resources: { limits: { 'nvidia.com/gpu': '8' } },
            },
          ],
        },
      },
    },
  };
}

async function runningPods(namespace: string, job: string, count: number): Promise<V1Pod[]> {
  let pods: V1Pod[] = [];
  await waitFor(`${count} running pods of job ${job}`, 60_000, async () => {
    const list = await core.listNamespacedPod({
      namespace,
      labelSelector: `batch.kubernetes.io/job-name=${job}`,
    });
    pods = list.items;
    const running = pods.filter((pod) => pod.status?.phase === 'Running');
    return running.length === count || `${running.length} of ${pods.length} running`;
  });
  return pods;
}

async function jobCondition(namespace: string, name: string, type: 'Complete' | 'Failed'): Promise<V1Job> {
  let job: V1Job | undefined;
  await waitFor(`job ${name} to be ${type}`, 60_000, async () => {
    job = await batch.readNamespacedJobStatus({ namespace, name });
    const conditions = job.status?.conditions ?? [];
    return (
      conditions.some((c) => c.type === type && c.status === 'True') ||
      `conditions ${JSON.stringify(conditions.map((c) => `${c.type}=${c.status}`))}`
    );
  });
  return job as V1Job;
}

describe('test kube cluster (real control plane, kwok fake nodes)', () => {
  it('serves the pinned Kubernetes version to kubectl', async () => {
    const result = await cluster.kubectl(['version', '-o', 'json']);
    assert.equal(result.code, 0, result.stderr);
    const versions = JSON.parse(result.stdout) as {
      clientVersion: { gitVersion: string };
      serverVersion: { gitVersion: string };
    };
    assert.match(versions.serverVersion.gitVersion, /^v1\.36\.\d+$/);
    assert.equal(versions.clientVersion.gitVersion, versions.serverVersion.gitVersion);
  });

  it('brings fake nodes Ready with the capacity they were given', async () => {
    for (const name of nodes) {
      const node = await core.readNode({ name });
      assert.equal(node.status?.conditions?.find((c) => c.type === 'Ready')?.status, 'True');
      assert.equal(node.status?.allocatable?.['nvidia.com/gpu'], '8');
      assert.match(node.status?.nodeInfo?.kubeletVersion ?? '', /^kwok-/);
    }
    const listed = await cluster.kubectl(['get', 'nodes', '-l', 'moerl.dev/pool=trainers', '-o', 'name']);
    assert.deepEqual(listed.stdout.trim().split('\n').sort(), nodes.map((name) => `node/${name}`).sort());
  });

  it('schedules an Indexed Job onto the fake nodes and completes it when every rank exits 0', async () => {
    const namespace = await cluster.createNamespace('indexed');
    await batch.createNamespacedJob({ namespace, body: indexedJob('ranks', 2) });
    const pods = await runningPods(namespace, 'ranks', 2);

    // One 8-GPU rank per 8-GPU node: the scheduler had to spread them.
    assert.deepEqual(pods.map((pod) => pod.spec?.nodeName).sort(), [...nodes].sort());
    const indexes = pods.map(
      (pod) => pod.metadata?.annotations?.['batch.kubernetes.io/job-completion-index'],
    );
    assert.deepEqual(indexes.sort(), ['0', '1']);
    const before = await batch.readNamespacedJobStatus({ namespace, name: 'ranks' });
    assert.equal(before.status?.active, 2);

    for (const pod of pods) await cluster.setPodExitCode(namespace, pod.metadata?.name as string, 0);
    const job = await jobCondition(namespace, 'ranks', 'Complete');
    assert.equal(job.status?.succeeded, 2);
    assert.equal(job.status?.completedIndexes, '0,1');
  });

  it('fails the Job through its podFailurePolicy when a rank exits 2', async () => {
    const namespace = await cluster.createNamespace('failjob');
    await batch.createNamespacedJob({ namespace, body: indexedJob('ranks', 2) });
    const pods = await runningPods(namespace, 'ranks', 2);
    const failing = pods[0]?.metadata?.name as string;
    await cluster.setPodExitCode(namespace, failing, 2);

    const job = await jobCondition(namespace, 'ranks', 'Failed');
    const failed = job.status?.conditions?.find((c) => c.type === 'Failed');
    assert.equal(failed?.reason, 'PodFailurePolicy');
    assert.match(failed?.message ?? '', /exit code 2/);
    const pod = await core.readNamespacedPod({ namespace, name: failing });
    assert.equal(pod.status?.phase, 'Failed');
    assert.equal(pod.status?.containerStatuses?.[0]?.state?.terminated?.exitCode, 2);
    assert.equal(pod.status?.containerStatuses?.[0]?.state?.running, undefined);
    // The other rank is stopped with the Job; kwok removes it as a kubelet would.
    const other = pods[1]?.metadata?.name as string;
    await waitFor(`pod ${other} to be deleted`, 60_000, async () => {
      const list = await core.listNamespacedPod({ namespace });
      return !list.items.some((p) => p.metadata?.name === other) || 'still there';
    });
  });

  it('keeps a pod without an exit-code annotation Running, and one with exit code 137 Failed', async () => {
    const namespace = await cluster.createNamespace('pods');
    const pod = (name: string): V1Pod => ({
      metadata: { name },
      spec: {
        restartPolicy: 'Never',
        nodeName: nodes[0],
        containers: [{ name: 'main', image: 'moerl-test/none' }],
      },
    });
    await core.createNamespacedPod({ namespace, body: pod('stays') });
    await core.createNamespacedPod({ namespace, body: pod('killed') });
    await waitFor('both pods Running', 60_000, async () => {
      const list = await core.listNamespacedPod({ namespace });
      return list.items.filter((p) => p.status?.phase === 'Running').length === 2 || 'not yet';
    });
    await cluster.setPodExitCode(namespace, 'killed', 137, 'OOMKilled');
    await waitFor('pod killed to fail', 60_000, async () => {
      const killed = await core.readNamespacedPod({ namespace, name: 'killed' });
      const terminated = killed.status?.containerStatuses?.[0]?.state?.terminated;
      return (
        (killed.status?.phase === 'Failed' &&
          terminated?.exitCode === 137 &&
          terminated.reason === 'OOMKilled') ||
        'not yet'
      );
    });
    const stays = await core.readNamespacedPod({ namespace, name: 'stays' });
    assert.equal(stays.status?.phase, 'Running');
    await assert.rejects(
      cluster.setPodExitCode(namespace, 'stays', 256),
      /exit code must be an integer 0\.\.255/,
    );
  });

  it('runs server-side dry-run with validation and without persisting', async () => {
    const namespace = await cluster.createNamespace('dryrun');
    const created = await batch.createNamespacedJob({ namespace, body: indexedJob('dry', 2), dryRun: 'All' });
    assert.equal(created.spec?.completionMode, 'Indexed');
    assert.ok(created.metadata?.uid, 'the dry-run answer is the object as it would be stored');
    await assert.rejects(batch.readNamespacedJob({ namespace, name: 'dry' }), (err) => {
      assert.ok(err instanceof ApiException);
      assert.equal(err.code, 404);
      return true;
    });

    const invalid = indexedJob('invalid', 2);
    (invalid.spec as { completions: number }).completions = -1;
    await assert.rejects(batch.createNamespacedJob({ namespace, body: invalid, dryRun: 'All' }), (err) => {
      assert.ok(err instanceof ApiException);
      assert.equal(err.code, 422);
      assert.match(String(err.body), /completions/);
      return true;
    });
  });
});
