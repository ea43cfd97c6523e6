// A campaign whose rollouts an OpenAI-compatible server samples (`engine.rollout: openai`): the
// tiny Hugging Face campaign of hf-campaign.test.ts on the model in the shape llama.cpp runs, its
// rollout worker supervising a real llama-server on each checkpoint converted to GGUF by
// llama.cpp's converter. Checked: with the native trainer, and with the PyTorch trainer, it
// completes 2 iterations; the server's log-probs of the sampled tokens agree with moerl's own
// scoring of the same tokens (moe_hf score on the exported checkpoint); the trainer's
// mismatch_kl is reported (with the native trainer, larger than a native/native campaign's); a
// llama-server killed mid-chunk is restarted and the chunk finished, and validation samples from
// the server too; a SIGKILLed rollout worker redoes at most one chunk per shard in flight.
// Against a fake server (a small HTTP server in the test) that answers malformed JSON, or
// completions without log-probs, the campaign pauses naming the server and the problem.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { ActivityDeps } from '../../activities/deps.js';
import { workerActivityDeps } from '../../activities/deps.js';
import { findLlamaCpp, llamaCppMissingReason } from '../../activities/engines/llamacpp.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { exportCheckpoint } from '../../activities/models/export.js';
import { openStore } from '../../activities/store/index.js';
import type { RolloutRecord } from '../../activities/rewards/rollout-record.js';
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
import { hfCampaignSpec, writeHfCampaignFixture } from '../support/hf-campaign-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { pythonReference } from '../support/python-reference.js';
import { pytorchEngine } from '../support/pytorch-engine.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const pyref = pythonReference();
const native = nativeTools(['moe_train', 'moe_generate', 'moe_hf']);
const pytorch = pytorchEngine();
const llamacpp = await findLlamaCpp();
const llamacppSkip =
  'missing' in llamacpp ? `${llamaCppMissingReason} (bash scripts/llamacpp.sh): ${llamacpp.missing}` : false;

/**
 * llama.cpp's log-probs of its sampled tokens against moerl's teacher-forced ones on the same
 * weights (F32 both sides, llama-server's log of an F32 probability against a float64 softmax):
 * measured 3.3e-6 to 3.8e-6 over the 745 tokens of both iterations' 32 samples, from run to run
 * (llama.cpp sums by the batch's shape); llamacpp-engine.test.ts's bound.
 */
const LOGPROB_TOLERANCE = 2e-5;

