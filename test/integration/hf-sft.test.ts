// The SFT warm start of a campaign on a Hugging Face model and a dataset: each row's reference
// completion (task.dataset.responseKey, verl's extra_info.answer) learned before GRPO, end to end
// on the real data plane (a tiny Qwen3-MoE from test/reference/hf_models.py, verl Parquet, EP 2
// trainer ranks). Checked: the examples moe_train learns are the rows of the dataset's epoch-0
// order, the prompt rendered with the model's chat template and the completion ended with its
// eos token; the warm start's loss falls; GRPO then trains from its checkpoint; a row without a
// completion pauses the campaign before anything is trained, naming the row and the field.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import { epochPermutation } from '../../activities/datasets/index.js';
import * as keys from '../../activities/layout.js';
import { loadTokenizer } from '../../activities/models/tokenizer.js';
import { openStore } from '../../activities/store/index.js';
import type { CampaignSpec, CampaignSpecInput } from '../../workflows/spec.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, waitForState, withWorkers } from '../support/campaign-harness.js';
import { arithmeticRow, writeVerlParquet } from '../support/dataset-fixtures.js';
import {
  hfCampaignRows as rows,
  hfCampaignSpec,
  writeHfCampaignFixture,
} from '../support/hf-campaign-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { pythonReference } from '../support/python-reference.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const pyref = pythonReference();
const native = nativeTools(['moe_train', 'moe_generate']);
const sftSteps = 6;

describe('SFT warm start of a Hugging Face model on a dataset', { skip: pyref.skip || native.skip }, () => {
  let t: TestEnvironment;
  let dir: string;
  let store: ReturnType<typeof openStore>;
  const activities = () => createActivities(workerActivityDeps(new AbortController().signal, process.env));

  before(async () => {
    t = await startTestEnvironment();
    dir = mkdtempSync(join(tmpdir(), 'moerl-hf-sft-'));
    store = openStore({ kind: 'fs', path: join(dir, 'store') });
    await writeHfCampaignFixture(dir, pyref);
  });
  after(async () => {
    await t?.teardown();
    rmSync(dir, { recursive: true, force: true });
  });

  const spec = (name: string, overrides: Partial<CampaignSpecInput> = {}): CampaignSpec =>
    hfCampaignSpec(dir, name, {
      task: {
        dataset: { train: 'datasets/train.parquet', format: 'parquet', responseKey: 'extra_info.answer' },
      },
      sftWarmStartSteps: sftSteps,
      iterations: 1,
      promptsPerIteration: 4,
      rolloutShards: 1,
      chunkSize: 4,
      hyperparameters: { maxNewTokens: 16, minibatches: 1, epochs: 1 },
      ...overrides,
    });

  test("learns the rows' completions, rendered with the chat template and the eos token, then trains GRPO", async () => {
    const s = spec('hf-sft');
    const { id, state } = await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      await handle.result();
      return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
    });
    assert.equal(state.status, 'completed');
    assert.equal(state.committedIteration, 1);

    // The examples: every row (fewer than steps × batch), in the order epoch 0 draws them.
    const tokenizer = await loadTokenizer(join(dir, 'qwen3'));
    const lines = (await store.get(keys.sftExamplesKey(id)))
      .toString('utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { prompt_tokens: number[]; tokens: number[] });
    assert.ok(rows < sftSteps * s.sftWarmStartBatchSize);
    const order = [...epochPermutation({ seed: s.seed, rows }, 0)];
    assert.equal(lines.length, rows);
    for (const [k, line] of lines.entries()) {
      const row = arithmeticRow(order[k]!);
      assert.deepEqual(
        line.prompt_tokens,
        tokenizer.renderChat(row.prompt, { addGenerationPrompt: true }).ids,
        `line ${k}: row ${order[k]}'s prompt`,
      );
      assert.deepEqual(line.tokens, [...tokenizer.encode(row.extra_info.answer), tokenizer.eosTokenId]);
      assert.equal(tokenizer.decode(line.tokens, { skipSpecialTokens: true }), row.extra_info.answer);
    }
    assert.equal(tokenizer.decode([tokenizer.eosTokenId]), '<|im_end|>', "the tokenizer's own eos_token");

    // The warm start ran its steps on both ranks' experts, and its loss fell.
    const prepare = JSON.parse((await store.get(keys.metricsKey(id, 0))).toString('utf8')) as {
      steps: { loss: number }[];
    };
    const losses = prepare.steps.map((m) => m.loss);
    assert.equal(losses.length, sftSteps, losses.join(', '));
    assert.ok(
      losses.every((loss, i) => i === 0 || loss < losses[i - 1]!),
      `the loss falls at every step: ${losses.join(', ')}`,
    );
    const manifest = JSON.parse(
      (await store.get(`${keys.checkpointKey(id, 0)}/manifest.json`)).toString('utf8'),
    ) as { world_size: number };
    assert.equal(manifest.world_size, 2);
  });

  test("the spec's batch size and learning rate: steps x batch rows, the rate's warm-up to its peak", async () => {
    const s = spec('hf-sft-small', { sftWarmStartBatchSize: 1, sftWarmStartLr: 1e-4 });
    const id = await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      await handle.result();
      return handle.workflowId;
    });
    const lines = (await store.get(keys.sftExamplesKey(id))).toString('utf8').trim().split('\n');
    assert.equal(lines.length, sftSteps, 'one row a step, fewer than the dataset has');
    const prepare = JSON.parse((await store.get(keys.metricsKey(id, 0))).toString('utf8')) as {
      steps: { lr: number }[];
    };
    const lrs = prepare.steps.map((m) => m.lr);
    assert.equal(lrs.length, sftSteps);
    assert.ok(
      lrs.every((lr) => lr > 0 && lr <= 1e-4 * (1 + 1e-6)),
      `every step at or under the spec's 1e-4: ${lrs.join(', ')}`,
    );
  });

  test('a row without its completion pauses the campaign before anything is trained, naming row and field', async () => {
    writeVerlParquet(join(dir, 'store', 'datasets', 'no-answer.parquet'), [
      arithmeticRow(0),
      arithmeticRow(1),
      { ...arithmeticRow(2), extra_info: { split: 'train', index: 2 } as never },
    ]);
    const s = spec('hf-sft-no-answer', {
      task: {
        dataset: { train: 'datasets/no-answer.parquet', format: 'parquet', responseKey: 'extra_info.answer' },
      },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      const state = await waitForState(handle, 'paused', (st) => st.status === 'paused', 60_000);
      assert.equal(state.lastFailure?.stage, 'prepare');
      assert.equal(state.lastFailure?.type, 'BadInput');
      assert.match(
        state.lastFailure?.message ?? '',
        /no-answer\.parquet[\s\S]*row 2: extra_info\.answer \(task\.dataset\.responseKey\): missing/,
      );
      assert.equal(state.committedIteration, -1, 'nothing committed');
      await handle.cancel();
    });
  });
});
