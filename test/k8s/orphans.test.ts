// Trainer Jobs that outlive their activity, against a real control plane with kwok's fake nodes:
// a launch cancelled while it waits for a Job of the same name to be deleted gives up without
// creating one; the control worker's sweep deletes the Jobs and Services of ended campaigns
// and nothing else; a rank stopped by SIGTERM (exit 143, a preemption) is not counted against
// backoffLimit; every Job has a deadline.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { BatchV1Api, CoreV1Api, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { KubernetesLauncher } from '../../activities/launch/kubernetes.js';
import { sweepEndedCampaigns } from '../../activities/launch/kubernetes/sweep.js';
import type { TrainJobSpec } from '../../activities/launch/types.js';
import { emptyTrainJob } from '../support/train-job-spec.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';

let cluster: KubeCluster;
let core: CoreV1Api;
let batch: BatchV1Api;

before(async () => {
  cluster = await startKubeCluster({ kwok: true });
  core = cluster.kubeConfig().makeApiClient(CoreV1Api);
  batch = cluster.kubeConfig().makeApiClient(BatchV1Api);
  await cluster.addFakeNodes(1);
});
after(async () => {
  await cluster?.stop();
});

function launcherIn(namespace: string, settings: Record<string, unknown> = {}, signal?: AbortSignal) {
  const parsed = kubernetesLauncherSchema.parse({
    kind: 'kubernetes',
    namespace,
    image: 'moerl-test/rank:none',
    ...settings,
  });
  return new KubernetesLauncher(cluster.kubeConfig(), parsed, { signal });
}

let jobs = 0;
function trainSpec(campaignId: string, worldSize = 1): TrainJobSpec {
  jobs++;
  return emptyTrainJob(`orphan-u${jobs}-0a1b2c3d`, worldSize, { campaignId, iteration: jobs, attempt: 1 });
}

const selector = (name: string) => `moerl.dev/job=${name}`;

async function names(namespace: string, name: string): Promise<string[]> {
  const [j, s] = await Promise.all([
    batch.listNamespacedJob({ namespace, labelSelector: selector(name) }),
    core.listNamespacedService({ namespace, labelSelector: selector(name) }),
  ]);
  return [
    ...j.items.map((o) => `job/${o.metadata?.name}`),
    ...s.items.map((o) => `service/${o.metadata?.name}`),
  ];
}

async function runningPod(namespace: string, name: string, not?: string): Promise<string> {
  let pod = '';
  await waitFor(`a running pod of ${name}`, 60_000, async () => {
    const list = await core.listNamespacedPod({ namespace, labelSelector: selector(name) });
    const p = list.items.find(
      (x) => x.status?.phase === 'Running' && !x.metadata?.deletionTimestamp && x.metadata?.name !== not,
    );
    pod = p?.metadata?.name ?? '';
    return pod !== '' || 'none yet';
  });
  return pod;
}

describe('trainer Jobs outliving their activity (real control plane, kwok fake nodes)', () => {
  it(
    'a launch cancelled while the Job of its name is being deleted gives up, creating nothing',
    { timeout: 120_000 },
    async () => {
      const namespace = await cluster.createNamespace('orphan');
      const spec = trainSpec('Cancelled Campaign');
      // The first worker stops following its job (as one shutting down does).
      const firstWorker = new AbortController();
      await launcherIn(namespace, {}, firstWorker.signal).launch(spec);
      firstWorker.abort();
      const uid = (await batch.readNamespacedJob({ namespace, name: spec.name })).metadata!.uid!;
      // A finalizer holds the Job while it is deleted, as a slow garbage collector or an API
      // outage would.
      const finalizers = (value: string[] | null) =>
        batch.patchNamespacedJob(
          { namespace, name: spec.name, body: { metadata: { finalizers: value } } },
          setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
        );
      await finalizers(['moerl.dev/test-hold']);
      await batch.deleteNamespacedJob({ namespace, name: spec.name });
      const cancel = new AbortController();
      const launching = launcherIn(namespace).launch(spec, cancel.signal);
      setTimeout(() => cancel.abort(new Error('cancelled')), 1000);
      const started = Date.now();
      await assert.rejects(launching, (err: Error) => {
        assert.match(String(err), /cancelled|aborted/i);
        return true;
      });
      assert.ok(Date.now() - started < 10_000, `gave up ${Date.now() - started} ms after the cancel`);
      const job = await batch.readNamespacedJob({ namespace, name: spec.name });
      assert.equal(job.metadata?.uid, uid, 'no new Job was created');
      await finalizers(null);
    },
  );

  it(
    'the sweep deletes the Jobs and Services of ended campaigns only, by their owner labels',
    { timeout: 120_000 },
    async () => {
      const namespace = await cluster.createNamespace('sweep');
      const launcher = launcherIn(namespace);
      const ended = trainSpec('GRPO math/v2 (ended)');
      const running = trainSpec('GRPO math/v2 (running)');
      const endedJob = await launcher.launch(ended);
      const runningJob = await launcher.launch(running);
      // A Service left without its Job (the Job deleted before it was created) of the ended campaign.
      const stray = trainSpec('GRPO math/v2 (ended)');
      await core.createNamespacedService({
        namespace,
        body: {
          metadata: {
            name: stray.name,
            labels: { 'app.kubernetes.io/managed-by': 'moerl', 'moerl.dev/job': stray.name },
            annotations: { 'moerl.dev/campaign-id': 'GRPO math/v2 (ended)' },
          },
          spec: { clusterIP: 'None', ports: [{ port: 29500 }] },
        },
      });
      const asked: string[] = [];
      const removed = await sweepEndedCampaigns(cluster.kubeConfig(), namespace, (id) => {
        asked.push(id);
        return Promise.resolve(id.endsWith('(ended)'));
      });
      assert.deepEqual(removed.sort(), [`job/${ended.name}`, `service/${stray.name}`]);
      assert.deepEqual(asked.sort(), ['GRPO math/v2 (ended)', 'GRPO math/v2 (running)'], 'once per campaign');
      await waitFor('the ended campaign’s objects gone', 60_000, async () => {
        const left = [...(await names(namespace, ended.name)), ...(await names(namespace, stray.name))];
        return left.length === 0 || left.join(', ');
      });
      assert.deepEqual((await names(namespace, running.name)).sort(), [
        `job/${running.name}`,
        `service/${running.name}`,
      ]);
      assert.equal((await endedJob.wait()).state, 'failed');
      await runningJob.kill();
    },
  );

  it(
    'a rank stopped by SIGTERM (exit 143) is replaced without using up backoffLimit; the Job has a deadline',
    { timeout: 120_000 },
    async () => {
      const namespace = await cluster.createNamespace('preempt');
      const spec = { ...trainSpec('Preempted Campaign'), maxRunSeconds: 3600 };
      const job = await launcherIn(namespace, { backoffLimit: 0 }).launch(spec);
      try {
        const pod = await runningPod(namespace, spec.name);
        await cluster.setPodExitCode(namespace, pod, 143);
        const replacement = await runningPod(namespace, spec.name, pod);
        assert.notEqual(replacement, pod);
        assert.equal(job.status().state, 'running');
        const now = await batch.readNamespacedJob({ namespace, name: spec.name });
        assert.ok(!now.status?.conditions?.some((c) => c.type === 'Failed' && c.status === 'True'));
        assert.equal(now.spec?.activeDeadlineSeconds, 3600, 'the job is bounded');
      } finally {
        await job.kill();
      }
    },
  );
});
