// Many campaigns on one cluster: trainer Jobs under a Kueue LocalQueue (launcher.queueName), on
// the real control plane with kwok's fake nodes and Kueue's real controller manager
// (support/kueue.ts). Covered: two update activities whose Jobs together exceed the
// ClusterQueue's quota run one after the other, neither fails, the waiting one heartbeats
// `queued` well inside its heartbeat timeout and reports its queue wait apart from its run
// time; a queued Job adopted by another launcher keeps its wait; a Job that Kueue suspends
// again (its Workload deactivated, as a preemption does) is queued again, not failed, and
// completes once readmitted. Ranks do nothing here: the test stages rank 0's manifest and ends
// the pods with exit codes (kube-cluster.ts).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { BatchV1Api, CoreV1Api, KubeConfig, type V1Job, type V1Pod } from '@kubernetes/client-node';
import { MockActivityEnvironment } from '@temporalio/testing';
import type { ActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { KubernetesLauncher } from '../../activities/launch/kubernetes.js';
import type { JobStatus, TrainJob, TrainJobSpec } from '../../activities/launch/types.js';
import { FsStore } from '../../activities/store/index.js';
import type { CheckpointRef, UpdateInput, UpdateOutput } from '../../activities/types.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import { testSpec } from '../support/campaign-harness.js';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';
import { createQueue, kubectlOut, startKueue, type Kueue } from '../support/kueue.js';

let cluster: KubeCluster;
let kueue: Kueue;
let core: CoreV1Api;
let batch: BatchV1Api;
let namespace: string;
const localQueue = 'trainers';
const heartbeatTimeoutMs = 2_000;

before(async () => {
  const started = Date.now();
  cluster = await startKubeCluster({ kwok: true });
  core = cluster.kubeConfig().makeApiClient(CoreV1Api);
  batch = cluster.kubeConfig().makeApiClient(BatchV1Api);
  await cluster.addFakeNodes(1);
  kueue = await startKueue(cluster);
  console.log(`# kube cluster and Kueue started in ${Date.now() - started} ms`);
  namespace = await cluster.createNamespace('kueue');
  // Room for one trainer Job at a time: 2 ranks of 2 cpu and 1Gi each.
  await createQueue(cluster, {
    clusterQueue: 'moerl-trainers',
    localQueue,
    namespace,
    cpu: '4',
    memory: '4Gi',
  });
});
after(async () => {
  await kueue?.stop();
  await cluster?.stop();
});

const launcherSettings = (storeRoot: string) =>
  kubernetesLauncherSchema.parse({
    kind: 'kubernetes',
    namespace,
    image: 'moerl-test/rank:none',
    queueName: localQueue,
    cpu: '2',
    memory: '1Gi',
    storeVolume: { hostPath: storeRoot },
  });

const podName = (pod: V1Pod) => pod.metadata!.name!;
const jobDone = (job: V1Job) =>
  job.status?.conditions?.some((c) => (c.type === 'Complete' || c.type === 'Failed') && c.status === 'True');

async function jobPods(name: string): Promise<V1Pod[]> {
  return (await core.listNamespacedPod({ namespace, labelSelector: `moerl.dev/job=${name}` })).items;
}

async function runningPods(name: string, count: number): Promise<V1Pod[]> {
  let running: V1Pod[] = [];
  await waitFor(`${count} running pods of job ${name}`, 60_000, async () => {
    running = (await jobPods(name)).filter(
      (p) => p.status?.phase === 'Running' && !p.metadata?.deletionTimestamp,
    );
    return running.length === count || `${running.length} running`;
  });
  return running;
}

async function completePods(name: string, count: number): Promise<void> {
  for (const pod of await runningPods(name, count)) await cluster.setPodExitCode(namespace, podName(pod), 0);
}

/** A valid manifest as rank 0 stages it (the update activity reads it once the job succeeded). */
function rankZeroManifest(): string {
  return JSON.stringify({
    format: 'moerl-checkpoint',
    version: 1,
    world_size: 2,
    files: [{ name: 'dense.safetensors', bytes: 1, sha256: 'a'.repeat(64) }],
  });
}

function updateInput(campaignId: string, spec: ReturnType<typeof testSpec>): UpdateInput {
  const ref = (iteration: number): CheckpointRef => ({
    campaignId,
    iteration,
    key: keys.checkpointKey(campaignId, iteration),
    manifestSha256: 'b'.repeat(64),
    meanReward: null,
  });
  return {
    campaignId,
    iteration: 1,
    spec,
    policy: ref(0),
    reference: ref(0),
    chunksPerShard: [1, 1],
    hyperparameters: spec.hyperparameters,
  };
}

interface Beat {
  at: number;
  state: string;
  queueWaitSeconds?: number;
}

describe('trainer Jobs under a Kueue queue (real Kueue, kwok fake nodes)', () => {
  it(
    'two update activities whose Jobs exceed the quota together run one after the other; neither fails, and the queue wait is reported apart from the run',
    { timeout: 120_000 },
    async () => {
      const root = mkdtempSync(join(tmpdir(), 'moerl-kueue-store-'));
      const store = new FsStore(root);
      const kubeConfig = cluster.kubeConfig();
      const deps = {
        openStore: () => store,
        launcherFor: (l: ReturnType<typeof launcherSettings>) => new KubernetesLauncher(kubeConfig, l),
        shutdown: new AbortController().signal,
      } as unknown as ActivityDeps;
      const activities = createActivities(deps);
      const campaigns = ['kueue-a', 'kueue-b'];
      const beats = new Map<string, Beat[]>(campaigns.map((c) => [c, []]));
      const spec = testSpec({
        launcher: launcherSettings(root),
        store: { kind: 'fs', path: root },
      });
      const holdMs = 5_000;
      const admitted: { campaign: string; at: number; doneAt?: number }[] = [];
      let concurrent = 0;
      const rankErrors: unknown[] = [];
      let stop = false;

      // The ranks' part, for whichever Job Kueue admits: stage rank 0's manifest, run a while, exit 0.
      const runRanks = async (name: string, campaign: string) => {
        await runningPods(name, 2);
        const entry: (typeof admitted)[number] = { campaign, at: Date.now() };
        admitted.push(entry);
        await store.put(`${keys.jobPrefix(campaign, name)}/out/${keys.manifestName}`, rankZeroManifest());
        await new Promise((done) => setTimeout(done, holdMs));
        await completePods(name, 2);
        entry.doneAt = Date.now();
      };
      // Meanwhile: how many Jobs are admitted (unsuspended, unfinished) at once.
      const ranks = (async () => {
        const handled = new Map<string, Promise<void>>();
        while (!stop) {
          const jobs = (await batch.listNamespacedJob({ namespace })).items;
          const active = jobs.filter((j) => j.spec?.suspend !== true && !jobDone(j));
          concurrent = Math.max(concurrent, active.length);
          for (const job of active) {
            const name = job.metadata!.name!;
            if (!handled.has(name))
              handled.set(
                name,
                runRanks(name, job.metadata!.labels!['moerl.dev/campaign']!).catch((err: unknown) => {
                  rankErrors.push(err);
                }),
              );
          }
          await new Promise((done) => setTimeout(done, 200));
        }
        await Promise.all(handled.values());
      })();

      try {
        const outputs = await Promise.all(
          campaigns.map((campaignId) => {
            const env = new MockActivityEnvironment({
              activityId: `update-${campaignId}`,
              heartbeatTimeoutMs,
              workflowExecution: { workflowId: campaignId, runId: `run-${campaignId}` },
            });
            env.on('heartbeat', (d: Beat) => beats.get(campaignId)!.push({ ...d, at: Date.now() }));
            return env.run(activities.updatePolicy, updateInput(campaignId, spec)) as Promise<UpdateOutput>;
          }),
        );
        stop = true;
        await ranks;

        assert.deepEqual(rankErrors, []);
        assert.equal(concurrent, 1, 'the quota admits one Job at a time');
        assert.deepEqual(admitted.map((a) => a.campaign).sort(), campaigns);
        const [first, second] = admitted as [(typeof admitted)[number], (typeof admitted)[number]];
        assert.ok(second.at >= first.doneAt!, 'the second Job ran only after the first had finished');
        const out = Object.fromEntries(campaigns.map((c, i) => [c, outputs[i]!]));
        for (const c of campaigns) assert.equal(out[c]!.staged.key, keys.checkpointKey(c, 1));
        console.log(
          `# update outputs: ${JSON.stringify(campaigns.map((c) => ({ c, queueWaitSeconds: out[c]!.queueWaitSeconds, runSeconds: out[c]!.runSeconds })))}`,
        );
        const waited = out[second.campaign]!;
        const ranFirst = out[first.campaign]!;
        assert.ok(
          (waited.queueWaitSeconds ?? 0) >= holdMs / 1000 - 1,
          `the second waited for the first: ${JSON.stringify(waited)}`,
        );
        assert.ok(
          (ranFirst.queueWaitSeconds ?? Infinity) < (waited.queueWaitSeconds ?? 0),
          JSON.stringify(ranFirst),
        );
        for (const o of outputs)
          assert.ok((o.runSeconds ?? 0) >= holdMs / 1000 - 1 && (o.runSeconds ?? 0) < 60, JSON.stringify(o));

        // While it waited, the second update said so, with a growing wait, at every beat.
        const secondBeats = beats.get(second.campaign)!;
        const queued = secondBeats.filter((b) => b.state === 'queued');
        assert.ok(queued.length >= 3, JSON.stringify(secondBeats.map((b) => b.state)));
        assert.ok(queued.at(-1)!.queueWaitSeconds! >= holdMs / 1000 - 2, JSON.stringify(queued.at(-1)));
        const gaps = secondBeats.slice(1).map((b, i) => b.at - secondBeats[i]!.at);
        assert.ok(Math.max(...gaps) < heartbeatTimeoutMs, `heartbeat gaps ${gaps.join(', ')} ms`);
      } finally {
        stop = true;
        await ranks.catch(() => undefined);
        rmSync(root, { recursive: true, force: true });
      }
    },
  );

  it(
    'a queued Job adopted by another launcher keeps its wait; suspended again by Kueue (Workload deactivated) it is queued, not failed, and completes once readmitted',
    { timeout: 120_000 },
    async () => {
      const root = mkdtempSync(join(tmpdir(), 'moerl-kueue-store-'));
      const settings = launcherSettings(root);
      const spec = (n: string): TrainJobSpec => ({
        name: `kueue-${n}-0a1b2c3d`,
        worldSize: 2,
        job: { store: { kind: 'fs', path: root }, checkpoints: [], inputLists: [], steps: [], outputs: [] },
        env: {},
        provider: 'tcp',
        owner: { campaignId: `kueue-${n}`, iteration: 1, attempt: 1 },
      });
      const launcher = new KubernetesLauncher(cluster.kubeConfig(), settings);
      const holder = await launcher.launch(spec('holder'));
      let queued: TrainJob | undefined;
      let adopted: TrainJob | undefined;
      try {
        await runningPods(holder.name, 2);
        queued = await launcher.launch(spec('waiter'));
        await jobState(queued, 'queued', 'the second Job to be queued');
        await new Promise((done) => setTimeout(done, 3_000));
        assert.deepEqual(await jobPods(queued.name), [], 'a queued Job has no pods');

        const fresh = new KubeConfig();
        fresh.loadFromFile(cluster.kubeconfig);
        adopted = await new KubernetesLauncher(fresh, settings).launch(spec('waiter'));
        assert.equal(adopted.adopted, true);
        await waitFor('the adopting launcher to see the Job queued', 30_000, async () => {
          const s = adopted!.status();
          return (s.state === 'queued' && (s.queueWaitSeconds ?? 0) >= 3) || JSON.stringify(s);
        });

        await completePods(holder.name, 2);
        assert.equal((await holder.wait()).state, 'succeeded');
        await runningPods(adopted.name, 2);
        await jobState(adopted, 'running', 'the adopted Job to run');
        const firstWait = adopted.status().queueWaitSeconds!;

        // What a preemption does: Kueue evicts the Workload and suspends the admitted Job again.
        const workload = await workloadOf(adopted.name);
        await setWorkloadActive(workload, false);
        await jobState(adopted, 'queued', 'the preempted Job to be queued again');
        await waitFor(
          'its pods to be removed',
          30_000,
          async () => (await jobPods(adopted!.name)).length === 0 || 'pods left',
        );
        await new Promise((done) => setTimeout(done, 2_000));
        assert.equal(adopted.status().state, 'queued', 'still queued, not failed');
        await setWorkloadActive(workload, true);
        await completePods(adopted.name, 2);
        const final: JobStatus = await adopted.wait();
        assert.equal(final.state, 'succeeded', JSON.stringify(final));
        assert.ok(final.queueWaitSeconds! >= firstWait + 2, `both waits count: ${JSON.stringify(final)}`);
      } finally {
        await adopted?.cleanUp();
        await queued?.cleanUp();
        await holder.cleanUp();
        rmSync(root, { recursive: true, force: true });
      }
    },
  );
});

/** Waits (30 s at most) until `job` reports `state`. */
async function jobState(job: TrainJob, state: JobStatus['state'], what: string): Promise<void> {
  await waitFor(what, 30_000, async () => job.status().state === state || job.status().state);
}

/** Deactivates the Workload `name`, as a preemption does (Kueue suspends its Job), or readmits it. */
async function setWorkloadActive(name: string, active: boolean): Promise<void> {
  const patch = JSON.stringify({ spec: { active } });
  await kubectlOut(cluster, ['-n', namespace, 'patch', 'workload', name, '--type=merge', '-p', patch]);
}

/** The name of the Kueue Workload that stands for Job `name`. */
async function workloadOf(name: string): Promise<string> {
  let found = '';
  await waitFor(`the Workload of job ${name}`, 30_000, async () => {
    const list = JSON.parse(
      await kubectlOut(cluster, ['-n', namespace, 'get', 'workloads', '-o', 'json']),
    ) as {
      items: { metadata: { name: string; ownerReferences?: { kind: string; name: string }[] } }[];
    };
    found =
      list.items.find((w) => w.metadata.ownerReferences?.some((r) => r.kind === 'Job' && r.name === name))
        ?.metadata.name ?? '';
    return found !== '' || `${list.items.length} workloads, none of job ${name}`;
  });
  return found;
}
