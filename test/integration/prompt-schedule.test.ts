// `moerl set promptsPerIteration` on a running dataset campaign, on the real Temporal dev server
// with recording test activities: each iteration's shards, prompt ids and dataset position follow
// the schedule, a change applies from the next rollout, and continue-as-new carries it on. And
// DAPO's overlong window, which follows `moerl set maxNewTokens` the same way.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { RewardInput, RolloutShardInput, UpdateInput } from '../../activities/types.js';
import { setHyperparametersUpdate } from '../../workflows/messages.js';
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

const rows = 10;
const datasets = { train: { sha256: 'a'.repeat(64), bytes: 100, rows } };

const okCalls = (calls: RecordedCall[], activity: RecordedCall['activity'], iteration: number) =>
  calls.filter((c) => c.activity === activity && c.iteration === iteration && c.outcome === 'ok');

describe('set promptsPerIteration (recording activities on the dev server)', () => {
  test('from the next rollout on: shards, prompt ids and dataset positions follow, across continue-as-new', async () => {
    const { activities, calls, release, started } = createRecordingTestActivities({
      datasets,
      holdWhen: (c) => c.activity === 'rolloutShard' && (c.iteration === 1 || c.iteration === 3),
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = parseCampaignSpec({
        ...hfSpecDoc(),
        iterations: 4,
        promptsPerIteration: 4,
        rolloutShards: 2,
        chunkSize: 2,
        orchestration: { rolloutHeartbeatSeconds: 5, updateHeartbeatSeconds: 5, continueAsNewEvery: 2 },
      });
      const handle = await startCampaign(t.client, spec, queues);
      await started('rolloutShard', 1);
      const first = await handle.executeUpdate(setHyperparametersUpdate, {
        args: [{ changes: { promptsPerIteration: 3 }, reason: 'smaller batches' }],
      });
      assert.equal(first.iteration, 2, 'iteration 1 already decided its prompts');
      release('rolloutShard', 1);
      await started('rolloutShard', 3);
      const second = await handle.executeUpdate(setHyperparametersUpdate, {
        args: [{ changes: { promptsPerIteration: 1 } }],
      });
      assert.equal(second.iteration, 4);
      release('rolloutShard', 3);
      assert.equal((await handle.result()).status, 'completed');

      // first prompt id and count per iteration: 4, then 3 and 3, then 1 (one shard).
      const expected = [
        {
          iteration: 1,
          first: 0,
          ranges: [
            [0, 2],
            [2, 2],
          ],
        },
        {
          iteration: 2,
          first: 4,
          ranges: [
            [0, 2],
            [2, 1],
          ],
        },
        {
          iteration: 3,
          first: 7,
          ranges: [
            [0, 2],
            [2, 1],
          ],
        },
        { iteration: 4, first: 10, ranges: [[0, 1]] },
      ];
      for (const { iteration, first, ranges } of expected) {
        const shards = okCalls(calls, 'rolloutShard', iteration)
          .map((c) => c.input as RolloutShardInput)
          .sort((a, b) => a.shard - b.shard);
        const count = ranges.reduce((n, [, c]) => n + c!, 0);
        assert.deepEqual(
          shards.map((s) => [s.promptStart, s.promptCount]),
          ranges,
          `iteration ${iteration}'s shards`,
        );
        for (const s of shards) {
          assert.deepEqual(s.iterationPrompts, { first, count }, `iteration ${iteration}'s prompts`);
          // A position past the 10 rows rolls over into the next epoch.
          assert.deepEqual(s.dataset?.position, { epoch: Math.floor(first / rows), offset: first % rows });
        }
        const reward = okCalls(calls, 'computeRewards', iteration)[0]!.input as RewardInput;
        assert.deepEqual(reward.iterationPrompts, { first, count });
        assert.equal(reward.chunksPerShard.length, ranges.length);
      }
      const state = await handle.query<CampaignState>('status');
      assert.ok(state.runs >= 2, 'continued as new');
      assert.deepEqual(state.promptSchedule, [
        { fromIteration: 1, promptsPerIteration: 4 },
        { fromIteration: 2, promptsPerIteration: 3 },
        { fromIteration: 4, promptsPerIteration: 1 },
      ]);
      assert.deepEqual(
        state.hyperparameterChanges.map((c) => [c.iteration, c.changes]),
        [
          [2, { promptsPerIteration: 3 }],
          [4, { promptsPerIteration: 1 }],
        ],
      );
    });
  });
});

