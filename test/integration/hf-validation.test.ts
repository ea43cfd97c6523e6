// Validation of a Hugging Face campaign's checkpoints on the real data plane: a tiny Qwen3-MoE
// (test/reference/hf_models.py), verl-schema Parquet train and validation files, the user's
// reward function in the sandbox. Checked against the stored completions, recomputed here: each
// validated checkpoint's prompts are the validation rows rendered by the chat template, k samples
// each, and the mean reward and pass@k per data_source that the state, the history, the worker's
// metrics and scores.json report are exactly the function's scores of those completions.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { loadTokenizer } from '../../activities/models/tokenizer.js';
import { openStore } from '../../activities/store/index.js';
import type { ValidationOutput, ValidationScores } from '../../activities/types.js';
import { readCampaignHistory } from '../../cli/history.js';
import { createWorkerMetrics } from '../../workers/metrics.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, withWorkers } from '../support/campaign-harness.js';
import { arithmeticRow, writeVerlParquet } from '../support/dataset-fixtures.js';
import {
  expectedUserScore,
  hfCampaignSpec,
  writeHfCampaignFixture,
} from '../support/hf-campaign-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { pythonReference } from '../support/python-reference.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const pyref = pythonReference();
const native = nativeTools(['moe_train', 'moe_generate']);

// The fixture's function scores every row here: passing (> 0.5) for some texts of each source.
const expectedScore = (source: string, text: string) =>
  expectedUserScore(text) + (source === 'arith' ? 0.5 : 0);

const validationRows = Array.from({ length: 6 }, (_, i) => arithmeticRow(100 + i, 'validation'));

