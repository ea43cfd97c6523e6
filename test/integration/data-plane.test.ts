// Real campaigns: the shipped activities on the dev server, native moe_generate / moe_train
// with 2 EP ranks through the local launcher, and an fs store in a temporary directory.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { createActivities } from '../../activities/index.js';
import { sha256Hex } from '../../activities/checkpoints.js';
import { workerActivityDeps } from '../../activities/deps.js';
import * as keys from '../../activities/layout.js';
import { openStore } from '../../activities/store/index.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, tinyRealSpec, withWorkers } from '../support/campaign-harness.js';
import type { CampaignSpecInput } from '../../workflows/spec.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

let t: TestEnvironment;
let dir: string;
before(async () => {
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-data-plane-'));
});
after(async () => {
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

/** Two iterations with an SFT warm start: enough for rewards to vary and the update to train. */
const tinySpec = (name: string, overrides: Partial<CampaignSpecInput> = {}) =>
  tinyRealSpec(name, dir, { iterations: 2, promptsPerIteration: 8, sftWarmStartSteps: 10, ...overrides });

describe('data plane: real activities', () => {
  test('a campaign trains with 2 EP ranks and commits every checkpoint whole', async () => {
    const stop = new AbortController();
    const deps = {
      ...workerActivityDeps(stop.signal, { ...process.env, MOERL_CACHE_DIR: join(dir, 'cache') }),
    };
    const spec = tinySpec('real-campaign');
    await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
      const handle = await startCampaign(t.client, spec, queues);
      const result = await handle.result();
      assert.equal(result.committedIteration, 2);
      const state = await handle.query<CampaignState>('status');
      assert.equal(state.recentIterations.length, 2);
      for (const it of state.recentIterations) {
        assert.equal(it.samples, 32);
        assert.ok(it.meanReward >= 0 && it.meanReward <= 1);
        assert.ok(it.tokens > 0);
        assert.ok('mean_reward' in it.trainMetrics, 'training metrics reach the workflow');
      }
      const store = openStore(spec.store);
      const id = handle.workflowId;
      const latest = JSON.parse((await store.get(keys.latestKey(id))).toString()) as { iteration: number };
      assert.equal(latest.iteration, 2);
      for (const it of [0, 1, 2]) {
        const manifest = JSON.parse(
          (await store.get(`${keys.checkpointKey(id, it)}/manifest.json`)).toString(),
        ) as { files: { name: string; bytes: number; sha256: string }[]; world_size: number };
        // The weights, and their AdamW moments apart (checkpoint 0 too: after the SFT warm start).
        assert.deepEqual(manifest.files.map((f) => f.name).sort(), [
          'dense.safetensors',
          'experts-rank0.safetensors',
          'experts-rank1.safetensors',
          'optimizer-dense.safetensors',
          'optimizer-experts-rank0.safetensors',
          'optimizer-experts-rank1.safetensors',
        ]);
        // Whole: every file's bytes are what the manifest vouches for.
        for (const f of manifest.files) {
          const body = await store.get(`${keys.checkpointKey(id, it)}/${f.name}`);
          assert.equal(body.length, f.bytes, `checkpoint ${it} ${f.name} size`);
          assert.equal(sha256Hex(body), f.sha256, `checkpoint ${it} ${f.name} sha256`);
        }
      }
      assert.ok(await store.head(keys.rolloutChunkKey(id, 1, 1, 1)));
      assert.ok(await store.head(keys.rewardKey(id, 2, 0)));
      assert.ok(await store.head(keys.metricsKey(id, 2)));
      assert.ok(await store.head(keys.rankLogKey(id, 2, 1, 1)));
    });
  });

  test('an HTTP reward model chosen in the spec scores every sample', async () => {
    const seen: number[] = [];
    const server = createServer((req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        const samples = (JSON.parse(body) as { samples: { completion: string }[] }).samples;
        seen.push(samples.length);
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ rewards: samples.map((s) => (s.completion.length % 2 === 0 ? 1 : 0.5)) }));
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/score`;
      const stop = new AbortController();
      const deps = workerActivityDeps(stop.signal, {
        ...process.env,
        MOERL_CACHE_DIR: join(dir, 'cache-http'),
      });
      const spec = tinySpec('http-reward', {
        iterations: 1,
        sftWarmStartSteps: 0,
        reward: { kind: 'http', url, batchSize: 10 },
        // truncated importance sampling on: native rollouts and trainer compute the same model,
        // so the mismatch is rounding and no weight reaches the cap
        hyperparameters: { maxNewTokens: 10, tisClip: 2 },
      });
      await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
        const handle = await startCampaign(t.client, spec, queues);
        await handle.result();
        const state = await handle.query<CampaignState>('status');
        const it = state.recentIterations[0]!;
        assert.ok(
          it.meanReward >= 0.5 && it.meanReward <= 1,
          `rewards come from the model (${it.meanReward})`,
        );
        assert.equal(
          seen.reduce((a, b) => a + b, 0),
          32,
          'every sample was sent once',
        );
        assert.ok(Math.max(...seen) <= 10, 'in batches of at most batchSize');
        const m = it.trainMetrics;
        assert.ok('loss' in m, `the update trained: ${JSON.stringify(m)}`);
        assert.ok(m.mismatch_kl! >= 0 && m.mismatch_kl! < 1e-6, `mismatch_kl ${m.mismatch_kl}`);
        assert.equal(m.tis_clip_frac, 0, 'no importance weight reaches the cap');
      });
    } finally {
      server.close();
    }
  });
});