describe("DAPO's overlong penalty (recording activities on the dev server)", () => {
  test('each reward activity gets the window of its own iteration: a set maxNewTokens moves it', async () => {
    const { activities, calls, release, started } = createRecordingTestActivities({
      datasets,
      holdWhen: (c) => c.activity === 'rolloutShard' && c.iteration === 1,
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = parseCampaignSpec({
        ...hfSpecDoc(),
        iterations: 2,
        promptsPerIteration: 2,
        rolloutShards: 1,
        chunkSize: 2,
        algorithm: { loss: 'dapo', overlong: { bufferTokens: 4, penalty: 0.5 } },
        hyperparameters: { maxNewTokens: 16 },
      });
      const handle = await startCampaign(t.client, spec, queues);
      await started('rolloutShard', 1);
      await handle.executeUpdate(setHyperparametersUpdate, { args: [{ changes: { maxNewTokens: 24 } }] });
      release('rolloutShard', 1);
      assert.equal((await handle.result()).status, 'completed');
      const overlong = [1, 2].map(
        (i) => (okCalls(calls, 'computeRewards', i)[0]!.input as RewardInput).overlong,
      );
      assert.deepEqual(overlong, [
        { maxTokens: 16, bufferTokens: 4, penalty: 0.5 },
        { maxTokens: 24, bufferTokens: 4, penalty: 0.5 },
      ]);
    });
  });
});

describe("DAPO's dynamic sampling (recording activities on the dev server)", () => {
  test('draws reserve prompts while too few groups carry signal, up to the bound, across continue-as-new', async () => {
    // the iteration's own 4 prompts give 1 group with signal; each draw of 2 reserve prompts 2
    // more in iteration 1 (full after 2 draws), none in iteration 2 (the bound of 3 draws)
    const { activities, calls } = createRecordingTestActivities({
      datasets,
      rewardExtra: (input) => {
        const count = input.iterationPrompts!.count;
        const reserve = input.firstShard !== undefined;
        return { groups: count, groupsWithSignal: !reserve ? 1 : input.iteration === 1 ? 2 : 0 };
      },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const spec = parseCampaignSpec({
        ...hfSpecDoc(),
        iterations: 2,
        promptsPerIteration: 4,
        rolloutShards: 2,
        chunkSize: 2,
        algorithm: { loss: 'dapo', dynamicSampling: { maxRounds: 3, promptsPerRound: 2 } },
        orchestration: { continueAsNewEvery: 1 },
      });
      const handle = await startCampaign(t.client, spec, queues);
      assert.equal((await handle.result()).status, 'completed');
      const reserveFirst = (iteration: number) => 2 ** 44 + iteration * 2 ** 24;
      for (const [iteration, draws] of [
        [1, 2],
        [2, 3],
      ] as const) {
        const shards = okCalls(calls, 'rolloutShard', iteration)
          .map((c) => c.input as RolloutShardInput)
          .sort((a, b) => a.shard - b.shard);
        // 2 shards of the iteration's own prompts, then 2 shards (a prompt each) per draw
        assert.deepEqual(
          shards.map((s) => [s.shard, s.iterationPrompts?.first, s.promptStart, s.promptCount]),
          [
            [0, 4 * (iteration - 1), 0, 2],
            [1, 4 * (iteration - 1), 2, 2],
            ...Array.from({ length: draws }, (_, k) => [
              [2 + 2 * k, reserveFirst(iteration) + 2 * k, 0, 1],
              [3 + 2 * k, reserveFirst(iteration) + 2 * k, 1, 1],
            ]).flat(),
          ],
          `iteration ${iteration}'s shards`,
        );
        // a reserve prompt's dataset position is where the stream would put that id
        const drawn = shards[2]!;
        assert.deepEqual(drawn.dataset?.position, {
          epoch: Math.floor(reserveFirst(iteration) / rows),
          offset: reserveFirst(iteration) % rows,
        });
        const rewards = okCalls(calls, 'computeRewards', iteration).map((c) => c.input as RewardInput);
        assert.deepEqual(
          rewards.map((r) => [r.firstShard, r.chunksPerShard.length]),
          [[undefined, 2], ...Array.from({ length: draws }, (_, k) => [2 + 2 * k, 4 + 2 * k])],
        );
        const update = okCalls(calls, 'updatePolicy', iteration)[0]!.input as UpdateInput;
        assert.equal(update.chunksPerShard.length, 2 + 2 * draws, 'the update reads every draw');
      }
      const state = await handle.query<CampaignState>('status');
      assert.deepEqual(
        state.recentIterations.map((i) => i.dynamicSampling),
        [
          { rounds: 2, drawnPrompts: 4, groupsWithSignal: 5, filteredGroups: 3 + 0 + 0 },
          { rounds: 3, drawnPrompts: 6, groupsWithSignal: 1, filteredGroups: 3 + 2 + 2 + 2 },
        ],
      );
      assert.ok(state.runs >= 2, 'continued as new');
    });
  });
});
