// The elastic rollout fleet end to end: KEDA's real operator and metrics server (support/keda.ts)
// on a real control plane scale the rollout Deployment and ScaledObject of the eks overlay (as
// rendered, k8s/autoscaling) by moerl_rollout_ranks_wanted, which a control worker's demand
// reader (workers/demand.ts) serves from real campaigns on the Temporal dev server. The
// Deployment's pods run on kwok nodes; this file plays their kubelet: each pod that runs gets a
// rollout worker in this process (recording test activities, marking its pod busy or idle as a
// real worker does), and a pod that is deleted has its worker stopped gracefully.
// Checked, with staleness 0 and then 1, three iterations each: replicas rise to the shards'
// need (each shard waits until all shards of its iteration run, one per pod), a scale-in while
// one shard still runs deletes the idle pod and keeps the busy one, the fleet is at zero while
// an update runs (staleness 0) and after a campaign, and comes back for the next; no pod is
// deleted under a running activity and no shard runs twice.
// Test-only settings: a pod is 1 CPU (1 rank, 1 shard of EP 1 at a time) with targetValue 1;
// KEDA polls every second and cools down in 5 s; the HPA scales down after 2 s; the controller
// manager's HPA sync period is 3 s (kube-cluster.ts).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AppsV1Api, CoreV1Api } from '@kubernetes/client-node';
import { ApplicationFailure, Context, sleep } from '@temporalio/activity';
import { stringify } from 'yaml';
import type { CampaignActivities, RolloutShardInput, UpdateInput } from '../../activities/types.js';
import type { TaskQueues } from '../../workflows/types.js';
import {
  resultWithin,
  startCampaign,
  testSpec,
  uniqueTaskQueues,
  waitFor,
  withWorkers,
  workflowBundle,
} from '../support/campaign-harness.js';
import { startKeda, type Keda } from '../support/keda.js';
import { startKubeCluster, type KubeCluster } from '../support/kube-cluster.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import {
  fleetObjects,
  rolloutFleet as startRolloutFleet,
  rolloutPods,
  rolloutReplicas,
  scaledObjectReady,
  serveRolloutDemand,
} from '../support/rollout-fleet.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

const shards = 2;
/** The longest any step here may take (a scale-out, a scale-in, a stage) before the test fails. */
const waitLimitMs = 120_000;

let cluster: KubeCluster;
let core: CoreV1Api;
let apps: AppsV1Api;
let keda: Keda | undefined;
let t: TestEnvironment;
let demand: Awaited<ReturnType<typeof serveRolloutDemand>> | undefined;
let namespace: string;
const queues: TaskQueues = uniqueTaskQueues();

/** Three iterations of `shards` shards of one rank each. */
const fleetSpec = (name: string, staleness: 0 | 1) =>
  testSpec({ name, iterations: 3, rolloutShards: shards, rolloutEpWorldSize: 1, staleness });

const rolloutPodsNow = () => rolloutPods(core, namespace);
const replicas = () => rolloutReplicas(apps, namespace);

/**
 * Recording activities whose shards each wait until every shard of their iteration runs (one per
 * pod: the fleet has grown to the need) and any hold on them is released; with `updateWaitsForZero`
 * an update waits until the fleet is at zero (no campaign wants a rollout worker meanwhile).
 */
