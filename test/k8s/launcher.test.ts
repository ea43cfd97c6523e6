// The KubernetesLauncher against a real control plane (kube-apiserver, controller manager,
// scheduler) with kwok's fake nodes: nothing runs in the pods, and a test ends a rank by giving
// its pod an exit code (kube-cluster.ts). Covered: the Job, Service and NetworkPolicy it creates
// (the policy removed with the Job by the garbage collector), completion,
// exit 2 failing without retries, other failures retried up to backoffLimit, an eviction not
// counted, adoption by a second launcher (another worker process), kill() leaving nothing
// behind, a pod that cannot be scheduled, the train worker's Role being enough, API refusals,
// and the watch surviving lost API server connections.
import assert from 'node:assert/strict';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { readFileSync } from 'node:fs';
import {
  BatchV1Api,
  CoreV1Api,
  KubeConfig,
  NetworkingV1Api,
  RbacAuthorizationV1Api,
  type V1Pod,
  type V1Role,
} from '@kubernetes/client-node';
import { ApplicationFailure } from '@temporalio/common';
import { parse } from 'yaml';
import { KubernetesLauncher } from '../../activities/launch/kubernetes.js';
import type { TrainJob, TrainJobSpec } from '../../activities/launch/types.js';
import { emptyTrainJob } from '../support/train-job-spec.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';

let cluster: KubeCluster;
let core: CoreV1Api;
let batch: BatchV1Api;
let rbac: RbacAuthorizationV1Api;
let networking: NetworkingV1Api;

before(async () => {
  const started = Date.now();
  cluster = await startKubeCluster({ kwok: true });
  console.log(`# kube cluster started in ${Date.now() - started} ms`);
  core = cluster.kubeConfig().makeApiClient(CoreV1Api);
  batch = cluster.kubeConfig().makeApiClient(BatchV1Api);
  rbac = cluster.kubeConfig().makeApiClient(RbacAuthorizationV1Api);
  networking = cluster.kubeConfig().makeApiClient(NetworkingV1Api);
  await cluster.addFakeNodes(2);
});
after(async () => {
  await cluster?.stop();
});

type Settings = Parameters<typeof kubernetesLauncherSchema.parse>[0];

function launcherIn(
  namespace: string,
  settings: Partial<Settings> = {},
  kubeConfig = cluster.kubeConfig(),
  signal?: AbortSignal,
) {
  const parsed = kubernetesLauncherSchema.parse({
    kind: 'kubernetes',
    namespace,
    image: 'moerl-test/rank:none',
    ...settings,
  });
  return new KubernetesLauncher(kubeConfig, parsed, { signal });
}

let jobs = 0;
function trainSpec(worldSize = 2): TrainJobSpec {
  jobs++;
  return emptyTrainJob(`launcher-u${jobs}-0a1b2c3d`, worldSize, {
    campaignId: 'Launcher Test',
    iteration: jobs,
    attempt: 1,
  });
}

const selector = (name: string) => `moerl.dev/job=${name}`;

async function pods(namespace: string, name: string): Promise<V1Pod[]> {
  return (await core.listNamespacedPod({ namespace, labelSelector: selector(name) })).items;
}

/** Waits until `count` pods of the job run, and returns them. */
async function runningPods(namespace: string, name: string, count: number): Promise<V1Pod[]> {
  let running: V1Pod[] = [];
  await waitFor(`${count} running pods of job ${name}`, 60_000, async () => {
    running = (await pods(namespace, name)).filter(
      (p) => p.status?.phase === 'Running' && !p.metadata?.deletionTimestamp,
    );
    return running.length === count || `${running.length} running`;
  });
  return running;
}

const podName = (pod: V1Pod | undefined) => pod?.metadata?.name as string;
const rankOf = (pod: V1Pod) => pod.metadata?.annotations?.['batch.kubernetes.io/job-completion-index'];

