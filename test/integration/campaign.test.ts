// The campaign workflow on the real Temporal dev server, with recording test activities.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { WorkflowFailedError, WorkflowUpdateFailedError } from '@temporalio/client';
import { CancelledFailure } from '@temporalio/common';
import type { WorkflowHandle } from '@temporalio/client';
import type { RolloutShardInput, UpdateInput } from '../../activities/types.js';
import type { campaign } from '../../workflows/campaign.js';
import { campaignStatusKey, iterationKey, meanRewardKey } from '../../workflows/search-attributes.js';
import { setHyperparametersUpdate } from '../../workflows/messages.js';
import type { CampaignState } from '../../workflows/types.js';
import { badInput, createRecordingTestActivities } from '../support/recording-activities.js';
import type { RecordedCall } from '../support/recording-activities.js';
import { startCampaign, testSpec, waitFor, waitForState, withWorkers } from '../support/campaign-harness.js';
import { maybeRecordHistory } from '../support/histories.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

let t: TestEnvironment;
before(async () => {
  t = await startTestEnvironment();
});
after(async () => {
  await t?.teardown();
});

const of = (calls: RecordedCall[], activity: RecordedCall['activity'], iteration?: number) =>
  calls.filter((c) => c.activity === activity && (iteration === undefined || c.iteration === iteration));
const only = (calls: RecordedCall[], activity: RecordedCall['activity'], iteration: number) => {
  const found = of(calls, activity, iteration).filter((c) => c.outcome === 'ok');
  assert.equal(found.length, 1, `expected one successful ${activity} of iteration ${iteration}`);
  return found[0]!;
};
const status = (h: WorkflowHandle<typeof campaign>) => h.query<CampaignState>('status');