function fleetActivities(opts: {
  updateWaitsForZero: (campaignId: string) => boolean;
  fleetAtZero: () => Promise<boolean>;
}) {
  const { activities, calls } = createRecordingTestActivities();
  const startedShards = new Map<string, number>();
  const held = new Set<string>();
  // Bounded: a fleet that never comes fails the campaign with what it waited for (in its
  // lastFailure, which resultWithin reports), where an endless wait hung the file until killed.
  const waitUntil = async (what: string, ready: () => boolean | Promise<boolean>) => {
    const deadline = Date.now() + waitLimitMs;
    while (!(await ready())) {
      if (Date.now() > deadline)
        throw ApplicationFailure.nonRetryable(`test activity: ${what} not within ${waitLimitMs} ms`);
      Context.current().heartbeat();
      await sleep(200);
    }
  };
  const gated: CampaignActivities = {
    ...activities,
    rolloutShard: async (input: RolloutShardInput) => {
      const iteration = `${input.campaignId}/${input.iteration}`;
      startedShards.set(iteration, (startedShards.get(iteration) ?? 0) + 1);
      await waitUntil(
        `every shard of ${iteration} running, ${iteration}/${input.shard} released`,
        () => (startedShards.get(iteration) ?? 0) >= shards && !held.has(`${iteration}/${input.shard}`),
      );
      return activities.rolloutShard(input);
    },
    updatePolicy: async (input: UpdateInput) => {
      if (opts.updateWaitsForZero(input.campaignId))
        await waitUntil(`the fleet at zero before update ${input.iteration}`, opts.fleetAtZero);
      return activities.updatePolicy(input);
    },
  };
  return {
    activities: gated,
    calls,
    hold: (key: string) => held.add(key),
    release: (key: string) => held.delete(key),
    started: (iteration: string) => startedShards.get(iteration) ?? 0,
  };
}

before(
  async () => {
    cluster = await startKubeCluster({ kwok: true });
    core = cluster.kubeConfig().makeApiClient(CoreV1Api);
    apps = cluster.kubeConfig().makeApiClient(AppsV1Api);
    keda = await startKeda(cluster);
    t = await startTestEnvironment();
    await workflowBundle();
    namespace = await cluster.createNamespace('moerl-keda');
    demand = await serveRolloutDemand(t.nativeConnection, t.namespace, queues);
    const { objects, nodeLabels } = await fleetObjects(namespace, {
      metricsUrl: demand.url,
      elastic: {
        pollingInterval: 1,
        cooldownPeriod: 5,
        maxReplicaCount: 4,
        scaleDown: { stabilizationWindowSeconds: 2, pods: 2, periodSeconds: 5 },
      },
    });
    await cluster.addFakeNodes(2, nodeLabels);
    const applied = await cluster.kubectl(['apply', '-f', '-'], {
      input: objects.map((o) => stringify(o)).join('---\n'),
    });
    assert.equal(applied.code, 0, applied.stderr);
    await scaledObjectReady(cluster, keda, namespace);
  },
  // Below the file's limit (scripts/test.sh), so a slow start fails here and the after hook runs.
  { timeout: 420_000 },
);

after(async () => {
  await demand?.stop();
  await keda?.stop();
  await t?.teardown();
  await cluster?.stop();
});