/** A client configuration that authenticates as a ServiceAccount, as a worker pod would. */
async function serviceAccountConfig(namespace: string, name: string): Promise<KubeConfig> {
  const token = await core.createNamespacedServiceAccountToken({
    namespace,
    name,
    body: { spec: { audiences: [], expirationSeconds: 600 } },
  });
  const config = cluster.kubeConfig();
  config.loadFromOptions({
    clusters: config.clusters,
    users: [{ name, token: token.status!.token }],
    contexts: [{ name, cluster: config.getCurrentCluster()!.name, user: name }],
    currentContext: name,
  });
  return config;
}

/** Waits for a running pod of the job other than `replaced`, and returns it. */
async function replacementOf(namespace: string, name: string, replaced: V1Pod | undefined): Promise<V1Pod> {
  let replacement: V1Pod | undefined;
  await waitFor(`a pod of job ${name} replacing ${podName(replaced)}`, 60_000, async () => {
    replacement = (await pods(namespace, name)).find(
      (p) => p.status?.phase === 'Running' && podName(p) !== podName(replaced),
    );
    return replacement !== undefined || 'not replaced yet';
  });
  return replacement!;
}

/** What a kubelet reports for a pod whose rank container it stopped: Failed, with the exit code. */
async function stopLikeKubelet(namespace: string, name: string, exitCode: number): Promise<void> {
  // Others write the pod's status too (kwok, the eviction's conditions): on a conflict, read it
  // again and retry, as a kubelet does.
  for (let attempt = 1; ; attempt++) {
    try {
      return await replacePodStatusStopped(namespace, name, exitCode);
    } catch (err) {
      if ((err as { code?: number }).code !== 409 || attempt >= 5) throw err;
    }
  }
}

async function replacePodStatusStopped(namespace: string, name: string, exitCode: number): Promise<void> {
  const pod = await core.readNamespacedPod({ namespace, name });
  const finishedAt = new Date();
  pod.status = {
    ...pod.status,
    phase: 'Failed',
    containerStatuses: (pod.status?.containerStatuses ?? []).map((c) => ({
      ...c,
      ready: false,
      started: false,
      state: {
        terminated: { exitCode, reason: 'Error', startedAt: c.state?.running?.startedAt, finishedAt },
      },
    })),
  };
  await core.replaceNamespacedPodStatus({ namespace, name, body: pod });
}

async function exitAll(namespace: string, running: V1Pod[], code: number): Promise<void> {
  for (const pod of running) await cluster.setPodExitCode(namespace, podName(pod), code);
}