describe(
  'campaigns sampled by an OpenAI-compatible rollout server',
  { skip: pyref.skip || native.skip },
  () => {
    let t: TestEnvironment;
    let dir: string;
    let store: ReturnType<typeof openStore>;
    const workers: ActivityDeps[] = [];
    /** Activities of a worker with `env` on top of the test's; its rollout server closed after. */
    const activities = (env: NodeJS.ProcessEnv = {}) => {
      const deps = workerActivityDeps(new AbortController().signal, {
        ...process.env,
        ...serverEnv(),
        MOERL_CACHE_DIR: join(dir, 'cache'),
        ...env,
      });
      workers.push(deps);
      return createActivities(deps);
    };
    /** The worker's llama-server: the test tokenizer written as qwen2's (llamacpp-engine.test.ts). */
    const serverEnv = () => ({
      MOERL_PYTORCH_PYTHON: pyref.python,
      MOERL_LLAMACPP_PRE_TOKENIZER: 'qwen2',
      MOERL_LLAMACPP_CONTEXT: '512',
    });
    const spec = (
      name: string,
      rollout: 'native' | 'openai',
      overrides = {},
      trainer: 'native' | 'pytorch' = 'native',
    ) => hfCampaignSpec(dir, name, { engine: { trainer, rollout }, ...overrides });
    /** Runs the campaign `s` to its end on in-process workers. */
    const run = (s: ReturnType<typeof spec>) =>
      withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
        const handle = await startCampaign(t.client, s, queues);
        await handle.result();
        return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
      });
    before(async () => {
      t = await startTestEnvironment();
      dir = mkdtempSync(join(tmpdir(), 'moerl-openai-rollout-'));
      store = openStore({ kind: 'fs', path: join(dir, 'store') });
      await writeHfCampaignFixture(dir, pyref, { publishedShape: true });
    });
    after(async () => {
      for (const w of workers) await w.rolloutServer?.close();
      await t?.teardown();
      rmSync(dir, { recursive: true, force: true });
    });

    /** The records of iteration `i`'s rollouts, by key order. */
    async function rollouts(campaignId: string, i: number): Promise<RolloutRecord[]> {
      const prefix = `rollouts/${String(i).padStart(6, '0')}/`;
      return [...(await artifacts(store, campaignId))]
        .filter(([k]) => k.startsWith(prefix))
        .flatMap(([, text]) =>
          text
            .split('\n')
            .filter(Boolean)
            .map((l) => JSON.parse(l) as RolloutRecord),
        );
    }

    /** moerl's log-probs of each record's tokens after its prompt, on checkpoint `iteration`. */
    async function scored(
      campaignId: string,
      iteration: number,
      records: RolloutRecord[],
    ): Promise<number[][]> {
      const hf = join(dir, `export-${campaignId}-${iteration}`);
      await exportCheckpoint({ store, campaignId, iteration, target: { kind: 'dir', path: hf } });
      const file = join(dir, `sequences-${campaignId}-${iteration}.jsonl`);
      writeFileSync(
        file,
        records.map((r) => JSON.stringify({ tokens: [...r.prompt_tokens, ...r.tokens] }) + '\n').join(''),
      );
      const { stdout } = await native.run(native.bin('moe_hf'), ['score', '--hf', hf, '--sequences', file], {
        env: native.env,
        maxBuffer: 1 << 26,
      });
      return stdout
        .split('\n')
        .filter(Boolean)
        .map((l, i) => (JSON.parse(l) as { logprobs: number[] }).logprobs.slice(-records[i]!.tokens.length));
    }

    /** Both iterations' rollouts are whole and decoded, their log-probs moerl's within the bound. */
    async function assertServerLogprobs(campaignId: string): Promise<void> {
      let worst = 0;
      let compared = 0;
      for (const i of [1, 2]) {
        const records = await rollouts(campaignId, i);
        assert.equal(records.length, 16, `iteration ${i}: 8 prompts x 2 samples`);
        for (const r of records) {
          assert.equal(r.iteration, i);
          assert.equal(r.logprobs.length, r.tokens.length);
        }
        // The policy of iteration i's rollout is checkpoint i - 1 (staleness 0).
        const want = await scored(campaignId, i - 1, records);
        records.forEach((r, j) =>
          r.logprobs.forEach((lp, k) => {
            worst = Math.max(worst, Math.abs(lp - want[j]![k]!));
            compared++;
          }),
        );
        // Completions are decoded text, as the native engine's.
        assert.ok(records.some((r) => r.text.length > 0));
      }
      console.log(
        `${campaignId}: llama-server vs moe_hf score: max |dlogp| ${worst} over ${compared} tokens`,
      );
      assert.ok(compared > 0 && worst <= LOGPROB_TOLERANCE, `log-probs differ by ${worst}`);
    }

    /** The llama-servers this test process runs. */
    const children = () =>
      spawnSync('pgrep', ['-P', String(process.pid), '-x', 'llama-server'], { encoding: 'utf8' })
        .stdout.split('\n')
        .filter(Boolean)
        .map(Number);

    const mismatch = (state: CampaignState) =>
      state.recentIterations.map((s) => s.trainMetrics.mismatch_kl ?? Number.NaN);

    test(
      'native trainer and llama-server rollouts: 2 iterations, log-probs as moerl scores them, mismatch_kl above native/native',
      { skip: llamacppSkip },
      async () => {
        const nat = await run(spec('oa-native', 'native'));
        const oa = await run(spec('oa-openai', 'openai'));
        for (const { state } of [nat, oa]) {
          assert.equal(state.status, 'completed');
          assert.equal(state.committedIteration, 2);
        }
        await assertServerLogprobs(oa.id);
        const [kNative, kOpenai] = [mismatch(nat.state), mismatch(oa.state)];
        console.log(
          `mismatch_kl native/native ${kNative.join(', ')}; native/llama-server ${kOpenai.join(', ')}`,
        );
        assert.equal(kOpenai.length, 2);
        for (const [i, k] of kOpenai.entries()) {
          assert.ok(Number.isFinite(k) && k > 0, `iteration ${i + 1}: mismatch_kl ${k}`);
          assert.ok(k > kNative[i]!, `iteration ${i + 1}: ${k} against native/native ${kNative[i]}`);
        }
      },
    );

    test(
      'PyTorch trainer and llama-server rollouts: 2 iterations, log-probs as moerl scores them, mismatch_kl reported',
      { skip: llamacppSkip || pytorch.skip },
      async () => {
        const pt = await run(spec('oa-pytorch', 'openai', {}, 'pytorch'));
        assert.equal(pt.state.status, 'completed');
        assert.equal(pt.state.committedIteration, 2);
        await assertServerLogprobs(pt.id);
        const k = mismatch(pt.state);
        console.log(`mismatch_kl PyTorch/llama-server ${k.join(', ')}`);
        assert.equal(k.length, 2);
        for (const value of k) assert.ok(Number.isFinite(value) && value > 0, `mismatch_kl ${value}`);
      },
    );

    test(
      'a llama-server killed mid-chunk is restarted by its supervisor and the chunk finished; validation samples from it too',
      { skip: llamacppSkip },
      async () => {
        writeVerlParquet(
          join(dir, 'store', 'datasets', 'validation.parquet'),
          Array.from({ length: 3 }, (_, i) => arithmeticRow(100 + i, 'validation')),
          4,
        );
        // Long completions, so that the kill lands inside a chunk; checkpoints 0 and 1 validated.
        const s = spec('oa-server-kill', 'openai', {
          iterations: 1,
          hyperparameters: { maxNewTokens: 160 },
          task: {
            dataset: {
              train: 'datasets/train.parquet',
              validation: 'datasets/validation.parquet',
              format: 'parquet',
            },
          },
          validation: { everyIterations: 1, samples: 2, maxNewTokens: 12, shards: 1 },
        });
        // This worker's llama-server: the child of this process other tests' workers do not own.
        const earlier = new Set(children());
        const servers = () => children().filter((pid) => !earlier.has(pid));
        const state = await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
          const handle = await startCampaign(t.client, s, queues);
          const [pid] = await waitFor(
            'iteration 1 rollout under way',
            async () =>
              (await rolloutChunksStored(store, handle.workflowId, 1)) >= 1 ? servers() : undefined,
            180_000,
            10,
          );
          assert.ok(pid, 'the worker runs a llama-server');
          process.kill(pid, 'SIGKILL');
          const stored = await rolloutChunksStored(store, handle.workflowId, 1);
          assert.ok(stored < 8, `killed with ${stored} of the 8 chunks stored: chunks were in flight`);
          await handle.result();
          const after = servers();
          assert.equal(after.length, 1);
          assert.notEqual(after[0], pid, 'a new llama-server');
          return handle.query<CampaignState>('status');
        });
        assert.equal(state.status, 'completed');
        assert.equal((await rollouts(state.campaignId, 1)).length, 16);
        // The shard's attempt lived on: the requests the kill cut off were sent again to the new server.
        assert.equal(state.recentIterations[0]?.chunksRedone, 0);
        assert.equal(state.retries.rollout, 0);
        // Validation shards take the same path: records with the server's log-probs.
        assert.deepEqual(
          state.validations?.map((v) => v.iteration),
          [0, 1],
        );
        const records: RolloutRecord[] = [];
        for await (const obj of store.list(`${keys.validationPrefix(state.campaignId, 1)}/shard-0/`))
          for (const line of (await store.get(obj.key)).toString('utf8').split('\n').filter(Boolean))
            records.push(JSON.parse(line) as RolloutRecord);
        assert.equal(records.length, 6, '3 rows x 2 samples');
        for (const r of records) assert.ok(r.tokens.length > 0 && r.logprobs.length === r.tokens.length);
      },
    );

    test(
      'a SIGKILLed rollout worker in front of llama-server redoes at most one chunk per shard',
      { skip: llamacppSkip },
      async () => {
        const s = spec('oa-spot', 'openai', { iterations: 1 });
        const queues = uniqueTaskQueues();
        const env = { ...process.env, ...serverEnv(), MOERL_ROLLOUT_RANKS: '2' };
        let name = 0;
        const start = () =>
          spawnRolloutWorker({ address: t.address, queues, dir, name: `oa-${name++}`, env });
        const state = await withWorkers(
          t.nativeConnection,
          t.namespace,
          activities(),
          async () => {
            let worker = start();
            try {
              const handle = await startCampaign(t.client, s, queues);
              await waitFor(
                'iteration 1 rollout under way',
                async () =>
                  (await rolloutChunksStored(store, handle.workflowId, 1)) >= 1 ? true : undefined,
                180_000,
                10,
              );
              // The worker's process group: the worker and the llama-server it supervises.
              process.kill(-worker.pid!, 'SIGKILL');
              await exited(worker);
              worker = start();
              await handle.result();
              return await handle.query<CampaignState>('status');
            } finally {
              if (worker.exitCode === null) process.kill(-worker.pid!, 'SIGKILL');
              await exited(worker);
            }
          },
          queues,
          ['control', 'train'],
        );
        assert.equal(state.status, 'completed');
        const [summary] = state.recentIterations;
        console.log(`chunks redone after the SIGKILL: ${summary?.chunksRedone}`);
        assert.ok(summary && summary.chunksRedone <= s.rolloutShards, `redone ${summary?.chunksRedone}`);
        assert.equal((await rollouts(state.campaignId, 1)).length, 16);
      },
    );

    describe('a server that breaks the contract pauses the campaign naming it', () => {
      let server: Server;
      let url: string;
      let answer: (body: { seed: number }) => string;
      before(async () => {
        server = createServer((req, res) => {
          let body = '';
          req.on('data', (d: Buffer) => (body += d.toString()));
          req.on('end', () => {
            res.setHeader('content-type', 'application/json');
            if (req.url === '/health') return res.end('{"status":"ok"}');
            if (req.url === '/update_weights_from_disk') return res.end('{"success":true}');
            res.end(answer(JSON.parse(body) as { seed: number }));
          });
        });
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
        url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      });
      after(() => new Promise<void>((resolve) => server.close(() => resolve())));

      const cases: [string, (body: { seed: number }) => string, RegExp][] = [
        ['malformed JSON', () => '{"choices": [', /answer is not JSON: \{"choices": \[/],
        [
          'no log-probs',
          () => JSON.stringify({ choices: [{ text: 'hi', finish_reason: 'length', logprobs: null }] }),
          /the completion has no log-probs \("logprobs" is missing or null\)/,
        ],
      ];
      for (const [what, reply, reason] of cases)
        test(`a fake server answering ${what}`, async () => {
          answer = reply;
          const env = {
            MOERL_ROLLOUT_ENGINE_URL: url,
            MOERL_ROLLOUT_ENGINE_WEIGHTS_DIR: join(dir, `weights-${what.replace(/\W/g, '')}`),
          };
          await withWorkers(t.nativeConnection, t.namespace, activities(env), async (queues) => {
            const handle = await startCampaign(
              t.client,
              spec('oa-fake', 'openai', { iterations: 1 }),
              queues,
            );
            const state = await waitForState(
              handle,
              'paused at the rollout',
              (st) => st.status === 'paused',
              120_000,
            );
            assert.equal(state.lastFailure?.stage, 'rollout');
            assert.equal(state.lastFailure?.type, 'RolloutEngineProtocol');
            const message = state.lastFailure?.message ?? '';
            assert.ok(message.includes(`${url}/v1/completions`), message);
            assert.match(message, reason);
            assert.equal(state.committedIteration, 0, 'no update');
            await handle.cancel();
          });
        });
    });
  },
);
