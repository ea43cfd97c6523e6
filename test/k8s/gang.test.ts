// An EP job is a gang (issue 19): when one or two rank pods of an EP 8 Job are lost (a rank
// crashes, or its pod is force-deleted) at a random moment, every other rank exits 75 (a peer
// was lost: workers/rank.ts, native/tools/moe_cli.h) and all eight meet again in a new
// rendezvous. The Job must not fail, and only the lost pods count against backoffLimit: before
// the podFailurePolicy ignored exit 75, the seven peers' exits each counted and one lost pod
// failed the Job (BackoffLimitExceeded at the default backoffLimit 3). Real control plane, kwok
// fake nodes: nothing runs in the pods, so the test gives each pod the exit code its rank would
// have, as kube-cluster.ts's setPodExitCode and a kubelet's status report do.
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { BatchV1Api, CoreV1Api, type V1Pod } from '@kubernetes/client-node';
import { KubernetesLauncher } from '../../activities/launch/kubernetes.js';
import { rankPeerLostExitCode, type TrainJob, type TrainJobSpec } from '../../activities/launch/types.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import { emptyTrainJob } from '../support/train-job-spec.js';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';

const worldSize = 8;

let cluster: KubeCluster;
let core: CoreV1Api;
let batch: BatchV1Api;

before(async () => {
  cluster = await startKubeCluster({ kwok: true });
  core = cluster.kubeConfig().makeApiClient(CoreV1Api);
  batch = cluster.kubeConfig().makeApiClient(BatchV1Api);
  await cluster.addFakeNodes(2);
});
after(async () => {
  await cluster?.stop();
});

let jobs = 0;
function gangSpec(): TrainJobSpec {
  jobs++;
  return emptyTrainJob(`gang-u${jobs}-0a1b2c3d`, worldSize, {
    campaignId: 'Gang Test',
    iteration: jobs,
    attempt: 1,
  });
}

/** A launcher with the default backoffLimit (3): the setting an operator gets. */
function launcherIn(namespace: string): KubernetesLauncher {
  const settings = kubernetesLauncherSchema.parse({
    kind: 'kubernetes',
    namespace,
    image: 'moerl-test/rank:none',
  });
  return new KubernetesLauncher(cluster.kubeConfig(), settings);
}

const podName = (pod: V1Pod) => pod.metadata?.name as string;
const rankOf = (pod: V1Pod) =>
  Number(pod.metadata?.annotations?.['batch.kubernetes.io/job-completion-index']);

/** The job's running pods once `worldSize` of them run, none of them in `replaced`. */
async function gangRunning(namespace: string, name: string, replaced = new Set<string>()): Promise<V1Pod[]> {
  let running: V1Pod[] = [];
  await waitFor(`${worldSize} running pods of job ${name}`, 90_000, async () => {
    await assertNotFailed(namespace, name);
    const all = (await core.listNamespacedPod({ namespace, labelSelector: `moerl.dev/job=${name}` })).items;
    running = all.filter(
      (p) => p.status?.phase === 'Running' && !p.metadata?.deletionTimestamp && !replaced.has(podName(p)),
    );
    return running.length === worldSize || `${running.length} running`;
  });
  return running.sort((a, b) => rankOf(a) - rankOf(b));
}

/**
 * A force-deleted pod as the kubelet ends it: deleted without grace, its container killed
 * (137) and the pod reported Failed; the Job's tracking finalizer keeps it until then.
 */
async function forceDelete(namespace: string, pod: V1Pod): Promise<void> {
  await core.deleteNamespacedPod({ namespace, name: podName(pod), gracePeriodSeconds: 0 });
  for (let attempt = 1; ; attempt++) {
    try {
      const current = await core.readNamespacedPod({ namespace, name: podName(pod) });
      const finishedAt = new Date();
      current.status = {
        ...current.status,
        phase: 'Failed',
        containerStatuses: (current.status?.containerStatuses ?? []).map((c) => ({
          ...c,
          ready: false,
          started: false,
          state: {
            terminated: {
              exitCode: 137,
              reason: 'Error',
              startedAt: c.state?.running?.startedAt,
              finishedAt,
            },
          },
        })),
      };
      await core.replaceNamespacedPodStatus({ namespace, name: podName(pod), body: current });
      return;
    } catch (err) {
      const code = (err as { code?: number }).code;
      if (code === 404) return; // already gone: the Job controller has counted it
      if (code !== 409 || attempt >= 5) throw err;
    }
  }
}

type Loss = 'crash' | 'force-delete';

/**
 * Loses `count` random ranks of the running gang at a random moment (a crash exits 1, the
 * rank's own failure; a force-deleted pod is killed), then the others exit 75 as their ranks do
 * once the bootstrap reports the loss. Returns the lost ranks.
 */
async function loseRanks(namespace: string, running: V1Pod[], count: number, loss: Loss): Promise<number[]> {
  const lost = new Set<number>();
  while (lost.size < count) lost.add(randomInt(worldSize));
  await sleep(randomInt(1500));
  for (const pod of running.filter((p) => lost.has(rankOf(p)))) {
    if (loss === 'crash') await cluster.setPodExitCode(namespace, podName(pod), 1);
    else await forceDelete(namespace, pod);
  }
  for (const pod of running.filter((p) => !lost.has(rankOf(p))))
    await cluster.setPodExitCode(namespace, podName(pod), rankPeerLostExitCode);
  return [...lost].sort();
}

