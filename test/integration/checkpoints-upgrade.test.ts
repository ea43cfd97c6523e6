// A campaign in flight across the upgrade that moved the AdamW moments into files of their own:
// its committed checkpoints are version 1 (moments inside the weights files). Here a campaign
// forked from one, moe_train's own version 1 output (native/tests/golden/checkpoint-v1), runs
// on the real activities (moe_generate, moe_train on 2 EP ranks through the local launcher, an
// fs store): its rollouts sample it, its first update trains on its moments with it as the KL
// reference, and its next checkpoints are version 2, whose moments the rollout worker's cache
// never fetches.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { commitCheckpoint, stageCheckpoint } from '../../activities/checkpoints.js';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { openStore } from '../../activities/store/index.js';
import type { CheckpointManifest } from '../../activities/types.js';
import { startCampaign, tinyRealSpec, withWorkers } from '../support/campaign-harness.js';
import { nativeTools } from '../support/native-tools.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

/** moe_train's output before the optimizer files: init and 3 SFT steps of the model below, 2 ranks. */
const version1Checkpoint = fileURLToPath(
  new URL('../../../native/tests/golden/checkpoint-v1', import.meta.url),
);
const tools = nativeTools(['moe_train', 'moe_generate']);

/** A reward model scoring odd samples 1 and even ones 0: every group has an advantage to train on. */
const rewardModel = createServer((req, res) => {
  let body = '';
  req.on('data', (d: Buffer) => (body += d.toString()));
  req.on('end', () => {
    const samples = (JSON.parse(body) as { samples: { sample_index: number }[] }).samples;
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ rewards: samples.map((s) => s.sample_index % 2) }));
  });
});

let t: TestEnvironment;
let dir: string;
before(async () => {
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-checkpoints-upgrade-'));
  await new Promise<void>((r) => rewardModel.listen(0, '127.0.0.1', r));
});
after(async () => {
  rewardModel.close();
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

describe('checkpoints across the upgrade (real activities)', { skip: tools.skip }, () => {
  test('a campaign forked from a version 1 checkpoint samples it, trains on its moments and commits version 2', async () => {
    const spec = tinyRealSpec('across-upgrade', dir, {
      model: { layers: 1, hidden: 8, heads: 2, experts: 4, topK: 2, contextLength: 32 },
      iterations: 4,
      reward: { kind: 'http', url: `http://127.0.0.1:${(rewardModel.address() as AddressInfo).port}/score` },
      hyperparameters: { maxNewTokens: 10, klCoef: 0.01 },
    });
    const store = openStore(spec.store);
    const opts = { meanReward: null, keepLast: 3, keepBest: false, keepIteration: 0, now: new Date() };
    const { checkpoint: v1 } = await commitCheckpoint(
      store,
      await stageCheckpoint(store, version1Checkpoint, 'before-upgrade', 2),
      opts,
    );
    const cacheDir = join(dir, 'cache');
    const deps = workerActivityDeps(new AbortController().signal, {
      ...process.env,
      MOERL_CACHE_DIR: cacheDir,
    });
    await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
      const handle = await startCampaign(t.client, spec, queues, { forkFrom: v1 });
      const result = await handle.result();
      assert.equal(result.committedIteration, 4);
      const manifest = async (it: number) =>
        JSON.parse(
          (await store.get(`${keys.checkpointKey(handle.workflowId, it)}/manifest.json`)).toString(),
        ) as CheckpointManifest & { optimizer_step: number };
      const names = (m: CheckpointManifest) => m.files.map((f) => f.name).sort();
      const forked = await manifest(2);
      assert.equal(forked.version, 1);
      assert.deepEqual(names(forked), [
        'dense.safetensors',
        'experts-rank0.safetensors',
        'experts-rank1.safetensors',
      ]);
      const weights = ['dense.safetensors', 'experts-rank0.safetensors', 'experts-rank1.safetensors'];
      let step = forked.optimizer_step;
      assert.equal(step, 3);
      for (const it of [3, 4]) {
        const m = await manifest(it);
        assert.equal(m.version, 2, `checkpoint ${it}`);
        assert.deepEqual(names(m), [...weights, ...weights.map((n) => `optimizer-${n}`)].sort());
        // The update continued the optimizer: its steps count on from the checkpoint's.
        assert.ok(
          m.optimizer_step > step,
          `checkpoint ${it}: optimizer_step ${m.optimizer_step} after ${step}`,
        );
        step = m.optimizer_step;
      }
      // The rollout worker cached the checkpoints it sampled (2 and 3), weights only.
      const entries = readdirSync(join(cacheDir, 'checkpoints')).filter((n) => /^[0-9a-f]{64}$/.test(n));
      assert.equal(entries.length, 2);
      for (const entry of entries)
        assert.deepEqual(
          readdirSync(join(cacheDir, 'checkpoints', entry)).sort(),
          [...weights, 'manifest.json'].sort(),
        );
    });
  });
});