/** Resolves with the job's final status, failing the test if it takes longer than `ms`. */
async function finished(job: TrainJob, ms = 90_000) {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`job ${job.name} still ${JSON.stringify(job.status())} after ${ms} ms`)),
      ms,
    );
  });
  try {
    return await Promise.race([job.wait(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Nothing of the job is left: no Job, no pod, no Service. */
async function assertNothingLeft(namespace: string, name: string): Promise<void> {
  const [jobList, podList, services] = await Promise.all([
    batch.listNamespacedJob({ namespace, labelSelector: selector(name) }),
    core.listNamespacedPod({ namespace, labelSelector: selector(name) }),
    core.listNamespacedService({ namespace, labelSelector: selector(name) }),
  ]);
  assert.deepEqual(
    [...jobList.items, ...podList.items, ...services.items].map((o) => `${o.kind ?? ''} ${o.metadata?.name}`),
    [],
  );
}

describe('KubernetesLauncher (real control plane, kwok fake nodes)', () => {
  it('creates the Indexed Job and headless Service, and resolves wait() when every rank exits 0', async () => {
    const namespace = await cluster.createNamespace('launch');
    const spec = trainSpec(2);
    const job = await launcherIn(namespace, { backoffLimit: 2, coordinatorPort: 29400 }).launch(spec);
    try {
      assert.equal(job.adopted, false);
      const stored = await batch.readNamespacedJob({ namespace, name: spec.name });
      assert.equal(stored.spec?.completionMode, 'Indexed');
      assert.equal(stored.spec?.completions, 2);
      assert.equal(stored.spec?.parallelism, 2);
      assert.equal(stored.spec?.backoffLimit, 2);
      assert.deepEqual(
        stored.spec?.podFailurePolicy?.rules.map((r) => r.action),
        ['Ignore', 'FailJob', 'Ignore', 'Ignore'],
      );
      assert.equal(stored.metadata?.labels?.['moerl.dev/campaign']?.startsWith('Launcher-Test-'), true);
      assert.equal(stored.metadata?.labels?.['app.kubernetes.io/managed-by'], 'moerl');
      const service = await core.readNamespacedService({ namespace, name: spec.name });
      assert.equal(service.spec?.clusterIP, 'None');
      assert.equal(service.spec?.publishNotReadyAddresses, true);
      assert.equal(service.spec?.ports?.[0]?.port, 29400);
      assert.equal(service.metadata?.ownerReferences?.[0]?.uid, stored.metadata?.uid);
      // The job token: in a Secret owned by the Job (read here as the cluster admin; the worker
      // cannot), which the pods reference; never a value in the Job itself.
      const secret = await core.readNamespacedSecret({ namespace, name: `${spec.name}-token` });
      assert.equal(secret.metadata?.ownerReferences?.[0]?.uid, stored.metadata?.uid);
      const token = Buffer.from(secret.data?.token ?? '', 'base64').toString();
      assert.match(token, /^[A-Za-z0-9_-]{43}$/);
      assert.ok(!JSON.stringify(stored).includes(token), 'the token is not in the Job');
      // The job's own NetworkPolicy, owned by the Job: its pods, and no other job's, reach them.
      const policy = await networking.readNamespacedNetworkPolicy({ namespace, name: `${spec.name}-ranks` });
      assert.equal(policy.metadata?.ownerReferences?.[0]?.uid, stored.metadata?.uid);
      const ranks = { matchLabels: { 'moerl.dev/job': spec.name, 'app.kubernetes.io/component': 'trainer' } };
      // The client's classes as plain objects (`_from` is its name for `from`).
      assert.deepEqual(JSON.parse(JSON.stringify(policy.spec)), {
        podSelector: ranks,
        policyTypes: ['Ingress', 'Egress'],
        ingress: [{ _from: [{ podSelector: ranks }] }],
        egress: [{ to: [{ podSelector: ranks }] }],
      });

      const running = await runningPods(namespace, spec.name, 2);
      for (const pod of running) {
        assert.equal(pod.spec?.hostname, `${spec.name}-${rankOf(pod)}`);
        assert.equal(pod.spec?.subdomain, spec.name);
        const env = Object.fromEntries((pod.spec?.containers[0]?.env ?? []).map((e) => [e.name, e.value]));
        assert.equal(env.MOERL_COORDINATOR, `${spec.name}-0.${spec.name}.${namespace}.svc:29400`);
      }
      await waitFor('the launcher to see both ranks running', 30_000, async () => {
        const states = job.status().ranks.map((r) => r.state);
        return states.join() === 'running,running' || states.join();
      });

      await exitAll(namespace, running, 0);
      const status = await finished(job);
      assert.equal(status.state, 'succeeded');
      assert.deepEqual(
        status.ranks.map((r) => [r.state, r.exitCode]),
        [
          ['succeeded', 0],
          ['succeeded', 0],
        ],
      );
    } finally {
      await job.cleanUp();
    }
    await waitFor('the job to be removed', 60_000, async () => {
      await assertNothingLeft(namespace, spec.name);
      return true;
    });
    // The garbage collector removes the policy once the Job is gone.
    await waitFor(`the garbage collector to remove network policy ${spec.name}-ranks`, 60_000, async () => {
      const left = await networking.listNamespacedNetworkPolicy({
        namespace,
        labelSelector: selector(spec.name),
      });
      return left.items.length === 0 || left.items.map((p) => p.metadata?.name).join();
    });
  });

  it('fails the Job at once, without retries, when a rank exits 2 (permanent)', async () => {
    const namespace = await cluster.createNamespace('exit2');
    const spec = trainSpec(2);
    const job = await launcherIn(namespace, { backoffLimit: 3 }).launch(spec);
    try {
      const running = await runningPods(namespace, spec.name, 2);
      const bad = running.find((p) => rankOf(p) === '1')!;
      await cluster.setPodExitCode(namespace, podName(bad), 2);
      const status = await finished(job);
      assert.equal(status.state, 'failed');
      assert.equal(status.failure?.permanent, true);
      assert.equal(status.failure?.rank, 1);
      assert.equal(status.failure?.exitCode, 2);
      assert.match(
        status.failure?.logTail ?? '',
        new RegExp(`rank 1 \\(pod ${podName(bad)}\\) exited with code 2`),
      );
      const rank1 = (await pods(namespace, spec.name)).filter((p) => rankOf(p) === '1');
      assert.deepEqual(rank1.map(podName), [podName(bad)], 'rank 1 was not retried');
    } finally {
      await job.cleanUp();
    }
  });

  it('retries a rank that fails with another exit code up to backoffLimit, then fails retryably', async () => {
    const namespace = await cluster.createNamespace('retry');
    const spec = trainSpec(1);
    const job = await launcherIn(namespace, { backoffLimit: 1 }).launch(spec);
    try {
      const [first] = await runningPods(namespace, spec.name, 1);
      await cluster.setPodExitCode(namespace, podName(first), 1);
      const second = await replacementOf(namespace, spec.name, first);
      assert.equal(job.status().state, 'running');
      await cluster.setPodExitCode(namespace, podName(second), 1, 'OOMKilled');
      const status = await finished(job);
      assert.equal(status.state, 'failed');
      assert.equal(status.failure?.permanent, false);
      assert.equal(status.failure?.rank, 0);
      assert.match(status.failure?.logTail ?? '', /BackoffLimitExceeded/);
      assert.equal((await pods(namespace, spec.name)).length, 2, 'one try and one retry');
    } finally {
      await job.cleanUp();
    }
  });

  it('does not count an evicted pod against backoffLimit: a replacement runs and completes', async () => {
    const namespace = await cluster.createNamespace('evict');
    const spec = trainSpec(1);
    const job = await launcherIn(namespace, { backoffLimit: 0 }).launch(spec);
    try {
      const [first] = await runningPods(namespace, spec.name, 1);
      await core.createNamespacedPodEviction({
        namespace,
        name: podName(first),
        body: { apiVersion: 'policy/v1', kind: 'Eviction', metadata: { name: podName(first), namespace } },
      });
      // The kubelet stops an evicted pod's container (SIGTERM: 143) and reports it Failed before
      // the pod goes; kwok's stages leave a deleted pod Running, so the test does the kubelet's part.
      await stopLikeKubelet(namespace, podName(first), 143);
      const replacement = await replacementOf(namespace, spec.name, first);
      assert.equal(job.status().state, 'running');
      const stored = await batch.readNamespacedJob({ namespace, name: spec.name });
      assert.equal(
        stored.status?.conditions?.some((c) => c.type === 'Failed' && c.status === 'True') ?? false,
        false,
      );
      await cluster.setPodExitCode(namespace, podName(replacement), 0);
      assert.equal((await finished(job)).state, 'succeeded');
    } finally {
      await job.cleanUp();
    }
  });

  it('adopts the Job from a launcher with its own client (another worker process), running or succeeded', async () => {
    const namespace = await cluster.createNamespace('adopt');
    const spec = trainSpec(2);
    const shutdown = new AbortController();
    const first = await launcherIn(namespace, {}, cluster.kubeConfig(), shutdown.signal).launch(spec);
    let second: TrainJob | undefined;
    try {
      await runningPods(namespace, spec.name, 2);
      const uid = (await batch.readNamespacedJob({ namespace, name: spec.name })).metadata?.uid;
      // The first worker shuts down: it stops following, and its Job keeps running.
      shutdown.abort();
      // The Service and the NetworkPolicy went missing (deleted by hand): adoption puts them back.
      await core.deleteNamespacedService({ namespace, name: spec.name });
      await networking.deleteNamespacedNetworkPolicy({ namespace, name: `${spec.name}-ranks` });
      const fresh = new KubeConfig();
      fresh.loadFromFile(cluster.kubeconfig);
      second = await launcherIn(namespace, {}, fresh).launch(spec);
      assert.equal(second.adopted, true);
      const jobList = await batch.listNamespacedJob({ namespace, labelSelector: selector(spec.name) });
      assert.deepEqual(
        jobList.items.map((j) => j.metadata?.uid),
        [uid],
      );
      const service = await core.readNamespacedService({ namespace, name: spec.name });
      assert.equal(service.metadata?.ownerReferences?.[0]?.uid, uid);
      const policy = await networking.readNamespacedNetworkPolicy({ namespace, name: `${spec.name}-ranks` });
      assert.equal(policy.metadata?.ownerReferences?.[0]?.uid, uid);

      await exitAll(namespace, await runningPods(namespace, spec.name, 2), 0);
      assert.equal((await finished(second)).state, 'succeeded');
      // A retry after the job succeeded (its answer was lost) adopts the finished Job.
      const third = await launcherIn(namespace).launch(spec);
      assert.equal(third.adopted, true);
      assert.equal((await finished(third, 10_000)).state, 'succeeded');
    } finally {
      await second?.cleanUp();
      await first.cleanUp();
    }
  });

  it('replaces a failed Job of the same name instead of adopting it', async () => {
    const namespace = await cluster.createNamespace('relaunch');
    const spec = trainSpec(1);
    const launcher = launcherIn(namespace, { backoffLimit: 0 });
    const failed = await launcher.launch(spec);
    const [pod] = await runningPods(namespace, spec.name, 1);
    await cluster.setPodExitCode(namespace, podName(pod), 1);
    assert.equal((await finished(failed)).state, 'failed');
    const oldUid = (await batch.readNamespacedJob({ namespace, name: spec.name })).metadata?.uid;

    const again = await launcher.launch(spec);
    try {
      assert.equal(again.adopted, false);
      const job = await batch.readNamespacedJob({ namespace, name: spec.name });
      assert.notEqual(job.metadata?.uid, oldUid);
      const [fresh] = await runningPods(namespace, spec.name, 1);
      await cluster.setPodExitCode(namespace, podName(fresh), 0);
      assert.equal((await finished(again)).state, 'succeeded');
    } finally {
      await again.cleanUp();
    }
  });

  it('kill() stops every rank and leaves no Job, pod or Service behind', async () => {
    const namespace = await cluster.createNamespace('kill');
    const spec = trainSpec(2);
    const job = await launcherIn(namespace).launch(spec);
    await runningPods(namespace, spec.name, 2);
    await job.kill();
    await assertNothingLeft(namespace, spec.name);
    const status = await finished(job, 1000);
    assert.equal(status.state, 'failed');
    await job.cleanUp();
  });

  it('fails a job whose pod cannot be scheduled, quoting the scheduler, and removes it', async () => {
    const namespace = await cluster.createNamespace('unschedulable');
    const spec = trainSpec(2);
    const job = await launcherIn(namespace, {
      nodeSelector: { 'moerl.dev/pool': 'nowhere' },
      unschedulableTimeoutSeconds: 2,
    }).launch(spec);
    try {
      const status = await finished(job, 60_000);
      assert.equal(status.state, 'failed');
      assert.equal(status.failure?.permanent, false);
      assert.match(
        status.failure?.logTail ?? '',
        /^rank [01] \(pod launcher-u\d+-0a1b2c3d-[01]-\w+\) could not be scheduled for \d+ s \(launcher.unschedulableTimeoutSeconds\): 0\/2 nodes are available: .*node affinity\/selector/,
      );
      await assertNothingLeft(namespace, spec.name);
    } finally {
      await job.cleanUp();
    }
  });

  it("needs no more than the train worker's Role (k8s/base/rbac/train/role.yaml)", async () => {
    const namespace = await cluster.createNamespace('rbac');
    const role = parse(
      readFileSync(new URL('../../../k8s/base/rbac/train/role.yaml', import.meta.url), 'utf8'),
    ) as V1Role;
    await rbac.createNamespacedRole({ namespace, body: role });
    await core.createNamespacedServiceAccount({ namespace, body: { metadata: { name: 'train' } } });
    await rbac.createNamespacedRoleBinding({
      namespace,
      body: {
        metadata: { name: 'train' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: role.metadata!.name! },
        subjects: [{ kind: 'ServiceAccount', name: 'train', namespace }],
      },
    });
    const spec = trainSpec(2);
    const job = await launcherIn(namespace, {}, await serviceAccountConfig(namespace, 'train')).launch(spec);
    try {
      await exitAll(namespace, await runningPods(namespace, spec.name, 2), 0);
      assert.equal((await finished(job)).state, 'succeeded');
    } finally {
      await job.cleanUp();
    }
    await waitFor('the job to be removed', 60_000, async () => {
      await assertNothingLeft(namespace, spec.name);
      return true;
    });
  });

  it('refuses without retries, naming verb and resource, when the API server says no', async () => {
    const namespace = await cluster.createNamespace('refused');
    // A ServiceAccount without any Role: authenticated, allowed nothing.
    await core.createNamespacedServiceAccount({ namespace, body: { metadata: { name: 'nobody' } } });
    const stranger = cluster.kubeConfig();
    stranger.loadFromOptions({
      clusters: stranger.clusters,
      users: [{ name: 'stranger', token: 'not-a-token' }],
      contexts: [{ name: 'stranger', cluster: stranger.getCurrentCluster()!.name, user: 'stranger' }],
      currentContext: 'stranger',
    });
    const spec = trainSpec(1);
    const refusals: [KubeConfig, string, RegExp][] = [
      [
        await serviceAccountConfig(namespace, 'nobody'),
        namespace,
        new RegExp(`cannot get jobs/${spec.name} in namespace ${namespace}: forbidden \\(403\\)`),
      ],
      [stranger, namespace, /credentials \(401\)/],
      [cluster.kubeConfig(), 'no-such-namespace', /namespace no-such-namespace does not exist/],
    ];
    for (const [kubeConfig, ns, message] of refusals)
      await assert.rejects(launcherIn(ns, {}, kubeConfig).launch(spec), (err) => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.nonRetryable, true);
        assert.match(err.message, message);
        return true;
      });
  });

  it('keeps following the job across lost API server connections', async () => {
    const namespace = await cluster.createNamespace('reconnect');
    const proxy = await startProxy(new URL(cluster.server));
    try {
      const kubeConfig = cluster.kubeConfig();
      const context = kubeConfig.getCurrentCluster()!;
      kubeConfig.loadFromOptions({
        clusters: [{ ...context, server: `https://127.0.0.1:${proxy.port}` }],
        users: kubeConfig.users,
        contexts: kubeConfig.contexts,
        currentContext: kubeConfig.currentContext,
      });
      const spec = trainSpec(2);
      const job = await launcherIn(namespace, {}, kubeConfig).launch(spec);
      try {
        const running = await runningPods(namespace, spec.name, 2);
        await waitFor('the launcher to see both ranks running', 30_000, async () => {
          const states = job.status().ranks.map((r) => r.state);
          return states.join() === 'running,running' || states.join();
        });
        // The API server goes away (every connection cut, new ones refused); the job finishes
        // meanwhile; then the API server is back.
        await proxy.down();
        await exitAll(namespace, running, 0);
        await new Promise((done) => setTimeout(done, 3000));
        assert.equal(job.status().state, 'running');
        await proxy.up();
        assert.equal((await finished(job, 60_000)).state, 'succeeded');
      } finally {
        await job.cleanUp();
      }
    } finally {
      await proxy.stop();
    }
  });
});

/** A TCP proxy on 127.0.0.1 to `target` that can be taken down (connections cut) and up again. */
async function startProxy(target: URL) {
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  let port = 0;
  const listen = () =>
    new Promise<void>((resolve, reject) => {
      server = createServer((client) => {
        const upstream = connect(Number(target.port), target.hostname);
        for (const s of [client, upstream]) {
          sockets.add(s);
          s.on('close', () => sockets.delete(s));
          s.on('error', () => undefined);
        }
        client.pipe(upstream).pipe(client);
        client.on('close', () => upstream.destroy());
        upstream.on('close', () => client.destroy());
      });
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => {
        const address = server!.address();
        port = typeof address === 'object' && address ? address.port : 0;
        resolve();
      });
    });
  const down = () =>
    new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      if (server) server.close(() => resolve());
      else resolve();
      server = undefined;
    });
  await listen();
  return { port, down, up: listen, stop: down };
}
