// A campaign whose updates the PyTorch trainer (engines/pytorch) trains, its rollouts sampled by
// native moe_generate: the tiny Hugging Face campaign of hf-campaign.test.ts run twice, with
// `engine.trainer` native and pytorch, 2 iterations on EP/DP 2 local ranks. Checked: both
// complete; the PyTorch trainer's checkpoints hold its Hugging Face directory (weights, config,
// optimizer.moerl carried from update to update) beside the moerl checkpoint imported from it,
// which is the same model; iteration 1 samples the same batch in both campaigns and the two
// engines' first updates of it agree per tensor; checkpoints export; a trainer that exits 2, or
// that writes a directory moe_train cannot import, pauses the campaign naming it, and nothing is
// committed.
import assert from 'node:assert/strict';
import { chmod, mkdir, readFile, writeFile } from 'node:fs/promises';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { committedCheckpoint, huggingFaceFiles } from '../../activities/checkpoints.js';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { exportCheckpoint } from '../../activities/models/export.js';
import { openStore } from '../../activities/store/index.js';
import type { CampaignInput, CampaignState } from '../../workflows/types.js';
import { artifacts, startCampaign, waitForState, withWorkers } from '../support/campaign-harness.js';
import { hfCampaignSpec, writeHfCampaignFixture } from '../support/hf-campaign-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { pytorchEngine } from '../support/pytorch-engine.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const engine = pytorchEngine();
const native = nativeTools(['moe_train', 'moe_generate', 'moe_hf']);

/** The `step` in the metadata of an optimizer.moerl (a safetensors header). */
async function optimizerStep(path: string): Promise<number> {
  const bytes = await readFile(path);
  const header = JSON.parse(bytes.subarray(8, 8 + Number(bytes.readBigUInt64LE(0))).toString('utf8')) as {
    __metadata__: { step: string };
  };
  return Number(header.__metadata__.step);
}

