// Campaigns on a Hugging Face model and a dataset of the user's own, end to end on the real data
// plane: a tiny Qwen3-MoE folder made by transformers (test/reference/hf_models.py) in the store,
// verl-schema Parquet prompts, rewards by data_source (a Python function of the user's in the
// sandbox, and a built-in verifier), EP 2 trainer ranks each importing only their own tensors,
// continue-as-new after every iteration and an epoch that rolls over mid-iteration. Checked: the
// prompts are the dataset's rows in the order (seed, epoch) draws them, rendered with the model's
// chat template; completions are decoded; rewards are the functions' own; a Spot interruption of
// the rollout worker changes not one byte of the rollouts; bad folders and datasets pause the
// campaign naming the file.
import assert from 'node:assert/strict';
import { cp, rm, writeFile } from 'node:fs/promises';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import {
  advancePosition,
  drawPrompts,
  iterationPosition,
  startPosition,
} from '../../activities/datasets/index.js';
import { committedCheckpoint } from '../../activities/checkpoints.js';
import * as keys from '../../activities/layout.js';
import { exportCheckpoint } from '../../activities/models/export.js';
import { loadTokenizer } from '../../activities/models/tokenizer.js';
import { openStore } from '../../activities/store/index.js';
import type { CampaignState } from '../../workflows/types.js';
import {
  artifacts,
  exited,
  rolloutChunksStored,
  spawnRolloutWorker,
  startCampaign,
  uniqueTaskQueues,
  waitFor,
  waitForState,
  withWorkers,
} from '../support/campaign-harness.js';
import { arithmeticRow, writeVerlParquet } from '../support/dataset-fixtures.js';
import {
  expectedUserScore,
  hfCampaignRows as rows,
  hfCampaignSpec,
  writeHfCampaignFixture,
} from '../support/hf-campaign-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { pythonReference } from '../support/python-reference.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import type { TestEnvironment } from '../support/temporal.js';

const pyref = pythonReference();
const native = nativeTools(['moe_train', 'moe_generate']);