describe('KEDA scales the rollout fleet by the campaigns\u2019 demand (real KEDA, real control plane, kwok nodes)', () => {
  it('follows 3 iterations with staleness 0 then 1, scales in idle pods first, is at zero between and after campaigns', async () => {
    let first = '';
    // Zero is no pod and no worker left, not only replicas 0: a pod being deleted still polls
    // until its worker stops (SIGTERM, for a real one), and a shard it took then would fail.
    let fleetAtZero = async () => false;
    const gates = fleetActivities({
      updateWaitsForZero: (campaignId) => campaignId === first,
      fleetAtZero: () => fleetAtZero(),
    });
    const fleet = startRolloutFleet({
      cluster,
      core,
      namespace,
      temporal: { address: t.address, namespace: t.namespace },
      taskQueues: queues,
      activities: gates.activities,
    });
    fleetAtZero = async () =>
      (await replicas()) === 0 && (await rolloutPodsNow()).length === 0 && fleet.live().length === 0;
    const reachesZero = (when: string) =>
      waitFor(
        `the fleet at zero ${when}`,
        async () => ((await fleetAtZero()) ? true : undefined),
        waitLimitMs,
        200,
      );
    /** What the fleet is doing, for a campaign that does not end. */
    const fleetNow = async () => {
      const pods = await rolloutPodsNow().then(
        (list) =>
          list
            .map(
              (p) =>
                `${p.metadata?.name} ${p.status?.phase}${p.metadata?.deletionTimestamp ? ' deleting' : ''}`,
            )
            .join(', '),
        (err: unknown) => `not listed (${String(err)})`,
      );
      const workers = fleet
        .live()
        .map((w) => `${w.pod} [${[...w.active].join('; ')}]`)
        .join(', ');
      return `replicas ${await replicas().catch(() => '?')}; pods: ${pods || 'none'}; live workers: ${workers || 'none'}`;
    };
    const samples: { at: number; replicas: number; running: number }[] = [];
    const sampling = new AbortController();
    const sampler = (async () => {
      while (!sampling.signal.aborted) {
        const live = fleet.live();
        // A read the API server fails (a loaded machine) is a sample missed, not the test's end.
        const now = await replicas().catch(() => undefined);
        if (now !== undefined)
          samples.push({ at: Date.now(), replicas: now, running: live.reduce((n, w) => n + w.running, 0) });
        await new Promise((r) => setTimeout(r, 500));
      }
    })();
    try {
      assert.equal(await replicas(), 0, 'no rollout pod before any campaign');
      await withWorkers(
        t.nativeConnection,
        t.namespace,
        gates.activities,
        async () => {
          // Staleness 0: the fleet grows to 2 pods per rollout and is at zero while each update runs.
          const spec0 = fleetSpec('keda-s0', 0);
          const handle0 = await startCampaign(t.client, spec0, queues);
          first = handle0.workflowId;
          gates.hold(`${first}/1/1`);
          await waitFor(
            'both shards of iteration 1 to run, one per pod',
            async () => (gates.started(`${first}/1`) === shards ? true : undefined),
            waitLimitMs,
            200,
          );
          const busy = fleet.live().find((w) => w.ran.includes(`${first}/1/1`));
          assert.ok(busy, 'a pod runs shard 1');
          // Shard 0 ends; shard 1 runs on: the demand falls to 1 pod, and the idle pod goes.
          await waitFor(
            'the scale-in to 1 pod',
            async () => ((await replicas()) === 1 ? true : undefined),
            waitLimitMs,
            200,
          );
          await waitFor(
            'the idle pod to go',
            async () => (fleet.live().length === 1 ? true : undefined),
            60_000,
            200,
          );
          assert.equal(fleet.live()[0]?.pod, busy.pod, 'the pod mid-shard stays');
          assert.equal(busy.running, 1, 'its shard still runs');
          gates.release(`${first}/1/1`);
          assert.equal((await resultWithin(handle0, 2 * waitLimitMs, fleetNow)).status, 'completed');
          await reachesZero('after the campaign');

          // Staleness 1, after the fleet went to zero: it comes back for the new campaign.
          const spec1 = fleetSpec('keda-s1', 1);
          const handle1 = await startCampaign(t.client, spec1, queues);
          assert.equal((await resultWithin(handle1, 2 * waitLimitMs, fleetNow)).status, 'completed');
          await reachesZero('after the second campaign');
          for (const [handle, iterations] of [
            [handle0, 3],
            [handle1, 3],
          ] as const)
            for (let i = 1; i <= iterations; i++)
              assert.equal(
                gates.started(`${handle.workflowId}/${i}`),
                shards,
                `${handle.workflowId} iteration ${i}: each shard ran once`,
              );
        },
        queues,
        ['control', 'train'],
      );
    } finally {
      sampling.abort();
      await sampler;
      await fleet.stop();
    }
    const stoppedBusy = [...fleet.workers.values()].filter((w) => (w.runningAtStop ?? 0) > 0);
    assert.deepEqual(
      stoppedBusy.map((w) => w.pod),
      [],
      'no pod was deleted while it ran an activity',
    );
    const shardCalls = gates.calls.filter((c) => c.activity === 'rolloutShard');
    assert.equal(shardCalls.length, 2 * 3 * shards, 'every shard ran');
    assert.deepEqual(
      shardCalls.filter((c) => c.attempt > 1),
      [],
      'no shard ran twice',
    );
    const peak = Math.max(...samples.map((s) => s.replicas));
    assert.ok(peak >= shards && peak <= 4, `replicas peaked at ${peak}`);
    const runningBeyondFleet = samples.filter((s) => s.running > s.replicas);
    assert.deepEqual(runningBeyondFleet, [], 'replicas never fell below the running activities');
    console.log(
      `fleet: ${fleet.workers.size} pods over the run; replicas sampled ${samples.length} times, peak ${peak}`,
    );
    keda!.assertRunning();
  });
});
