// The rollout fleet's demand signal (workers/demand.ts) against real campaigns on the real
// Temporal dev server: the campaign workflow as shipped, with recording test activities held at
// gates, so each moment of an iteration can be looked at for as long as it takes. The metric
// moerl_rollout_ranks_wanted must be shards scheduled or running × rolloutEpWorldSize, and 0
// while the campaign updates, is paused or has completed, with staleness 0 and 1. Beside it, the
// rollout queue's approximate backlog (what KEDA's Temporal scaler reads) shows why a backlog
// cannot size the fleet: it counts shards waiting for a worker, not shards running.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Context, sleep } from '@temporalio/activity';
import { Registry } from 'prom-client';
import type { CampaignActivities, RolloutShardInput, UpdateInput } from '../../activities/types.js';
import { rolloutDemandReader, trackRolloutDemand } from '../../workers/demand.js';
import { runWorkers } from '../../workers/worker.js';
import {
  startCampaign,
  testSpec,
  uniqueTaskQueues,
  waitFor,
  waitForState,
  withWorkers,
  workflowBundle,
} from '../support/campaign-harness.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

const shards = 3;
const worldSize = 2;

/** Recording activities whose rollout shards and updates wait until their gate is released. */
function gatedActivities() {
  const { activities, calls } = createRecordingTestActivities();
  const released = new Set<string>();
  /** Keys of the calls that reached their gate (started on a worker). */
  const reached: string[] = [];
  const gated =
    <I, O>(key: (input: I) => string, fn: (input: I) => Promise<O>) =>
    async (input: I): Promise<O> => {
      reached.push(key(input));
      while (!released.has(key(input))) {
        Context.current().heartbeat();
        await sleep(50);
      }
      return fn(input);
    };
  const held: CampaignActivities = {
    ...activities,
    rolloutShard: gated(
      (i: RolloutShardInput) => `rollout/${i.iteration}/${i.shard}`,
      activities.rolloutShard,
    ),
    updatePolicy: gated((i: UpdateInput) => `update/${i.iteration}`, activities.updatePolicy),
  };
  const release = (...keys: string[]) => keys.forEach((k) => released.add(k));
  const releaseRollout = (iteration: number) =>
    release(...Array.from({ length: shards }, (_, s) => `rollout/${iteration}/${s}`));
  /** Gated calls of `stage` (rollout, update) in `iteration` that started on a worker. */
  const started = (stage: string, iteration: number) =>
    reached.filter((k) => k.startsWith(`${stage}/${iteration}`));
  /** Calls of `activity` in `iteration` that ended. */
  const ended = (activity: string, iteration: number) =>
    calls.filter((c) => c.activity === activity && c.iteration === iteration && c.endedAt !== undefined);
  return { activities: held, release, releaseRollout, started, ended };
}

