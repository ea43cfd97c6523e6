// A rollout worker's rank capacity on a real campaign (native moe_train and moe_generate, the
// shipped activities): a campaign whose rolloutEpWorldSize exceeds it pauses after one attempt
// of each shard with the reason recorded; resumed on workers that fit, its two EP-2 shards share
// a capacity of 2 ranks, one shard at a time, and it completes.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import { resumeSignal } from '../../workflows/messages.js';
import {
  processes,
  startCampaign,
  tinyRealSpec,
  waitForState,
  withWorkers,
} from '../support/campaign-harness.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

let t: TestEnvironment;
let dir: string;
before(async () => {
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-rollout-capacity-'));
});
after(async () => {
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

const activities = (cache: string, ranks: string) =>
  createActivities(
    workerActivityDeps(new AbortController().signal, {
      ...process.env,
      MOERL_CACHE_DIR: join(dir, cache),
      MOERL_ROLLOUT_RANKS: ranks,
    }),
  );

/** moe_generate processes whose command line names this cache directory. */
const generators = (cache: string) => processes('moe_generate', join(dir, cache)).length;

describe('rollout rank capacity', { timeout: 240_000 }, () => {
  test('rolloutEpWorldSize 2 on a 1-rank worker pauses the campaign, not retried; on 2-rank workers it completes, one shard at a time', async () => {
    const spec = tinyRealSpec('rollout-capacity', dir, { rolloutEpWorldSize: 2 });
    // A query needs a worker: the state is read while they run.
    const { handle, queues, state } = await withWorkers(
      t.nativeConnection,
      t.namespace,
      activities('cache-small', '1'),
      async (queues) => {
        const handle = await startCampaign(t.client, spec, queues);
        const state = await waitForState(
          handle,
          'the campaign to pause itself',
          (s) => s.status === 'paused',
          120_000,
        );
        return { handle, queues, state };
      },
    );
    const f = state.lastFailure;
    process.stdout.write(`# ${String(f?.type)}: ${String(f?.message)}\n`);
    assert.equal(f?.stage, 'rollout');
    assert.equal(f?.type, 'RolloutRanksExceedCapacity');
    assert.equal(f?.nonRetryable, true);
    assert.match(String(f?.message), /rolloutEpWorldSize 2 .* runs at most 1 \(MOERL_ROLLOUT_RANKS/);

    let most = 0;
    const result = await withWorkers(
      t.nativeConnection,
      t.namespace,
      activities('cache-fits', '2'),
      async () => {
        await handle.signal(resumeSignal, { reason: 'rollout workers resized' });
        const sample = setInterval(() => (most = Math.max(most, generators('cache-fits'))), 50);
        try {
          return await handle.result();
        } finally {
          clearInterval(sample);
        }
      },
      queues,
    );
    process.stdout.write(`# at most ${most} moe_generate ranks at once on a capacity of 2\n`);
    assert.equal(result.status, 'completed');
    assert.equal(result.committedIteration, 1);
    assert.ok(most <= 2, `the two EP-2 shards shared 2 rank slots (${most} ranks seen at once)`);
  });
});