/** The job's final status, failing the test if it takes longer than `ms`. */
async function finished(job: TrainJob, ms = 90_000) {
  const timer = new AbortController();
  const deadline = sleep(ms, undefined, { signal: timer.signal }).then(() => {
    throw new Error(`job ${job.name} still ${JSON.stringify(job.status())} after ${ms} ms`);
  });
  deadline.catch(() => {}); // aborted once the job has finished
  try {
    return await Promise.race([job.wait(), deadline]);
  } finally {
    timer.abort();
  }
}

async function assertNotFailed(namespace: string, name: string): Promise<void> {
  const stored = await batch.readNamespacedJob({ namespace, name });
  const failed = stored.status?.conditions?.filter(
    (c) => (c.type === 'Failed' || c.type === 'FailureTarget') && c.status === 'True',
  );
  assert.deepEqual(failed ?? [], [], `job ${name} failed: ${JSON.stringify(failed)}`);
}

describe('an EP 8 Job is a gang (real control plane, kwok fake nodes)', () => {
  for (const [count, loss] of [
    [1, 'crash'],
    [2, 'crash'],
    [1, 'force-delete'],
    [2, 'force-delete'],
  ] as const) {
    it(`${count} rank(s) lost by ${loss} at a random moment: every rank restarts once, the Job completes`, async () => {
      const namespace = await cluster.createNamespace('gang');
      const spec = gangSpec();
      const job = await launcherIn(namespace).launch(spec);
      try {
        const first = await gangRunning(namespace, spec.name);
        const lost = await loseRanks(namespace, first, count, loss);
        // Every rank meets again: eight new pods, none of the first generation.
        const second = await gangRunning(namespace, spec.name, new Set(first.map(podName)));
        await assertNotFailed(namespace, spec.name);
        assert.equal(job.status().state, 'running', `lost rank(s) ${lost.join(', ')}`);
        await waitFor('the launcher to count the gang restart', 30_000, async () => {
          const restarts = job.status().restarts;
          return restarts === 1 || `restarts ${restarts}`;
        });
        // Only the lost pods count against backoffLimit, never their peers' exits 75 (the Job's
        // status catches up with its pods a moment later).
        await waitFor(
          `the Job to count the ${count} lost pod(s) of ranks ${lost.join(', ')}`,
          30_000,
          async () => {
            const failed =
              (await batch.readNamespacedJob({ namespace, name: spec.name })).status?.failed ?? 0;
            assert.ok(failed <= count, `${failed} failures counted for ${count} lost pod(s)`);
            return failed === count || `failed ${failed}`;
          },
        );
        await assertNotFailed(namespace, spec.name);

        for (const pod of second) await cluster.setPodExitCode(namespace, podName(pod), 0);
        const status = await finished(job);
        assert.equal(status.state, 'succeeded');
        assert.equal(status.restarts, 1);
      } finally {
        await job.cleanUp();
      }
    });
  }

  it('a rank replaced alone while the group formed still counts once after the success policy has deleted it', async () => {
    // Regression: the restart was read from the pods left when the Job completed; the success
    // policy had deleted the replacement (the only pod that carried the count), so it read 0.
    const namespace = await cluster.createNamespace('gang');
    const spec = gangSpec();
    const job = await launcherIn(namespace).launch(spec);
    try {
      const first = await gangRunning(namespace, spec.name);
      const lost = first[randomInt(worldSize)]!;
      await forceDelete(namespace, lost);
      const kept = first.filter((p) => p !== lost);
      const all = await gangRunning(namespace, spec.name, new Set([podName(lost)]));
      const replacement = all.find((p) => !kept.some((k) => podName(k) === podName(p)))!;
      assert.equal(rankOf(replacement), rankOf(lost));
      // A rank of the first generation finishes first: the Job stops and deletes the others.
      await cluster.setPodExitCode(namespace, podName(kept[0]!), 0);
      const status = await finished(job);
      assert.equal(status.state, 'succeeded');
      await waitFor(`the replacement ${podName(replacement)} to be deleted`, 30_000, async () => {
        const left = (
          await core.listNamespacedPod({ namespace, labelSelector: `moerl.dev/job=${spec.name}` })
        ).items;
        return !left.some((p) => podName(p) === podName(replacement)) || 'still there';
      });
      assert.equal(status.restarts, 1);
    } finally {
      await job.cleanUp();
    }
  });

  it('two gang restarts in a row are counted twice and the Job still completes', async () => {
    const namespace = await cluster.createNamespace('gang');
    const spec = gangSpec();
    const job = await launcherIn(namespace).launch(spec);
    try {
      const first = await gangRunning(namespace, spec.name);
      await loseRanks(namespace, first, 1, 'crash');
      const second = await gangRunning(namespace, spec.name, new Set(first.map(podName)));
      await loseRanks(namespace, second, 1, 'force-delete');
      const seen = new Set([...first, ...second].map(podName));
      const third = await gangRunning(namespace, spec.name, seen);
      await assertNotFailed(namespace, spec.name);
      for (const pod of third) await cluster.setPodExitCode(namespace, podName(pod), 0);
      const status = await finished(job);
      assert.equal(status.state, 'succeeded');
      assert.equal(status.restarts, 2);
    } finally {
      await job.cleanUp();
    }
  });
});
