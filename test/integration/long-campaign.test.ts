// Regression tests of the campaign workflow for defects that bite long or large campaigns, on
// the real dev server with recording test activities (no native work).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { WorkflowFailedError } from '@temporalio/client';
import { CancelledFailure } from '@temporalio/common';
import type { CheckpointInput } from '../../activities/types.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import { startCampaign, testSpec, waitForState, withWorkers } from '../support/campaign-harness.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

let t: TestEnvironment;
before(async () => {
  t = await startTestEnvironment();
});
after(async () => {
  await t?.teardown();
});

describe('long-campaign defects (workflow)', () => {
  test('cancel of a campaign paused during an update takes effect at once and keeps the last committed checkpoint', async () => {
    const { activities, calls, release, started } = createRecordingTestActivities({
      holdWhen: (c) => c.activity === 'updatePolicy' && c.iteration === 1,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, testSpec({ iterations: 3 }), queues);
      await started('updatePolicy', 1);
      await handle.signal('pause', { reason: 'look at the update' });
      release('updatePolicy', 1);
      const paused = await waitForState(handle, 'paused after the update', (s) => s.status === 'paused');
      assert.equal(paused.committedIteration, 0, 'the update of iteration 1 is not committed while paused');
      const cancelledAt = Date.now();
      await handle.cancel();
      await assert.rejects(handle.result(), (err: unknown) => {
        assert.ok(err instanceof WorkflowFailedError && err.cause instanceof CancelledFailure, String(err));
        return true;
      });
      const tookMs = Date.now() - cancelledAt;
      assert.ok(tookMs < 10_000, `cancel took ${tookMs} ms while paused`);
      const state = await handle.query<{
        status: string;
        committedIteration: number;
        latestCheckpoint: { iteration: number };
      }>('status');
      assert.equal(state.status, 'cancelled');
      assert.equal(state.latestCheckpoint.iteration, 0, 'the last committed checkpoint is kept');
      assert.equal(
        calls.filter((c) => c.activity === 'commitCheckpoint' && c.iteration === 1).length,
        0,
        'the paused update is never committed',
      );
    });
  });

  test('a commit attempt whose worker went silent is retried within the commit heartbeat timeout', async () => {
    // The first commit attempt of iteration 1 neither heartbeats nor answers for 60 s: without a
    // heartbeat timeout the server waited out the 30-minute start-to-close limit.
    const { activities, calls } = createRecordingTestActivities({
      silentMsWhen: (c) =>
        c.activity === 'commitCheckpoint' && c.iteration === 1 && c.attempt === 1 ? 60_000 : undefined,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = testSpec({ iterations: 2, orchestration: { commitHeartbeatSeconds: 2 } });
      const handle = await startCampaign(t.client, spec, queues);
      const result = await Promise.race([
        handle.result(),
        new Promise<never>((_, reject) => {
          const timer = setTimeout(
            () => reject(new Error('the campaign waited on the silent commit')),
            40_000,
          );
          timer.unref();
        }),
      ]);
      assert.equal(result.status, 'completed');
      const commits = calls.filter((c) => c.activity === 'commitCheckpoint' && c.iteration === 1);
      assert.deepEqual(
        commits.map((c) => c.attempt),
        [1, 2],
        'the silent attempt, then its retry',
      );
    });
  });

  test('retention is told which checkpoints the one-step-off rollout still samples from', async () => {
    const { activities, calls } = createRecordingTestActivities({
      delayMs: { rolloutShard: 200, updatePolicy: 400 },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = testSpec({ iterations: 4, staleness: 1, retention: { keepLast: 2, keepBest: false } });
      const handle = await startCampaign(t.client, spec, queues);
      await handle.result();
      for (let i = 2; i <= 4; i++) {
        const commit = calls.find(
          (c) => c.activity === 'commitCheckpoint' && c.iteration === i && c.outcome === 'ok',
        );
        const protect = (commit!.input as CheckpointInput).protectIterations ?? [];
        // Update i committed checkpoint i while rollout i+1 sampled from checkpoint i-1.
        if (i < 4)
          assert.ok(protect.includes(i - 1), `commit ${i} protects ${i - 1}: [${protect.join(', ')}]`);
      }
    });
  });
});
