// The campaign workflow's failure, continue-as-new and cancellation paths on the real dev server,
// with recording test activities. Each test checks its path end to end and, with
// MOERL_RECORD_HISTORIES=1, records the history the replay test (test/unit/replay.test.ts)
// keeps replaying against later workflow code.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { WorkflowFailedError, WorkflowUpdateFailedError } from '@temporalio/client';
import type { WorkflowHandle } from '@temporalio/client';
import { CancelledFailure, defaultPayloadConverter } from '@temporalio/common';
import type { History } from '@temporalio/common/lib/proto-utils.js';
import type { CheckpointInput, RolloutShardInput, UpdateInput } from '../../activities/types.js';
import type { campaign } from '../../workflows/campaign.js';
import { setHyperparametersUpdate } from '../../workflows/messages.js';
import { campaignStatusKey } from '../../workflows/search-attributes.js';
import type { CampaignInput, CampaignState } from '../../workflows/types.js';
import { startCampaign, testSpec, waitFor, waitForState, withWorkers } from '../support/campaign-harness.js';
import { maybeRecordHistory } from '../support/histories.js';
import { badInput, createRecordingTestActivities } from '../support/recording-activities.js';
import type { RecordedCall } from '../support/recording-activities.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

let t: TestEnvironment;
before(async () => {
  t = await startTestEnvironment();
});
after(async () => {
  await t?.teardown();
});

// Generous: two loaded cores run the dev server, the workers and other engineers' builds.
const slow = 120_000;

const of = (calls: RecordedCall[], activity: RecordedCall['activity'], iteration?: number) =>
  calls.filter((c) => c.activity === activity && (iteration === undefined || c.iteration === iteration));
const only = (calls: RecordedCall[], activity: RecordedCall['activity'], iteration: number) => {
  const found = of(calls, activity, iteration);
  assert.deepEqual(
    found.map((c) => c.outcome),
    ['ok'],
    `expected exactly one ${activity} of iteration ${iteration}, and it succeeded`,
  );
  return found[0]!;
};
const status = (h: WorkflowHandle<typeof campaign>) => h.query<CampaignState>('status');
const isCancelled = (err: unknown) =>
  err instanceof WorkflowFailedError && err.cause instanceof CancelledFailure;

/** Rejects naming `what` if `promise` has not settled within `ms`. */
async function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not happen within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

interface ScheduledActivity {
  eventId: number;
  activity: string;
  /** The iteration the activity works on (-1 for preparePolicy, which has none in its input). */
  iteration: number;
  completedEventId?: number;
}

/** The activities a run scheduled, in history order, decoded from their inputs. */
function scheduledActivities(history: History): ScheduledActivity[] {
  const scheduled = new Map<number, ScheduledActivity>();
  for (const e of history.events ?? []) {
    const eventId = Number(e.eventId);
    const s = e.activityTaskScheduledEventAttributes;
    if (s) {
      const payload = s.input?.payloads?.[0];
      const input = payload
        ? defaultPayloadConverter.fromPayload<{ iteration?: number; staged?: { iteration: number } }>(payload)
        : {};
      const iteration = input.iteration ?? input.staged?.iteration ?? -1;
      scheduled.set(eventId, { eventId, activity: s.activityType?.name ?? '', iteration });
    }
    const done = e.activityTaskCompletedEventAttributes;
    const a = done && scheduled.get(Number(done.scheduledEventId));
    if (a) a.completedEventId = eventId;
  }
  return [...scheduled.values()];
}

/** Every run of a (closed) workflow, first to last, following each continue-as-new in the history. */
async function runsOf(handle: WorkflowHandle<typeof campaign>) {
  const latest = await handle.fetchHistory();
  const first = latest.events?.[0]?.workflowExecutionStartedEventAttributes?.firstExecutionRunId;
  const runs = [];
  for (let runId: string | null | undefined = first; runId;) {
    const run = t.client.workflow.getHandle<typeof campaign>(handle.workflowId, runId);
    const history = await run.fetchHistory();
    const started = history.events?.[0]?.workflowExecutionStartedEventAttributes;
    const input = defaultPayloadConverter.fromPayload<CampaignInput>(started!.input!.payloads![0]!);
    runs.push({ run, history, input, activities: scheduledActivities(history) });
    runId = history.events?.at(-1)?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId;
  }
  return runs;
}

