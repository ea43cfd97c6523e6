// Validation every N iterations, as the campaign workflow schedules it on the real Temporal dev
// server, with recording test activities: which checkpoints are validated, that retention keeps
// a checkpoint while its validation runs, that continue-as-new waits for validations in flight,
// and that the scores reach the state, `moerl status` and the history.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { WorkflowExecutionDescription } from '@temporalio/client';
import type { CheckpointInput, ScoreValidationInput, ValidationShardInput } from '../../activities/types.js';
import { statusText } from '../../cli/commands/status.js';
import { readCampaignHistory } from '../../cli/history.js';
import { parseCampaignSpec } from '../../workflows/spec.js';
import type { CampaignState } from '../../workflows/types.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import type { RecordedCall } from '../support/recording-activities.js';
import { startCampaign, withWorkers } from '../support/campaign-harness.js';
import { hfSpecDoc } from '../support/spec-docs.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

let t: TestEnvironment;
before(async () => {
  t = await startTestEnvironment();
});
after(async () => {
  await t?.teardown();
});

const datasets = {
  train: { sha256: 'a'.repeat(64), bytes: 100, rows: 10 },
  validation: { sha256: 'b'.repeat(64), bytes: 50, rows: 5 },
};

function validationSpec(extra: Record<string, unknown> = {}) {
  const doc = hfSpecDoc();
  return parseCampaignSpec({
    ...doc,
    task: {
      dataset: {
        ...((doc.task as { dataset: object }).dataset as object),
        validation: 'datasets/arith/validation.parquet',
      },
    },
    iterations: 5,
    promptsPerIteration: 4,
    rolloutShards: 2,
    chunkSize: 2,
    validation: { everyIterations: 2, shards: 2, samples: 3 },
    orchestration: { rolloutHeartbeatSeconds: 5, updateHeartbeatSeconds: 5 },
    ...extra,
  });
}

const ok = (calls: RecordedCall[], activity: RecordedCall['activity']) =>
  calls.filter((c) => c.activity === activity && c.outcome === 'ok');

describe('validation every N iterations (recording activities on the dev server)', () => {
  test('checkpoints 0, every 2nd and the last are validated over their shards; scores reach state, status and history', async () => {
    const { activities, calls } = createRecordingTestActivities({ datasets });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, validationSpec(), queues);
      const result = await handle.result();
      assert.equal(result.status, 'completed');
      const scored = ok(calls, 'scoreValidation').map((c) => c.iteration);
      assert.deepEqual(scored, [0, 2, 4, 5]);
      for (const iteration of scored) {
        const shards = ok(calls, 'validationShard').filter((c) => c.iteration === iteration);
        const inputs = shards.map((c) => c.input as ValidationShardInput).sort((a, b) => a.shard - b.shard);
        // 5 rows over 2 shards: [0, 3) and [3, 5), each from the checkpoint it validates.
        assert.deepEqual(
          inputs.map((i) => [i.promptStart, i.promptCount, i.policy.iteration]),
          [
            [0, 3, iteration],
            [3, 2, iteration],
          ],
        );
        assert.equal(inputs[0]!.validation.samples, 3);
        assert.deepEqual(inputs[0]!.dataset, datasets.validation);
        const score = ok(calls, 'scoreValidation').find((c) => c.iteration === iteration)!;
        assert.deepEqual((score.input as ScoreValidationInput).chunksPerShard, [2, 1]);
        assert.ok(Math.max(...shards.map((s) => s.endedAt!)) <= score.startedAt, 'scored after generating');
      }
      const state = await handle.query<CampaignState>('status');
      assert.deepEqual(
        state.validations?.map((v) => [v.iteration, v.k, v.prompts]),
        [
          [0, 3, 5],
          [2, 3, 5],
          [4, 3, 5],
          [5, 3, 5],
        ],
      );
      assert.match(
        statusText(state, (await handle.describe()) as WorkflowExecutionDescription),
        /validation\s+checkpoint 5: mean reward 0\.350, pass@3 0\.350 over 5 prompts/,
      );
      const history = await readCampaignHistory(t.client, handle.workflowId);
      const rewardOf = (i: number) => Math.min(1, 0.1 + 0.05 * i); // recording activities' default
      assert.deepEqual(
        history.iterations
          .filter((it) => it.validation)
          .map((it) => [it.iteration, it.validation?.meanReward]),
        scored.map((i) => [i, rewardOf(i)]),
      );
      assert.ok(history.iterations.find((it) => it.iteration === 2)?.stages.validation, 'a validation stage');
    });
  });

  test('retention keeps a checkpoint while its validation runs; continue-as-new waits for it', async () => {
    const { activities, calls } = createRecordingTestActivities({
      datasets,
      delayMs: { validationShard: 1500 },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = validationSpec({
        iterations: 4,
        retention: { keepLast: 1, keepBest: false },
        orchestration: { rolloutHeartbeatSeconds: 5, updateHeartbeatSeconds: 5, continueAsNewEvery: 3 },
      });
      const handle = await startCampaign(t.client, spec, queues);
      const result = await handle.result();
      assert.equal(result.status, 'completed');
      // Checkpoint 2's validation outlasts iteration 3's rollout and update: the commit of
      // checkpoint 3 (keepLast 1) must keep checkpoint 2 while it runs.
      const commit3 = ok(calls, 'commitCheckpoint').find((c) => c.iteration === 3)!;
      const scoring2 = ok(calls, 'scoreValidation').find((c) => c.iteration === 2)!;
      assert.ok(commit3.startedAt < scoring2.endedAt!, 'the validation of 2 was still running at commit 3');
      assert.ok((commit3.input as CheckpointInput).protectIterations?.includes(2));
      // Continued as new after iteration 3: only once checkpoint 2's validation was scored.
      const runs = (await readCampaignHistory(t.client, handle.workflowId)).runSpans;
      assert.equal(runs.length, 2);
      assert.ok(Date.parse(runs[0]!.lastEventAt) >= scoring2.endedAt!, 'run 1 ended after the score');
      assert.deepEqual(
        ok(calls, 'scoreValidation').map((c) => c.iteration),
        [0, 2, 4],
      );
      const state = await handle.query<CampaignState>('status');
      assert.deepEqual(
        state.validations?.map((v) => v.iteration),
        [0, 2, 4],
        'validations carried across continue-as-new',
      );
    });
  });
});