describe('a campaign trained by the PyTorch trainer', { skip: engine.skip || native.skip }, () => {
  let t: TestEnvironment;
  let dir: string;
  let store: ReturnType<typeof openStore>;
  // The trainer's interpreter by default (MOERL_PYTORCH_PYTHON unset): scripts/pyref.sh's, unless
  // the tests were given another reference interpreter.
  const pyrefOverride = process.env.MOERL_PYREF_PYTHON
    ? { MOERL_PYTORCH_PYTHON: process.env.MOERL_PYREF_PYTHON }
    : {};
  const activities = (env: NodeJS.ProcessEnv = { ...process.env, ...pyrefOverride }) =>
    createActivities(workerActivityDeps(new AbortController().signal, env));
  // KL to checkpoint 0 and an entropy bonus: the reference is fetched as a Hugging Face directory too.
  const hyperparameters = {
    maxNewTokens: 24,
    minibatches: 1,
    epochs: 1,
    lr: 0.002,
    klCoef: 0.05,
    entropyCoef: 0.01,
  };

  before(async () => {
    t = await startTestEnvironment();
    dir = mkdtempSync(join(tmpdir(), 'moerl-pytorch-campaign-'));
    store = openStore({ kind: 'fs', path: join(dir, 'store') });
    await writeHfCampaignFixture(dir, engine.pyref);
  });
  after(async () => {
    await t?.teardown();
    rmSync(dir, { recursive: true, force: true });
  });

  async function run(name: string, trainer: 'native' | 'pytorch', extra: Partial<CampaignInput> = {}) {
    const s = hfCampaignSpec(dir, name, { engine: { trainer }, hyperparameters });
    return withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues, extra);
      await handle.result();
      return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
    });
  }

  /** Checkpoint `iteration` of a campaign as a Hugging Face folder, by moe_hf export. */
  async function exported(campaignId: string, iteration: number): Promise<string> {
    const out = join(dir, `export-${campaignId}-${iteration}`);
    await exportCheckpoint({ store, campaignId, iteration, target: { kind: 'dir', path: out } });
    return out;
  }

  let nat: { id: string; state: CampaignState };
  let pt: { id: string; state: CampaignState };

  test('native and PyTorch trainers, same batch: both complete, the first updates agree per tensor, checkpoints export', async () => {
    nat = await run('pt-native', 'native');
    pt = await run('pt-pytorch', 'pytorch');
    for (const { state } of [nat, pt]) {
      assert.equal(state.status, 'completed');
      assert.equal(state.committedIteration, 2);
    }

    // Both sampled iteration 1 from the same imported weights: the same batch, byte for byte.
    const [a, b] = [await artifacts(store, nat.id), await artifacts(store, pt.id)];
    const iteration1 = [...a].filter(
      ([k]) => k.startsWith('rollouts/000001/') || k.startsWith('rewards/000001/'),
    );
    assert.ok(iteration1.length > 0);
    for (const [key, text] of iteration1) assert.equal(b.get(key), text, `${key} as the native campaign's`);

    // Every checkpoint of the PyTorch campaign holds the trainer's directory beside the moerl files.
    for (const iteration of [0, 1, 2]) {
      const found = await committedCheckpoint(store, pt.id, iteration);
      assert.ok(found, `checkpoint ${iteration} committed`);
      const names = huggingFaceFiles(found.manifest, found.ref.key)?.map((f) => f.name) ?? [];
      const want = ['config.json', 'model.safetensors', ...(iteration > 0 ? ['optimizer.moerl'] : [])];
      assert.deepEqual(
        names.filter((n) => want.includes(n)).sort(),
        want.sort(),
        `checkpoint ${iteration}: ${names.join(', ')}`,
      );
      assert.ok(found.manifest.files.some((f) => f.name === 'dense.safetensors'));
    }

    // The moerl checkpoint is the trainer's directory imported: the same model, exactly.
    const hfDir = async (iteration: number) => {
      const found = (await committedCheckpoint(store, pt.id, iteration))!;
      const local = join(dir, `hf-${iteration}`);
      await mkdir(local, { recursive: true });
      for (const f of huggingFaceFiles(found.manifest, found.ref.key)!)
        await store.getFile(`${found.ref.key}/${f.name}`, join(local, f.name));
      return local;
    };
    const [hf1, hf2] = [await hfDir(1), await hfDir(2)];
    const ptExport1 = await exported(pt.id, 1);
    const same = await engine.compare(ptExport1, hf1);
    assert.deepEqual(same.missing, []);
    assert.equal(
      same.max_rel_l2,
      0,
      `moerl checkpoint 1 vs the trainer's directory: ${JSON.stringify(same)}`,
    );

    // The optimizer carried from update to update: one step per iteration here.
    assert.equal(await optimizerStep(join(hf1, 'optimizer.moerl')), 1);
    assert.equal(await optimizerStep(join(hf2, 'optimizer.moerl')), 2);

    // The two engines' first updates of the same batch from the same weights.
    const agree = await engine.compare(ptExport1, await exported(nat.id, 1), join(dir, 'qwen3'));
    assert.deepEqual(agree.missing, []);
    assert.ok(agree.tensors > 0 && (agree.changed ?? 0) > 0, JSON.stringify(agree));
    assert.ok(agree.max_rel_l2 <= 1e-4, `PyTorch vs native checkpoint 1: ${JSON.stringify(agree)}`);
    console.log(`first update, PyTorch vs native: ${JSON.stringify(agree)}`);

    // The last checkpoint exports as any other.
    const last = await exported(pt.id, 2);
    assert.ok((await engine.compare(last, hf2)).max_rel_l2 === 0);
  });

  test("forks: a PyTorch campaign continues from its own checkpoint's optimizer, and refuses a native checkpoint", async () => {
    const own = (await committedCheckpoint(store, pt.id, 1))!.ref;
    const fork = await run('pt-fork', 'pytorch', { forkFrom: own });
    assert.equal(fork.state.status, 'completed');
    const found = (await committedCheckpoint(store, fork.id, 2))!;
    const local = join(dir, 'fork-optimizer.moerl');
    await store.getFile(`${found.ref.key}/optimizer.moerl`, local);
    assert.equal(await optimizerStep(local), 2);

    const foreign = (await committedCheckpoint(store, nat.id, 1))!.ref;
    const s = hfCampaignSpec(dir, 'pt-fork-native', { engine: { trainer: 'pytorch' }, hyperparameters });
    await withWorkers(t.nativeConnection, t.namespace, activities(), async (queues) => {
      const handle = await startCampaign(t.client, s, queues, { forkFrom: foreign });
      const state = await waitForState(handle, 'paused', (st) => st.status === 'paused', 60_000);
      await handle.cancel();
      assert.equal(state.lastFailure?.stage, 'prepare');
      assert.match(
        state.lastFailure?.message ?? '',
        /holds no Hugging Face directory \(the native trainer wrote it\)/,
      );
    });
  });

  /** A stand-in for the trainer's interpreter: a script that gets the trainer's arguments. */
  async function fakeTrainer(name: string, body: string): Promise<string> {
    const path = join(dir, name);
    await writeFile(path, `#!/usr/bin/env bash\n${body}\n`);
    await chmod(path, 0o755);
    return path;
  }

  async function pausedAtUpdate(name: string, python: string) {
    const s = hfCampaignSpec(dir, name, { engine: { trainer: 'pytorch' }, hyperparameters, iterations: 1 });
    return withWorkers(
      t.nativeConnection,
      t.namespace,
      activities({ ...process.env, MOERL_PYTORCH_PYTHON: python }),
      async (queues) => {
        const handle = await startCampaign(t.client, s, queues);
        const state = await waitForState(handle, `${name} paused`, (st) => st.status === 'paused', 240_000);
        await handle.cancel();
        return { id: handle.workflowId, state };
      },
    );
  }

  async function nothingCommittedAfter0(id: string, state: CampaignState) {
    assert.equal(state.lastFailure?.stage, 'update');
    assert.equal(state.lastFailure?.type, 'BadInput');
    assert.equal(state.committedIteration, 0, 'nothing committed after the import');
    const staged: string[] = [];
    for await (const o of store.list(`${keys.checkpointKey(id, 1)}/`)) staged.push(o.key);
    assert.deepEqual(staged, [], 'no file of checkpoint 1 staged');
  }

  test('a fake trainer (a script in place of the interpreter) that exits 2 pauses the campaign as bad input, naming it', async () => {
    const python = await fakeTrainer(
      'exits-2',
      'echo "moerl-pytorch grpo: error: --rollouts-file: refused by the fake trainer" >&2; exit 2',
    );
    const { id, state } = await pausedAtUpdate('pt-exit2', python);
    assert.match(state.lastFailure?.message ?? '', /exited with code 2.*refused by the fake trainer/s);
    await nothingCommittedAfter0(id, state);
  });

  test('a fake trainer that writes a malformed Hugging Face directory pauses the campaign naming the file; nothing committed', async () => {
    // config.json copied from the policy, weights that are not safetensors
    const python = await fakeTrainer(
      'malformed',
      [
        'while [ $# -gt 0 ]; do case "$1" in --checkpoint) in="$2";; --out) out="$2";; esac; shift; done',
        'mkdir -p "$out" && cp "$in/config.json" "$out/" && printf "not safetensors" > "$out/model.safetensors"',
      ].join('\n'),
    );
    const { id, state } = await pausedAtUpdate('pt-malformed', python);
    const message = state.lastFailure?.message ?? '';
    assert.match(message, /hf-out\/model\.safetensors/);
    assert.match(message, /hf-out is not a model moerl can import/);
    await nothingCommittedAfter0(id, state);
  });
});
