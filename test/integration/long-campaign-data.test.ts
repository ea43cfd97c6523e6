// Regression tests for defects that bite long or large campaigns, on the real data plane (native
// tools, fs store, the real dev server): a chunk slower than the heartbeat timeout, a shard
// failing on a live worker, thousands of chunks per iteration, a worker cache that must stay
// bounded over many iterations.
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { workerActivityDeps } from '../../activities/deps.js';
import type { ActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import type { CampaignSpecInput } from '../../workflows/spec.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, tinyRealSpec, waitForState, withWorkers } from '../support/campaign-harness.js';
import { nativeTools } from '../support/native-tools.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const tools = nativeTools(['moe_train', 'moe_generate']);
const dir = mkdtempSync(join(tmpdir(), 'moerl-long-data-'));
let t: TestEnvironment;
before(async () => {
  t = await startTestEnvironment();
});
after(async () => {
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

function deps(name: string, env: NodeJS.ProcessEnv = {}): ActivityDeps {
  return workerActivityDeps(new AbortController().signal, {
    ...process.env,
    MOERL_CACHE_DIR: join(dir, name, 'cache'),
    ...env,
  });
}

const spec = (name: string, overrides: Partial<CampaignSpecInput>) =>
  tinyRealSpec(name, join(dir, name), overrides);

describe('long-campaign defects (real data plane)', { skip: tools.skip }, () => {
  test('heartbeat starvation: a rollout chunk slower than the heartbeat timeout completes in one attempt', async () => {
    // One chunk of 4,096 prompts x 8 samples takes several seconds; the heartbeat timeout is 1 s.
    // Before, the activity beat only between chunks, so the server killed every attempt.
    const s = spec('slow-chunk', {
      promptsPerIteration: 4096,
      rolloutShards: 1,
      chunkSize: 4096,
      groupSize: 8,
      hyperparameters: { maxNewTokens: 16, minibatches: 1, epochs: 1 },
      orchestration: { rolloutHeartbeatSeconds: 1 },
    });
    await withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(deps('slow-chunk')),
      async (queues) => {
        const handle = await startCampaign(t.client, s, queues);
        const result = await handle.result();
        assert.equal(result.committedIteration, 1);
        const state = await handle.query<CampaignState>('status');
        assert.equal(
          state.recentIterations[0]!.attempts.rollout,
          1,
          'no attempt was killed for missed heartbeats',
        );
        assert.equal(state.retries.rollout, 0);
      },
    );
  });

  test('repeated failures of one shard on a live worker pause the campaign with a clear reason (fake moe_generate)', async () => {
    // The real moe_train, and a moe_generate that always crashes: retryable, on a live worker.
    const bin = join(dir, 'failing-bin');
    mkdirSync(bin, { recursive: true });
    const fake = join(bin, 'moe_generate');
    symlinkSync(tools.bin('moe_train'), join(bin, 'moe_train'));
    writeFileSync(fake, '#!/bin/sh\necho "fake moe_generate: crashing" >&2\nexit 1\n');
    chmodSync(fake, 0o755);
    const s = spec('live-failures', { orchestration: { rolloutMaxFailuresOnLiveWorker: 3 } });
    const activities = createActivities({ ...deps('live-failures', { MOERL_NATIVE_BIN: bin }), binDir: bin });
    await withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      const paused = await waitForState(
        handle,
        'the campaign to pause',
        (st) => st.status === 'paused',
        120_000,
      );
      assert.equal(paused.lastFailure?.stage, 'rollout');
      assert.equal(paused.lastFailure?.type, 'RolloutFailingOnLiveWorker');
      assert.match(paused.pauseReason ?? '', /failed 3 attempts in a row on worker .* which stayed alive/);
      await handle.cancel();
    });
  });

  test('payloads stay small: a campaign with 2,000 chunks per iteration completes and no payload passes 64 KB', async () => {
    const s = spec('many-chunks', {
      promptsPerIteration: 2000,
      rolloutShards: 4,
      chunkSize: 1,
      groupSize: 2,
      hyperparameters: { maxNewTokens: 4, minibatches: 1, epochs: 1 },
    });
    await withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(deps('many-chunks')),
      async (queues) => {
        const handle = await startCampaign(t.client, s, queues);
        const result = await handle.result();
        assert.equal(result.committedIteration, 1);
        const history = await handle.fetchHistory();
        let largest = 0;
        for (const event of history.events ?? []) {
          const bytes = Buffer.byteLength(JSON.stringify(event));
          largest = Math.max(largest, bytes);
        }
        assert.ok(largest < 64 * 1024, `largest history event ${largest} bytes`);
        const state = await handle.query<CampaignState>('status');
        assert.equal(state.recentIterations[0]!.samples, 4000);
      },
    );
  });

  test('worker disks stay bounded: over many iterations the checkpoint cache keeps its bound and no job directory stays', async () => {
    const s = spec('bounded-cache', { iterations: 6, promptsPerIteration: 4 });
    const cache = join(dir, 'bounded-cache', 'cache');
    const d = deps('bounded-cache', { MOERL_CACHE_MAX_CHECKPOINTS: '2' });
    await withWorkers(t.nativeConnection, t.namespace, createActivities(d), async (queues) => {
      const handle = await startCampaign(t.client, s, queues);
      assert.equal((await handle.result()).committedIteration, 6);
    });
    await d.checkpoints.settled();
    const entries = readdirSync(join(cache, 'checkpoints')).filter((n) => !n.startsWith('.'));
    assert.ok(entries.length <= 2, `cache holds ${entries.length} checkpoints: ${entries.join(', ')}`);
    const jobs = readdirSync(join(cache, 'jobs'));
    assert.deepEqual(jobs, [], 'finished jobs leave no directory');
  });
});