describe('validation of a Hugging Face campaign', { skip: pyref.skip || native.skip }, () => {
  let t: TestEnvironment;
  let dir: string;

  before(async () => {
    t = await startTestEnvironment();
    dir = mkdtempSync(join(tmpdir(), 'moerl-hf-validation-'));
    await writeHfCampaignFixture(dir, pyref);
    writeVerlParquet(join(dir, 'store', 'datasets', 'validation.parquet'), validationRows, 4);
  });
  after(async () => {
    await t?.teardown();
    rmSync(dir, { recursive: true, force: true });
  });

  test('checkpoints 0, 2 and 3 scored on the first 5 rows, k = 2, per data_source, as the completions say', async () => {
    const spec = hfCampaignSpec(dir, 'hf-validation', {
      task: {
        dataset: {
          train: 'datasets/train.parquet',
          validation: 'datasets/validation.parquet',
          format: 'parquet',
        },
      },
      rewards: { default: { kind: 'python', file: join(dir, 'score.py') } },
      validation: {
        everyIterations: 2,
        samples: 2,
        temperature: 0.8,
        maxNewTokens: 12,
        maxPrompts: 5,
        shards: 2,
      },
      iterations: 3,
      promptsPerIteration: 4,
      chunkSize: 2,
      hyperparameters: { maxNewTokens: 8, minibatches: 1, epochs: 1 },
      orchestration: { continueAsNewEvery: 2, rolloutHeartbeatSeconds: 5 },
    });
    const metrics = createWorkerMetrics();
    const activities = metrics.instrument(
      createActivities(workerActivityDeps(new AbortController().signal, process.env)),
    );
    const { id, state } = await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, spec, queues);
      await handle.result();
      return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
    });
    assert.equal(state.status, 'completed');
    assert.equal(state.validationDataset?.rows, 6);
    assert.deepEqual(
      state.validations?.map((v) => v.iteration),
      [0, 2, 3],
    );

    const store = openStore({ kind: 'fs', path: join(dir, 'store') });
    const tokenizer = await loadTokenizer(join(dir, 'qwen3'));
    const history = await readCampaignHistory(t.client, id);
    for (const iteration of [0, 2, 3]) {
      // Recompute the scores from the stored completions: shard 0 has rows 0-2, shard 1 rows 3-4.
      const samples: { row: number; text: string }[] = [];
      for (const [shard, rows] of [
        [0, [0, 1, 2]],
        [1, [3, 4]],
      ] as const)
        for (let chunk = 0; chunk * spec.chunkSize < rows.length; chunk++) {
          const key = keys.validationChunkKey(id, iteration, shard, chunk);
          const lines = (await store.get(key)).toString('utf8').split('\n').filter(Boolean);
          for (const line of lines) {
            const r = JSON.parse(line) as {
              prompt_id: number;
              prompt_tokens: number[];
              tokens: number[];
              text: string;
              iteration: number;
            };
            assert.ok(
              rows.some((row) => row === r.prompt_id),
              `${key}: prompt ${r.prompt_id}`,
            );
            assert.equal(r.iteration, iteration);
            assert.ok(r.tokens.length <= 12, 'the validation maxNewTokens');
            const rendered = tokenizer.renderChat(
              validationRows[r.prompt_id]!.prompt.map((m) => ({ ...m })),
              { addGenerationPrompt: true },
            );
            assert.deepEqual(r.prompt_tokens, rendered.ids, `${key}: the row rendered by the template`);
            assert.equal(r.text, tokenizer.decode(r.tokens, { skipSpecialTokens: true }));
            samples.push({ row: r.prompt_id, text: r.text });
          }
        }
      assert.equal(samples.length, 5 * 2, 'five prompts, two samples each');
      const scoresOf = (rows: number[]) => {
        const mine = samples.filter((s) => rows.includes(s.row));
        const score = (s: { row: number; text: string }) =>
          expectedScore(validationRows[s.row]!.data_source, s.text);
        return {
          prompts: rows.length,
          meanReward: mine.reduce((sum, s) => sum + score(s), 0) / mine.length,
          passAtK:
            rows.filter((row) => mine.some((s) => s.row === row && score(s) > 0.5)).length / rows.length,
        };
      };
      const rowsOf = (source: string) =>
        [0, 1, 2, 3, 4].filter((row) => validationRows[row]!.data_source === source);
      const expected = {
        iteration,
        k: 2,
        ...scoresOf([0, 1, 2, 3, 4]),
        bySource: { arith: scoresOf(rowsOf('arith')), 'arith/hard': scoresOf(rowsOf('arith/hard')) },
      };
      const close = (
        actual: ValidationOutput | Omit<ValidationOutput, 'attempt'> | undefined | null,
        what: string,
      ) => {
        assert.ok(actual, what);
        assert.equal(actual.prompts, expected.prompts, what);
        assert.ok(Math.abs(actual.meanReward - expected.meanReward) < 1e-12, `${what}: mean reward`);
        assert.equal(actual.passAtK, expected.passAtK, `${what}: pass@k`);
        assert.deepEqual(Object.keys(actual.bySource).sort(), ['arith', 'arith/hard']);
        for (const [source, want] of Object.entries(expected.bySource)) {
          const got: ValidationScores = actual.bySource[source]!;
          assert.equal(got.prompts, want.prompts, `${what} ${source}`);
          assert.ok(Math.abs(got.meanReward - want.meanReward) < 1e-12, `${what} ${source}: mean reward`);
          assert.equal(got.passAtK, want.passAtK, `${what} ${source}: pass@k`);
        }
      };
      close(
        state.validations?.find((v) => v.iteration === iteration),
        `state, checkpoint ${iteration}`,
      );
      close(
        history.iterations.find((it) => it.iteration === iteration)?.validation,
        `history, checkpoint ${iteration}`,
      );
      const stored = JSON.parse(
        (await store.get(keys.validationScoresKey(id, iteration))).toString('utf8'),
      ) as ValidationOutput;
      close(stored, `scores.json, checkpoint ${iteration}`);
      if (iteration === 3) {
        const gauge = async (name: string, source: string) =>
          (await metrics.registry.getSingleMetric(name)!.get()).values.find(
            (v) => v.labels.campaign === id && v.labels.data_source === source,
          )?.value;
        assert.equal(await gauge('moerl_validation_pass_at_k', ''), expected.passAtK);
        assert.equal(
          await gauge('moerl_validation_pass_at_k', 'arith/hard'),
          expected.bySource['arith/hard'].passAtK,
        );
        assert.ok(
          Math.abs(
            (await gauge('moerl_validation_mean_reward', 'arith'))! - expected.bySource.arith.meanReward,
          ) < 1e-12,
        );
      }
    }
  });
});