describe('campaigns on a Hugging Face model and a dataset', { skip: pyref.skip || native.skip }, () => {
  let t: TestEnvironment;
  let dir: string;
  let store: ReturnType<typeof openStore>;
  const activities = () => createActivities(workerActivityDeps(new AbortController().signal, process.env));

  before(async () => {
    t = await startTestEnvironment();
    dir = mkdtempSync(join(tmpdir(), 'moerl-hf-campaign-'));
    store = openStore({ kind: 'fs', path: join(dir, 'store') });
    await writeHfCampaignFixture(dir, pyref);
  });
  after(async () => {
    await t?.teardown();
    rmSync(dir, { recursive: true, force: true });
  });

  // 2 iterations × 8 prompts of 10 rows: iteration 2 rolls over into epoch 1.
  const spec = (name: string, overrides: Parameters<typeof hfCampaignSpec>[2] = {}) =>
    hfCampaignSpec(dir, name, overrides);

  let reference: string;

  test('trains EP 2 from the folder: rows drawn by (seed, epoch), the chat template, decoded text, rewards by data_source', async () => {
    const s = spec('hf-ref', { export: { to: 'exports/hf-ref' } });
    const { id, state } = await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      await handle.result();
      return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
    });
    reference = id;
    assert.equal(state.status, 'completed');
    assert.equal(state.committedIteration, 2);
    assert.ok(state.runs >= 2, `continued as new (runs ${state.runs})`);
    assert.equal(state.dataset?.rows, rows);
    assert.match(state.dataset?.sha256 ?? '', /^[0-9a-f]{64}$/);

    // The model's files beside its weights, copied once; the checkpoint is one of 2 EP ranks.
    for (const name of ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'generation_config.json'])
      assert.ok(await store.head(`${keys.modelPrefix(id)}/${name}`), `${name} in the campaign's model/`);
    const manifest = JSON.parse(
      (await store.get(`${keys.checkpointKey(id, 2)}/manifest.json`)).toString('utf8'),
    ) as { world_size: number };
    assert.equal(manifest.world_size, 2);

    // The spec's export: every committed checkpoint as a model folder, config.json last.
    for (const iteration of [1, 2]) {
      const folder = `exports/hf-ref/${String(iteration).padStart(6, '0')}`;
      const names: string[] = [];
      for await (const o of store.list(`${folder}/`)) names.push(o.key.slice(folder.length + 1));
      for (const name of ['config.json', 'model.safetensors', 'tokenizer.json', 'generation_config.json'])
        assert.ok(names.includes(name), `${folder}/${name} in ${names.join(', ')}`);
    }

    const tokenizer = await loadTokenizer(join(dir, 'qwen3'));
    const found = await artifacts(store, id);
    for (const iteration of [1, 2]) {
      const drawn = drawPrompts(
        { seed: s.seed, rows },
        iterationPosition(iteration, s.promptsPerIteration, rows),
        s.promptsPerIteration,
      ).prompts;
      if (iteration === 2) assert.deepEqual(new Set(drawn.map((p) => p.epoch)), new Set([0, 1]));
      const records = [...found]
        .filter(([k]) => k.startsWith(`rollouts/${String(iteration).padStart(6, '0')}/`))
        .flatMap(([, text]) => text.split('\n').filter(Boolean))
        .map(
          (l) =>
            JSON.parse(l) as {
              prompt_id: number;
              prompt: string;
              prompt_tokens: number[];
              tokens: number[];
              text: string;
            },
        );
      assert.equal(records.length, s.promptsPerIteration * s.groupSize);
      const rewards = new Map<string, number>();
      for (const [k, text] of found)
        if (k.startsWith(`rewards/${String(iteration).padStart(6, '0')}/`))
          for (const l of text.split('\n').filter(Boolean)) {
            const r = JSON.parse(l) as { prompt_id: number; sample_index: number; reward: number };
            rewards.set(`${r.prompt_id}/${r.sample_index}`, r.reward);
          }
      for (const r of records) {
        const index = r.prompt_id - (iteration - 1) * s.promptsPerIteration;
        const row = arithmeticRow(drawn[index]!.row);
        const rendered = tokenizer.renderChat(row.prompt, { addGenerationPrompt: true });
        assert.equal(r.prompt, rendered.text, `prompt ${r.prompt_id} is its row's, in the chat template`);
        assert.deepEqual(r.prompt_tokens, rendered.ids);
        assert.equal(r.text, tokenizer.decode(r.tokens, { skipSpecialTokens: true }));
        const reward = [...rewards].find(([k]) => k.startsWith(`${r.prompt_id}/`));
        assert.ok(reward, `prompt ${r.prompt_id} has rewards`);
      }
      for (const r of records) {
        const row = arithmeticRow(drawn[r.prompt_id - (iteration - 1) * s.promptsPerIteration]!.row);
        const got = [...rewards].filter(([k]) => k.startsWith(`${r.prompt_id}/`)).map(([, v]) => v);
        const want =
          row.data_source === 'arith'
            ? expectedUserScore(r.text) + 0.5
            : r.text.trim() === row.reward_model.ground_truth
              ? 1
              : 0;
        assert.ok(
          got.includes(want),
          `prompt ${r.prompt_id} (${row.data_source}): ${want} in ${got.join(', ')}`,
        );
      }
    }
  });

  test("dynamic sampling draws the iteration's reserve: rows at the reserve's stream position, scored and trained on", async (t2) => {
    const s = spec('hf-dynamic', {
      iterations: 1,
      algorithm: { loss: 'dapo', dynamicSampling: { maxRounds: 2, promptsPerRound: 4 } },
    });
    const { id, state } = await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      await handle.result();
      return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
    });
    assert.equal(state.status, 'completed');
    const sampling = state.recentIterations[0]?.dynamicSampling;
    t2.diagnostic(`dynamic sampling: ${JSON.stringify(sampling)}`);
    assert.ok(sampling && sampling.rounds >= 1, `a further draw was made: ${JSON.stringify(sampling)}`);
    assert.equal(sampling.drawnPrompts, 4 * sampling.rounds);
    const reserveFirst = 2 ** 44 + 2 ** 24; // iteration 1's reserve
    const drawn = drawPrompts(
      { seed: s.seed, rows },
      advancePosition(startPosition, reserveFirst, rows),
      sampling.drawnPrompts,
    ).prompts;
    const tokenizer = await loadTokenizer(join(dir, 'qwen3'));
    const found = await artifacts(store, id);
    const records = [...found]
      .filter(([k]) => k.startsWith('rollouts/000001/'))
      .flatMap(([, text]) => text.split('\n').filter(Boolean))
      .map((l) => JSON.parse(l) as { prompt_id: number; prompt: string })
      .filter((r) => r.prompt_id >= reserveFirst);
    assert.equal(records.length, sampling.drawnPrompts * s.groupSize);
    for (const r of records) {
      const row = arithmeticRow(drawn[r.prompt_id - reserveFirst]!.row);
      assert.equal(r.prompt, tokenizer.renderChat(row.prompt, { addGenerationPrompt: true }).text);
    }
    const rewarded = [...found].filter(([k]) => k.startsWith('rewards/000001/')).length;
    assert.equal(rewarded, 2 + 2 * sampling.rounds, 'a rewards file per shard, the draws included');
    const metrics = JSON.parse((await store.get(keys.metricsKey(id, 1))).toString('utf8')) as {
      steps: { groups: number; skipped_groups: number }[];
    };
    assert.equal(metrics.steps[0]!.groups, 8 + sampling.drawnPrompts, 'the update read every draw');
    assert.equal(metrics.steps[0]!.skipped_groups, sampling.filteredGroups);
  });

  test("its checkpoint exports for transformers, which scores iteration 2's samples as the rollout engine did", async () => {
    // Iteration 2 sampled from checkpoint 1: exported, transformers must give its tokens the
    // log-probs moe_generate recorded (temperature 1, top-p 1: the policy's own distribution).
    const out = join(dir, 'export-1');
    await exportCheckpoint({
      store,
      campaignId: reference,
      iteration: 1,
      target: { kind: 'dir', path: out },
    });
    const records = [...(await artifacts(store, reference))]
      .filter(([k]) => k.startsWith('rollouts/000002/'))
      .flatMap(([, text]) => text.split('\n').filter(Boolean))
      .map((l) => JSON.parse(l) as { prompt_tokens: number[]; tokens: number[]; logprobs: number[] })
      .slice(0, 4);
    const sequences = join(dir, 'sequences.jsonl');
    await writeFile(
      sequences,
      records.map((r) => JSON.stringify({ tokens: [...r.prompt_tokens, ...r.tokens] }) + '\n').join(''),
    );
    const theirs = (await pyref.run('hf_models.py', ['score', out, sequences]))
      .split('\n')
      .filter(Boolean)
      .map((l) => (JSON.parse(l) as { logprobs: number[] }).logprobs);
    let worst = 0;
    records.forEach((r, i) => {
      const completion = theirs[i]!.slice(-r.tokens.length);
      r.logprobs.forEach((lp, t) => (worst = Math.max(worst, Math.abs(lp - completion[t]!))));
    });
    assert.ok(worst <= 1e-4, `max |rollout log-prob - transformers'| = ${worst}`);
  });

  test("a fork from checkpoint 1 continues the parent's dataset position: its iteration 2 is the parent's, byte for byte", async () => {
    const parent = await committedCheckpoint(store, reference, 1);
    assert.ok(parent);
    const id = await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, spec('hf-fork'), queues, { forkFrom: parent.ref });
      await handle.result();
      return handle.workflowId;
    });
    const [want, got] = [await artifacts(store, reference), await artifacts(store, id)];
    const iteration2 = [...want].filter(([k]) => k.includes('/000002/'));
    assert.ok(iteration2.length > 0);
    for (const [key, text] of iteration2) assert.equal(got.get(key), text, `${key} as the parent's`);
    assert.equal(
      (await store.get(`${keys.modelPrefix(id)}/tokenizer.json`)).toString(),
      (await store.get(`${keys.modelPrefix(reference)}/tokenizer.json`)).toString(),
    );
  });

  test('a Spot interruption of the rollout worker mid-rollout changes not one byte', async () => {
    const s = spec('hf-spot');
    const queues = uniqueTaskQueues();
    const env = { ...process.env, MOERL_ROLLOUT_RANKS: '2' };
    let name = 0;
    const start = () => spawnRolloutWorker({ address: t.address, queues, dir, name: `hf-${name++}`, env });
    const id = await withWorkers(
      t.nativeConnection,
      t.namespace,
      activities(),
      async () => {
        let worker = start();
        try {
          const handle = await startCampaign(t.client, s, queues);
          await waitFor(
            'iteration 1 rollout under way',
            async () => ((await rolloutChunksStored(store, handle.workflowId, 1)) >= 1 ? true : undefined),
            120_000,
            10,
          );
          process.kill(-worker.pid!, 'SIGKILL');
          await exited(worker);
          worker = start();
          await handle.result();
          return handle.workflowId;
        } finally {
          if (worker.exitCode === null) process.kill(-worker.pid!, 'SIGKILL');
          await exited(worker);
        }
      },
      queues,
      ['control', 'train'],
    );
    const [want, got] = [await artifacts(store, reference), await artifacts(store, id)];
    assert.equal(got.size, want.size);
    for (const [key, text] of want) assert.equal(got.get(key), text, `${key} as the uninterrupted run's`);
  });

  test('a dataset file changed under the campaign pauses it at the next rollout, naming both hashes', async () => {
    const file = join(dir, 'store', 'datasets', 'changing.parquet');
    writeVerlParquet(
      file,
      Array.from({ length: rows }, (_, i) => arithmeticRow(i)),
    );
    const s = spec('hf-changed', {
      task: { dataset: { train: 'datasets/changing.parquet', format: 'parquet' } },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      // Paused once its inputs are checked: the rollout of iteration 1 has not read a row yet.
      const started = await waitForState(
        handle,
        'the dataset checked',
        (st) => st.dataset !== undefined,
        60_000,
      );
      await handle.signal('pause', { reason: 'swap the file' });
      await waitForState(handle, 'paused', (st) => st.status === 'paused', 60_000);
      writeVerlParquet(
        file,
        Array.from({ length: rows }, (_, i) => arithmeticRow(i + 1)),
      );
      await handle.signal('resume', {});
      const state = await waitForState(
        handle,
        'paused by the change',
        (st) => st.status === 'paused' && st.lastFailure !== null,
        120_000,
      );
      assert.equal(state.lastFailure?.stage, 'rollout');
      assert.match(state.lastFailure?.message ?? '', /changed under the campaign/);
      assert.ok(
        state.lastFailure?.message.includes(started.dataset!.sha256),
        'names the hash it started with',
      );
      assert.ok(state.committedIteration <= 0, 'no iteration trained on the new file');
      await handle.cancel();
    });
  });

  test('a reward function that fails on every sample pauses the campaign with its first error', async () => {
    await writeFile(
      join(dir, 'broken.py'),
      'def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    raise ValueError("no answer key here")\n',
    );
    const s = spec('hf-broken-reward', {
      iterations: 1,
      rewards: { default: { kind: 'python', file: join(dir, 'broken.py') } },
    });
    await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      const state = await waitForState(
        handle,
        'paused at the reward',
        (st) => st.status === 'paused',
        120_000,
      );
      assert.equal(state.lastFailure?.stage, 'reward');
      assert.equal(state.lastFailure?.type, 'RewardFunctionFailing');
      assert.match(
        state.lastFailure?.message ?? '',
        /broken\.py:compute_score failed on all 16 samples[\s\S]*exception: ValueError: no answer key here/,
      );
      assert.equal(state.committedIteration, 0, 'no update on rewards of zeros');
      await handle.cancel();
    });
  });

  test('a folder without its tokenizer, and a dataset row without a prompt, pause the campaign naming them', async () => {
    await cp(join(dir, 'store', 'models', 'tiny-qwen3'), join(dir, 'store', 'models', 'no-tokenizer'), {
      recursive: true,
    });
    await rm(join(dir, 'store', 'models', 'no-tokenizer', 'tokenizer.json'));
    writeVerlParquet(join(dir, 'store', 'datasets', 'bad.parquet'), [
      arithmeticRow(0),
      { ...arithmeticRow(1), prompt: undefined as never },
    ]);
    await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const cases: [CampaignSpec, RegExp][] = [
        [
          spec('hf-bad-model', { model: { huggingFace: 'models/no-tokenizer' } }),
          /no-tokenizer.*has no tokenizer\.json/,
        ],
        [
          spec('hf-bad-rows', { task: { dataset: { train: 'datasets/bad.parquet', format: 'parquet' } } }),
          /bad\.parquet[\s\S]*row 1: prompt/,
        ],
      ];
      for (const [s, reason] of cases) {
        const handle = await startCampaign(t.client, s, queues);
        const state = await waitForState(handle, `${s.name} paused`, (st) => st.status === 'paused', 60_000);
        assert.equal(state.lastFailure?.stage, 'prepare');
        assert.equal(state.lastFailure?.type, 'BadInput');
        assert.match(state.lastFailure?.message ?? '', reason);
        assert.equal(state.committedIteration, -1, 'nothing committed');
        await handle.cancel();
      }
    });
  });
});