describe('rollout demand: moerl_rollout_ranks_wanted through whole iterations', () => {
  let t: TestEnvironment;
  before(async () => {
    t = await startTestEnvironment();
    await workflowBundle();
  });
  after(async () => {
    await t?.teardown();
  });

  for (const staleness of [0, 1] as const) {
    it(`follows the campaign's shards with staleness ${staleness}: shards × EP size while scheduled or running, 0 while updating, paused, completed`, async () => {
      const gates = gatedActivities();
      const queues = uniqueTaskQueues();
      const registry = new Registry();
      const stopDemand = new AbortController();
      const read = rolloutDemandReader(t.nativeConnection.workflowService, t.namespace, queues);
      const tracking = trackRolloutDemand({ registry, read, intervalMs: 100, signal: stopDemand.signal });
      const exported = async () =>
        (await registry.getSingleMetric('moerl_rollout_ranks_wanted')!.get()).values[0]?.value;
      /** The exported gauge reaches `ranks`, and a read now says the same. */
      const demandIs = async (ranks: number, when: string) => {
        await waitFor(`demand ${ranks} ${when}`, async () =>
          (await exported()) === ranks ? true : undefined,
        );
        assert.equal(await read(), ranks, when);
      };
      const backlog = async () => {
        const d = await t.nativeConnection.workflowService.describeTaskQueue({
          namespace: t.namespace,
          taskQueue: { name: queues.rollout },
          taskQueueType: 2, // TASK_QUEUE_TYPE_ACTIVITY
          reportStats: true,
        });
        return Number(d.stats?.approximateBacklogCount ?? 0);
      };
      const spec = testSpec({
        iterations: 2,
        rolloutShards: shards,
        rolloutEpWorldSize: worldSize,
        staleness,
        retention: { keepLast: 2 },
      });
      const want = shards * worldSize;
      try {
        await withWorkers(
          t.nativeConnection,
          t.namespace,
          gates.activities,
          async () => {
            await demandIs(0, 'before any campaign');
            const handle = await startCampaign(t.client, spec, queues);
            // No rollout worker yet (a fleet scaled to zero): the shards wait in the queue.
            await demandIs(want, 'with iteration 1 scheduled and no rollout worker');
            await waitFor('the backlog to show the waiting shards', async () =>
              (await backlog()) === shards ? true : undefined,
            );

            const stopRollout = new AbortController();
            const rolloutWorker = runWorkers({
              roles: ['rollout'],
              connection: t.nativeConnection,
              namespace: t.namespace,
              taskQueues: queues,
              activities: gates.activities,
              shutdownGraceMs: 1000,
              signal: stopRollout.signal,
            });
            try {
              await waitFor('iteration 1 shards to run', async () =>
                gates.started('rollout', 1).length === shards ? true : undefined,
              );
              await demandIs(want, 'with iteration 1 running');
              // The Temporal scaler's view: the running shards are no backlog at all.
              await waitFor('the backlog to drain', async () => ((await backlog()) === 0 ? true : undefined));
              assert.equal(await read(), want, 'the running shards still want their ranks');

              gates.release('rollout/1/0');
              await waitFor('shard 0 to end', async () =>
                gates.ended('rolloutShard', 1).length === 1 ? true : undefined,
              );
              await demandIs(want - worldSize, 'with one shard of iteration 1 done');
              gates.releaseRollout(1);
              await waitFor('update 1 to start', async () =>
                gates.started('update', 1).length === 1 ? true : undefined,
              );
              if (staleness === 1) {
                // Iteration 2 samples from checkpoint 0 while update 1 runs.
                await demandIs(want, 'with update 1 and the rollout of iteration 2 running');
                await waitFor('iteration 2 shards to run', async () =>
                  gates.started('rollout', 2).length === shards ? true : undefined,
                );
                gates.releaseRollout(2);
                await waitFor('the reward of iteration 2', async () =>
                  gates.ended('computeRewards', 2).length === 1 ? true : undefined,
                );
              }
              await demandIs(0, 'while update 1 runs with no rollout left');

              await handle.signal('pause', { reason: 'demand test' });
              gates.release('update/1');
              await waitForState(handle, 'the campaign paused', (s) => s.status === 'paused');
              await demandIs(0, 'while paused');
              await handle.signal('resume');
              if (staleness === 0) {
                await demandIs(want, 'with iteration 2 scheduled or running after the resume');
                await waitFor('iteration 2 shards to run', async () =>
                  gates.started('rollout', 2).length === shards ? true : undefined,
                );
                await demandIs(want, 'with iteration 2 running');
                gates.releaseRollout(2);
              }
              await waitFor('update 2 to start', async () =>
                gates.started('update', 2).length === 1 ? true : undefined,
              );
              await demandIs(0, 'while update 2 runs');
              gates.release('update/2');
              const result = await handle.result();
              assert.equal(result.status, 'completed');
              await demandIs(0, 'after the campaign completed');
            } finally {
              stopRollout.abort();
              await rolloutWorker;
            }
          },
          queues,
          ['control', 'train'],
        );
      } finally {
        stopDemand.abort();
        await tracking;
      }
    });
  }
});