describe('campaign paths recorded for replay', () => {
  test('an update that fails for good pauses with the reason; resume re-checks the rollout and completes', async () => {
    const { activities, calls } = createRecordingTestActivities({
      failWhen: (c) =>
        c.activity === 'updatePolicy' && c.iteration === 2 && of(calls, 'updatePolicy', 2).length === 1
          ? badInput('rollout chunk 1 of shard 0 has 3 samples per prompt, the spec says 2')
          : undefined,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 3 }), queues);
      const paused = await waitForState(handle, 'self-pause', (s) => s.status === 'paused', slow);
      assert.equal(paused.lastFailure?.stage, 'update');
      assert.equal(paused.lastFailure?.iteration, 2);
      assert.equal(paused.lastFailure?.type, 'BadInput');
      assert.equal(paused.lastFailure?.nonRetryable, true);
      assert.match(paused.pauseReason ?? '', /^update of iteration 2 failed: rollout chunk 1 of shard 0/);
      assert.equal(paused.latestCheckpoint?.iteration, 1, 'nothing of iteration 2 committed');
      assert.deepEqual(paused.activeStages, []);
      assert.equal(of(calls, 'updatePolicy', 2).length, 1, 'a non-retryable failure is not retried');
      const callsWhenPaused = calls.length;
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(calls.length, callsWhenPaused, 'no stage starts while paused');

      await handle.signal('resume', {});
      const result = await handle.result();
      assert.equal(result.status, 'completed');
      assert.equal(result.committedIteration, 3);
      const failedUpdate = of(calls, 'updatePolicy', 2)[0]!;
      assert.deepEqual(
        of(calls, 'updatePolicy', 2).map((c) => c.outcome),
        ['failed', 'ok'],
      );
      // Per the workflow's rule, a failed update re-runs its iteration's rollout phase first
      // (the rollout activities keep the chunks that verify), then the update.
      const rollouts2 = of(calls, 'rolloutShard', 2);
      assert.deepEqual(rollouts2.map((c) => c.shard).sort(), [0, 0, 1, 1]);
      assert.equal(rollouts2.filter((c) => c.startedAt > failedUpdate.endedAt!).length, 2);
      assert.equal(of(calls, 'computeRewards', 2).length, 2);
      only(calls, 'commitCheckpoint', 2);
      const state = await status(handle);
      assert.equal(state.status, 'completed');
      assert.equal(state.pauseReason, null);
      assert.equal(state.retries.update, 1);
      assert.deepEqual(
        state.recentIterations.map((r) => r.iteration),
        [1, 2, 3],
      );
      await maybeRecordHistory(handle, 'stage-failure-pause-resume');
    });
  });

  test('continue-as-new with staleness 1 carries the rollout run ahead, which is never run again', async () => {
    const { activities, calls } = createRecordingTestActivities({
      delayMs: { rolloutShard: 200, updatePolicy: 400 },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = testSpec({ iterations: 5, staleness: 1, orchestration: { continueAsNewEvery: 2 } });
      const handle = await startCampaign(t.client, spec, queues);
      const result = await handle.result();
      assert.equal(result.status, 'completed');
      assert.equal(result.committedIteration, 5);

      // The workflow's rule: the rollout of i+1 samples from the checkpoint update i starts
      // from (i-1), so iteration i samples from checkpoint i-2 for i >= 2 (and 0 for i = 1).
      const policyOf = (i: number) => Math.max(0, i - 2);
      for (let i = 1; i <= 5; i++) {
        const update = only(calls, 'updatePolicy', i);
        assert.equal((update.input as UpdateInput).policy.iteration, i - 1, `update ${i} starts from i-1`);
        const commit = only(calls, 'commitCheckpoint', i);
        const protect = (commit.input as CheckpointInput).protectIterations ?? [];
        assert.ok(protect.includes(policyOf(i)), `commit ${i} keeps the checkpoint rollout ${i} sampled`);
        if (i < 5)
          assert.ok(protect.includes(i - 1), `commit ${i} keeps the checkpoint rollout ${i + 1} samples`);
        const rollouts = of(calls, 'rolloutShard', i);
        assert.deepEqual(
          rollouts.map((c) => `${c.shard}:${c.outcome}`).sort(),
          ['0:ok', '1:ok'],
          `iteration ${i}: each shard rolled out once`,
        );
        for (const r of rollouts)
          assert.equal((r.input as RolloutShardInput).policy.iteration, policyOf(i), `rollout ${i} policy`);
      }
      const state = await status(t.client.workflow.getHandle<typeof campaign>(handle.workflowId));
      assert.equal(state.runs, 3, 'iterations 1-2, 3-4, 5');
      assert.deepEqual(state.carriedRollouts, []);
      assert.deepEqual(
        state.recentIterations.map((r) => [r.iteration, r.policyIteration]),
        [1, 2, 3, 4, 5].map((i) => [i, policyOf(i)]),
      );

      const runs = await runsOf(handle);
      assert.equal(runs.length, 3);
      // Runs 2 and 3 start with the rollout phase the previous run finished ahead of its update.
      assert.equal(runs[0]!.input.state, undefined);
      for (const [run, iteration] of [
        [runs[1]!, 3],
        [runs[2]!, 5],
      ] as const) {
        const [carried, ...more] = run.input.state?.carriedRollouts ?? [];
        assert.deepEqual(more, []);
        assert.equal(carried?.iteration, iteration);
        assert.equal(carried?.policy.iteration, policyOf(iteration));
        assert.deepEqual(
          run.activities.filter((a) => a.iteration === iteration).map((a) => a.activity),
          ['updatePolicy', 'commitCheckpoint'],
          `run ${run.input.state?.runs} only updates and commits the carried iteration ${iteration}`,
        );
      }
      assert.deepEqual(
        runs.map((r) => r.activities.filter((a) => a.activity === 'rolloutShard').map((a) => a.iteration)),
        [[1, 1, 2, 2, 3, 3], [4, 4, 5, 5], []],
      );
      // The overlap itself: rollout i+1 is scheduled before update i completes, in every run.
      for (const { activities: acts } of runs)
        for (const update of acts.filter((a) => a.activity === 'updatePolicy' && a.iteration < 5)) {
          const next = acts.filter(
            (a) => a.activity === 'rolloutShard' && a.iteration === update.iteration + 1,
          );
          assert.equal(
            next.length,
            2,
            `rollout ${update.iteration + 1} runs in the run of update ${update.iteration}`,
          );
          for (const r of next)
            assert.ok(
              r.eventId < update.completedEventId!,
              `rollout ${r.iteration} starts before update ${update.iteration} ends`,
            );
        }
      for (const [n, { run }] of runs.entries())
        await maybeRecordHistory(run, `continue-as-new-staleness-1-run-${n + 1}`);
    });
  });

  test('staleness 3 runs three iterations ahead, across continue-as-new, each shard once', async () => {
    const { activities, calls } = createRecordingTestActivities({
      delayMs: { rolloutShard: 200, updatePolicy: 400 },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const k = 3;
      const spec = testSpec({
        iterations: 6,
        staleness: k,
        retention: { keepLast: 1 + k, keepBest: false },
        orchestration: { continueAsNewEvery: 2 },
      });
      const handle = await startCampaign(t.client, spec, queues);
      const result = await handle.result();
      assert.equal(result.status, 'completed');
      assert.equal(result.committedIteration, 6);

      // Iterations up to i+k sample from the checkpoint update i starts from (i-1): iteration j
      // samples from checkpoint j-1-k, or 0 while there is none that old.
      const policyOf = (j: number) => Math.max(0, j - 1 - k);
      for (let i = 1; i <= 6; i++) {
        assert.equal((only(calls, 'updatePolicy', i).input as UpdateInput).policy.iteration, i - 1);
        const protect = (only(calls, 'commitCheckpoint', i).input as CheckpointInput).protectIterations ?? [];
        // every rollout still to be updated on keeps its checkpoint
        for (let j = i; j <= Math.min(6, i + k); j++)
          assert.ok(
            protect.includes(policyOf(j)),
            `commit ${i} keeps checkpoint ${policyOf(j)} (rollout ${j})`,
          );
        const rollouts = of(calls, 'rolloutShard', i);
        assert.deepEqual(
          rollouts.map((c) => `${c.shard}:${c.outcome}`).sort(),
          ['0:ok', '1:ok'],
          `iteration ${i}`,
        );
        for (const r of rollouts)
          assert.equal((r.input as RolloutShardInput).policy.iteration, policyOf(i), `rollout ${i} policy`);
      }
      const state = await status(t.client.workflow.getHandle<typeof campaign>(handle.workflowId));
      assert.deepEqual(state.carriedRollouts, []);
      assert.deepEqual(
        state.recentIterations.map((r) => [r.iteration, r.policyIteration]),
        [1, 2, 3, 4, 5, 6].map((i) => [i, policyOf(i)]),
      );

      const runs = await runsOf(handle);
      assert.equal(runs.length, 3, 'iterations 1-2, 3-4, 5-6');
      // Each run carries the k phases (fewer near the end) finished ahead of their updates.
      assert.deepEqual(
        runs.map((r) => (r.input.state?.carriedRollouts ?? []).map((c) => [c.iteration, c.policy.iteration])),
        [
          [],
          [
            [3, 0],
            [4, 0],
            [5, 1],
          ],
          [
            [5, 1],
            [6, 2],
          ],
        ],
      );
      assert.deepEqual(
        runs.map((r) =>
          r.activities
            .filter((a) => a.activity === 'rolloutShard')
            .map((a) => a.iteration)
            .sort((a, b) => a - b),
        ),
        [[1, 1, 2, 2, 3, 3, 4, 4, 5, 5], [6, 6], []],
      );
      // The pipeline fills at once: rollouts 2 to 1+k are scheduled beside rollout 1, before
      // update 1 is.
      const first = runs[0]!.activities;
      const update1 = first.find((a) => a.activity === 'updatePolicy' && a.iteration === 1)!;
      for (let j = 2; j <= 1 + k; j++)
        for (const r of first.filter((a) => a.activity === 'rolloutShard' && a.iteration === j))
          assert.ok(r.eventId < update1.eventId, `rollout ${j} is scheduled before update 1`);
      for (const [n, { run }] of runs.entries()) await maybeRecordHistory(run, `staleness-3-run-${n + 1}`);
    });
  });

  test("moerl set staleness deepens the pipeline from the next iteration; one past the spec's keepLast is refused", async () => {
    const { activities, calls, release, started } = createRecordingTestActivities({
      holdWhen: (c) => c.activity === 'updatePolicy' && c.iteration === 2,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = testSpec({ iterations: 6, staleness: 0, retention: { keepLast: 3, keepBest: false } });
      const handle = await startCampaign(t.client, spec, queues);
      await started('updatePolicy', 2, slow);
      await assert.rejects(
        handle.executeUpdate(setHyperparametersUpdate, { args: [{ changes: { staleness: 3 } }] }),
        (err: unknown) =>
          err instanceof WorkflowUpdateFailedError &&
          /staleness 3: the spec's retention\.keepLast: keepLast \(3\) must be at least 4/.test(
            String(err.cause?.message),
          ),
      );
      const change = await handle.executeUpdate(setHyperparametersUpdate, {
        args: [{ changes: { staleness: 2 }, reason: 'rollouts are the bottleneck' }],
      });
      assert.deepEqual(change.changes, { staleness: 2 });
      release('updatePolicy', 2);
      const result = await handle.result();
      assert.equal(result.committedIteration, 6);
      // On-policy through iteration 2; from 3 on, rollouts run up to 2 iterations ahead: 3 to 5
      // start from checkpoint 2 as soon as it is committed, 6 from checkpoint 3.
      const expected = [0, 1, 2, 2, 2, 3];
      for (let i = 1; i <= 6; i++) {
        for (const r of of(calls, 'rolloutShard', i))
          assert.equal(
            (r.input as RolloutShardInput).policy.iteration,
            expected[i - 1],
            `rollout ${i} policy`,
          );
        assert.equal((only(calls, 'updatePolicy', i).input as UpdateInput).policy.iteration, i - 1);
        assert.equal(
          'staleness' in (only(calls, 'updatePolicy', i).input as UpdateInput).hyperparameters,
          false,
        );
      }
      const state = await status(handle);
      assert.equal(state.staleness, 2);
      assert.deepEqual(
        state.hyperparameterChanges.map((c) => [c.iteration, c.changes, c.reason]),
        [[3, { staleness: 2 }, 'rollouts are the bottleneck']],
      );
      await maybeRecordHistory(handle, 'set-staleness');
    });
  });

  test('cancel while a rollout runs keeps the last committed checkpoint', async () => {
    const { activities, calls, started } = createRecordingTestActivities({
      holdWhen: (c) => c.activity === 'rolloutShard' && c.iteration === 2, // until cancelled
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 3 }), queues);
      await started('rolloutShard', 2, slow);
      await handle.cancel();
      await assert.rejects(handle.result(), isCancelled);
      assert.equal((await handle.describe()).status.name, 'CANCELLED');
      const state = await status(handle);
      assert.equal(state.status, 'cancelled');
      assert.deepEqual(state.activeStages, []);
      assert.equal(state.committedIteration, 1);
      assert.equal(state.latestCheckpoint?.iteration, 1);
      assert.equal(of(calls, 'computeRewards', 2).length, 0, 'the interrupted rollout is never rewarded');
      assert.equal(of(calls, 'commitCheckpoint', 2).length, 0);
      assert.equal((await handle.describe()).typedSearchAttributes.get(campaignStatusKey), 'cancelled');
      await waitFor(
        'rollout activities of iteration 2 to end',
        async () => (of(calls, 'rolloutShard', 2).every((c) => c.endedAt !== undefined) ? true : undefined),
        slow,
      );
      await maybeRecordHistory(handle, 'cancel-running');
    });
  });

  test('cancel while paused before the commit of a finished update takes effect within seconds', async () => {
    const { activities, calls, release, started } = createRecordingTestActivities({
      holdWhen: (c) => c.activity === 'updatePolicy' && c.iteration === 1,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 2 }), queues);
      await started('updatePolicy', 1, slow);
      await handle.signal('pause', { reason: 'inspecting the update' });
      release('updatePolicy', 1);
      // The update finishes; its commit (not cancellable, so never cut in half) waits at the
      // pause boundary.
      const paused = await waitForState(handle, 'paused', (s) => s.status === 'paused', slow);
      assert.equal(paused.pauseReason, 'inspecting the update');
      assert.equal(only(calls, 'updatePolicy', 1).outcome, 'ok');
      assert.equal(of(calls, 'commitCheckpoint', 1).length, 0, 'paused before the commit');

      await handle.cancel();
      await within(
        10_000,
        'the cancelled paused campaign closing',
        assert.rejects(handle.result(), isCancelled),
      );
      assert.equal((await handle.describe()).status.name, 'CANCELLED');
      const state = await status(handle);
      assert.equal(state.status, 'cancelled');
      assert.equal(state.latestCheckpoint?.iteration, 0);
      assert.equal(of(calls, 'commitCheckpoint', 1).length, 0, 'a cancelled campaign commits nothing more');
      assert.equal((await handle.describe()).typedSearchAttributes.get(campaignStatusKey), 'cancelled');
      await maybeRecordHistory(handle, 'cancel-paused');
    });
  });

  test('a rollout shard lost once is retried by the server (attempt 2) without pausing', async () => {
    const { activities, calls } = createRecordingTestActivities({
      failWhen: (c) =>
        c.activity === 'rolloutShard' && c.iteration === 1 && c.shard === 1 && c.attempt === 1
          ? new Error('rollout worker lost')
          : undefined,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 2 }), queues);
      const result = await handle.result();
      assert.equal(result.committedIteration, 2);
      assert.deepEqual(
        of(calls, 'rolloutShard', 1)
          .filter((c) => c.shard === 1)
          .map((c) => [c.attempt, c.outcome]),
        [
          [1, 'failed'],
          [2, 'ok'],
        ],
      );
      assert.equal(of(calls, 'rolloutShard', 1).filter((c) => c.shard === 0).length, 1);
      const state = await status(handle);
      assert.equal(state.retries.rollout, 1);
      assert.equal(state.lastFailure, null, 'a retried failure is not a stage failure');
      assert.deepEqual(
        state.recentIterations.map((r) => r.attempts.rollout),
        [2, 1],
      );
      const history = await handle.fetchHistory();
      const retried = (history.events ?? []).filter(
        (e) => (e.activityTaskStartedEventAttributes?.attempt ?? 0) > 1,
      );
      assert.equal(retried.length, 1, 'the history holds the retried attempt');
      assert.match(retried[0]!.activityTaskStartedEventAttributes?.lastFailure?.message ?? '', /worker lost/);
      await maybeRecordHistory(handle, 'rollout-retry');
    });
  });
});