describe('campaign workflow on the dev server', () => {
  test('runs rollout over every shard, then reward, update and checkpoint, per iteration', async () => {
    const { activities, calls } = createRecordingTestActivities();
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 3 }), queues);
      const result = await handle.result();
      assert.equal(result.status, 'completed');
      assert.equal(result.committedIteration, 3);
      assert.equal(of(calls, 'preparePolicy').length, 1);
      for (let i = 1; i <= 3; i++) {
        const shards = of(calls, 'rolloutShard', i);
        assert.deepEqual(shards.map((c) => c.shard).sort(), [0, 1]);
        for (const s of shards)
          assert.equal((s.input as RolloutShardInput).policy.iteration, i - 1, 'on-policy');
        const reward = only(calls, 'computeRewards', i);
        const update = only(calls, 'updatePolicy', i);
        const commit = only(calls, 'commitCheckpoint', i);
        assert.ok(Math.max(...shards.map((s) => s.endedAt!)) <= reward.startedAt);
        assert.ok(reward.endedAt! <= update.startedAt && update.endedAt! <= commit.startedAt);
      }
      const state = await status(handle);
      assert.equal(state.status, 'completed');
      assert.equal(state.latestCheckpoint?.iteration, 3);
      assert.deepEqual(
        state.recentIterations.map((r) => r.iteration),
        [1, 2, 3],
      );
      const sa = (await handle.describe()).typedSearchAttributes;
      assert.equal(sa.get(iterationKey), 3);
      assert.equal(sa.get(campaignStatusKey), 'completed');
      assert.ok(Math.abs((sa.get(meanRewardKey) ?? 0) - 0.25) < 1e-9);
      await maybeRecordHistory(handle, 'on-policy-3-iterations');
    });
  });

  test('pause takes effect at the next stage boundary; resume continues', async () => {
    const { activities, calls, release, started } = createRecordingTestActivities({
      holdWhen: (c) => c.activity === 'rolloutShard' && c.iteration === 1,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 2 }), queues);
      await started('rolloutShard', 1);
      await handle.signal('pause', { reason: 'inspecting' });
      assert.equal((await status(handle)).status, 'pausing', 'the running rollout is not interrupted');
      release('rolloutShard', 1);
      const paused = await waitForState(handle, 'paused', (s) => s.status === 'paused');
      assert.equal(paused.pauseReason, 'inspecting');
      assert.equal(paused.activeStages.length, 0);
      await new Promise((r) => setTimeout(r, 800));
      assert.equal(of(calls, 'computeRewards').length, 0, 'no stage starts while paused');
      assert.ok(
        of(calls, 'rolloutShard', 1).every((c) => c.outcome === 'ok'),
        'rollout finished, not cancelled',
      );
      await handle.signal('resume', {});
      const result = await handle.result();
      assert.equal(result.committedIteration, 2);
      await maybeRecordHistory(handle, 'pause-resume');
    });
  });

  test('setHyperparameters: accepted changes apply from the next iteration, bad ones are rejected', async () => {
    const { activities, calls, release, started } = createRecordingTestActivities({
      holdWhen: (c) => c.activity === 'rolloutShard' && c.iteration === 1,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 2 }), queues);
      await started('rolloutShard', 1);
      const change = await handle.executeUpdate(setHyperparametersUpdate, {
        args: [{ changes: { temperature: 0.5, lr: 1e-4 }, reason: 'cooler sampling' }],
      });
      assert.deepEqual(change.changes, { temperature: 0.5, lr: 1e-4 });
      assert.equal(change.iteration, 2, 'iteration 1 already snapshotted its hyperparameters');
      await assert.rejects(
        handle.executeUpdate('setHyperparameters', { args: [{ changes: { lr: -1 } }] }),
        (err: unknown) =>
          err instanceof WorkflowUpdateFailedError && /lr: got -1/.test(String(err.cause?.message)),
      );
      await assert.rejects(
        handle.executeUpdate('setHyperparameters', { args: [{ changes: { lrr: 0.1 } as never }] }),
        (err: unknown) =>
          err instanceof WorkflowUpdateFailedError && /unknown field.*"lrr"/.test(String(err.cause?.message)),
      );
      release('rolloutShard', 1);
      await handle.result();
      const hp = (i: number) => (only(calls, 'updatePolicy', i).input as UpdateInput).hyperparameters;
      assert.equal(hp(1).temperature, 1.0);
      assert.equal(hp(2).temperature, 0.5);
      assert.equal(hp(2).lr, 1e-4);
      for (const s of of(calls, 'rolloutShard', 2))
        assert.equal((s.input as RolloutShardInput).hyperparameters.temperature, 0.5);
      const state = await status(handle);
      assert.equal(state.hyperparameterChanges.length, 1, 'rejected changes are not recorded');
      assert.equal(state.hyperparameterChanges[0]?.reason, 'cooler sampling');
      await maybeRecordHistory(handle, 'hyperparameter-update');
    });
  });

  test('cancel stops the running stage and keeps the last committed checkpoint', async () => {
    // The update of iteration 2 runs until it is cancelled.
    const { activities, calls, started } = createRecordingTestActivities({
      holdWhen: (c) => c.activity === 'updatePolicy' && c.iteration === 2,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 3 }), queues);
      await started('updatePolicy', 2);
      await handle.cancel();
      await assert.rejects(
        handle.result(),
        (err: unknown) => err instanceof WorkflowFailedError && err.cause instanceof CancelledFailure,
      );
      assert.equal((await handle.describe()).status.name, 'CANCELLED');
      const state = await status(handle);
      assert.equal(state.status, 'cancelled');
      assert.equal(state.latestCheckpoint?.iteration, 1);
      assert.equal(of(calls, 'commitCheckpoint', 2).length, 0, 'the interrupted update is never committed');
      await waitFor('update activity to observe cancellation', async () =>
        of(calls, 'updatePolicy', 2).every((c) => c.endedAt !== undefined) ? true : undefined,
      );
      assert.equal(of(calls, 'updatePolicy', 2)[0]?.outcome, 'cancelled');
      assert.equal((await handle.describe()).typedSearchAttributes.get(campaignStatusKey), 'cancelled');
    });
  });

  test('continue-as-new carries the whole state across runs', async () => {
    const { activities, release, started } = createRecordingTestActivities({
      delayMs: { rolloutShard: 300 },
      holdWhen: (c) => c.activity === 'rolloutShard' && c.iteration === 1,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = testSpec({ iterations: 7, orchestration: { continueAsNewEvery: 2 } });
      const handle = await startCampaign(t.client, spec, queues);
      await started('rolloutShard', 1);
      await handle.executeUpdate(setHyperparametersUpdate, { args: [{ changes: { klCoef: 0.05 } }] });
      release('rolloutShard', 1);
      const latest = t.client.workflow.getHandle<typeof campaign>(handle.workflowId);
      const result = await latest.result();
      assert.equal(result.committedIteration, 7);
      const state = await status(latest);
      assert.equal(state.runs, 4, 'iterations 1-2, 3-4, 5-6, 7');
      assert.equal(state.hyperparameters.klCoef, 0.05);
      assert.equal(state.hyperparameterChanges.length, 1);
      assert.equal(state.hyperparameterChanges[0]?.iteration, 2);
      assert.deepEqual(
        state.recentIterations.map((r) => r.iteration),
        [1, 2, 3, 4, 5, 6, 7],
      );
      const runs = [];
      for await (const run of t.client.workflow.list({ query: `WorkflowId = '${handle.workflowId}'` }))
        runs.push(run);
      assert.equal(runs.length, 4);
    });
  });

  test('staleness 1 overlaps rollout of iteration i+1 with the update of iteration i', async () => {
    const { activities, calls } = createRecordingTestActivities({
      delayMs: { rolloutShard: 500, updatePolicy: 1200 },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 3, staleness: 1 }), queues);
      const result = await handle.result();
      assert.equal(result.committedIteration, 3);
      for (let i = 1; i <= 2; i++) {
        const update = only(calls, 'updatePolicy', i);
        const next = of(calls, 'rolloutShard', i + 1);
        for (const r of next) {
          assert.ok(r.startedAt < update.endedAt!, `rollout ${i + 1} starts before update ${i} ends`);
          assert.ok(r.endedAt! > update.startedAt, `rollout ${i + 1} runs while update ${i} runs`);
          assert.equal((r.input as RolloutShardInput).policy.iteration, i - 1, 'sampled one step off-policy');
        }
        assert.equal(
          (update.input as UpdateInput).policy.iteration,
          i - 1,
          'update i starts from checkpoint i-1',
        );
      }
      await maybeRecordHistory(handle, 'off-policy-3-iterations');
    });
  });

  test('a stage that fails for good pauses the campaign with the reason; resume retries it', async () => {
    const { activities, calls } = createRecordingTestActivities({
      failWhen: (c) =>
        c.activity === 'computeRewards' && c.iteration === 2 && of(calls, 'computeRewards', 2).length === 1
          ? badInput('rollout line 3 of shard 0 is not valid JSON')
          : c.activity === 'rolloutShard' && c.iteration === 1 && c.shard === 0 && c.attempt === 1
            ? new Error('worker lost')
            : undefined,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 2 }), queues);
      const paused = await waitForState(handle, 'self-pause', (s) => s.status === 'paused');
      assert.equal(paused.lastFailure?.stage, 'reward');
      assert.equal(paused.lastFailure?.iteration, 2);
      assert.equal(paused.lastFailure?.type, 'BadInput');
      assert.equal(paused.lastFailure?.nonRetryable, true);
      assert.match(paused.pauseReason ?? '', /reward of iteration 2 failed: rollout line 3/);
      assert.equal(paused.latestCheckpoint?.iteration, 1, 'nothing of iteration 2 committed');
      assert.equal(paused.retries.rollout, 1, 'the lost rollout shard was retried by the server');
      await handle.signal('resume', {});
      const result = await handle.result();
      assert.equal(result.committedIteration, 2);
      assert.equal(of(calls, 'computeRewards', 2).length, 2);
    });
  });
});
