// Survival of the failures a long campaign meets: rollout workers lost to Spot reclaims
// (SIGKILL of the whole process group) or told to leave (SIGTERM), and a trainer rank killed
// mid-update. Each interrupted campaign must produce exactly what an uninterrupted run with the
// same seed produces, redoing at most the chunk that was in flight.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { ActivityDeps } from '../../activities/deps.js';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { parseRolloutLine } from '../../activities/rewards/rollout-record.js';
import { openStore } from '../../activities/store/index.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import type { CampaignState } from '../../workflows/types.js';
import {
  artifacts,
  exited,
  pidOf,
  processes,
  rolloutChunksStored,
  spawnRolloutWorker,
  startCampaign,
  tinyRealSpec,
  uniqueTaskQueues,
  waitFor,
  withWorkers,
} from '../support/campaign-harness.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

let t: TestEnvironment;
let dir: string;
before(async () => {
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-interruptions-'));
});
after(async () => {
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

/** The demo's model size (so stages take long enough to be interrupted), no SFT. */
const spec = (name: string): CampaignSpec =>
  tinyRealSpec(name, dir, {
    model: { layers: 2, hidden: 128, heads: 4, experts: 8, topK: 2, contextLength: 32 },
    iterations: 2,
    promptsPerIteration: 128,
    groupSize: 8,
    hyperparameters: { maxNewTokens: 10, minibatches: 2, epochs: 1 },
    orchestration: { rolloutHeartbeatSeconds: 2, updateHeartbeatSeconds: 10 },
  });

async function checkpointFiles(store: ObjectStore, campaignId: string, iteration: number) {
  const manifest = JSON.parse(
    (await store.get(`${keys.checkpointKey(campaignId, iteration)}/manifest.json`)).toString(),
  ) as {
    files: { name: string; sha256: string }[];
  };
  return manifest.files;
}

/** Asserts that campaign `id` stored the rollouts and rewards of `reference`, file by file; returns them. */
async function assertSameArtifacts(store: ObjectStore, reference: string, id: string, what: string) {
  const [want, got] = [await artifacts(store, reference), await artifacts(store, id)];
  assert.equal(got.size, want.size, `as many rollout and rewards files as ${what}`);
  for (const [key, text] of want) assert.equal(got.get(key), text, `${key} matches ${what}`);
  return want;
}

/** `ps` lines of the moe_generate ranks of rollout worker `worker` (known by its cache). */
const generatorLines = (worker: string) => processes('moe_generate', join(dir, `cache-${worker}`));

/** The pids of worker `worker`'s moe_generate ranks for `shard` of `iteration`. */
function shardRanks(worker: string, campaignId: string, iteration: number, shard: number): number[] {
  // The rollout's out-dir: activities/rollout.ts.
  return generatorLines(worker)
    .filter((l) => l.includes(join('rollouts', `${campaignId}-${iteration}-${shard}-`)))
    .map(pidOf);
}

/** Runs each campaign of `specs` to completion, nothing interrupted; their ids. */
async function uninterrupted(deps: ActivityDeps, specs: CampaignSpec[]): Promise<string[]> {
  return withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
    const ids: string[] = [];
    for (const s of specs) {
      const handle = await startCampaign(t.client, s, queues);
      await handle.result();
      ids.push(handle.workflowId);
    }
    return ids;
  });
}

/**
 * Runs `spec` with control and train in this process and rollout only in worker processes, one
 * at a time, so the worker that is lost is certainly the one running both shards. Loss i comes
 * once each shard of iteration i + 1 has stored a chunk, with the ranks of both stopped
 * (SIGSTOP, a node that has stalled), so that neither ends first on a loaded machine. `onLoss` sees the worker's name, then the worker goes (SIGKILL:
 * the node is gone, with every process on it; SIGTERM: a Spot notice, the worker stops its
 * activities and leaves, cleanly, its ranks running again) and the next one starts.
 */
async function interrupted(
  deps: ActivityDeps,
  spec: CampaignSpec,
  losses: ('SIGKILL' | 'SIGTERM')[],
  onLoss: (worker: string) => void = () => undefined,
) {
  const store = openStore(spec.store);
  const ranksPerShard = spec.rolloutEpWorldSize ?? 1;
  const queues = uniqueTaskQueues();
  const workers = [`${spec.name}-0`];
  // Rank slots for both shards at once (2 EP-2 shards: 4 ranks) whatever the host's CPUs, so
  // the lost worker is running both.
  const env = { ...process.env, MOERL_ROLLOUT_RANKS: '4' };
  const start = () => spawnRolloutWorker({ address: t.address, queues, dir, name: workers.at(-1)!, env });
  return withWorkers(
    t.nativeConnection,
    t.namespace,
    createActivities(deps),
    async () => {
      let worker = start();
      try {
        const handle = await startCampaign(t.client, spec, queues);
        const id = handle.workflowId;
        for (const [i, signal] of losses.entries()) {
          const iteration = i + 1;
          // Each shard's ranks are stopped as soon as all have started; then one shard at a time
          // runs until it has stored a chunk. With both running, a shard could store its first
          // chunk and finish the rest between two looks on a loaded machine.
          const shardPids = new Map<number, number[]>();
          await waitFor(
            `the ranks of both shards of iteration ${iteration} to start`,
            async () => {
              for (const shard of [0, 1]) {
                if (shardPids.has(shard)) continue;
                const ranks = shardRanks(workers.at(-1)!, id, iteration, shard);
                if (ranks.length < ranksPerShard) continue;
                for (const rank of ranks) process.kill(rank, 'SIGSTOP');
                shardPids.set(shard, ranks);
              }
              return shardPids.size === 2 ? true : undefined;
            },
            60_000,
            20,
          );
          for (const [shard, ranks] of shardPids) {
            for (const rank of ranks) process.kill(rank, 'SIGCONT');
            await waitFor(
              `shard ${shard} of iteration ${iteration} to store a chunk`,
              async () => ((await rolloutChunksStored(store, id, iteration, [shard])) > 0 ? true : undefined),
              60_000,
              10,
            );
            for (const rank of ranks) process.kill(rank, 'SIGSTOP');
          }
          const stopped = [...shardPids.values()].flat();
          onLoss(workers.at(-1)!);
          if (signal === 'SIGKILL') process.kill(-worker.pid!, 'SIGKILL');
          else {
            for (const rank of stopped) process.kill(rank, 'SIGCONT');
            worker.kill('SIGTERM');
          }
          await exited(worker);
          if (signal === 'SIGTERM')
            assert.equal(worker.exitCode, 0, 'the worker shuts down cleanly on SIGTERM');
          workers.push(`${spec.name}-${i + 1}`);
          worker = start();
        }
        await handle.result();
        return { id, workers, state: await handle.query<CampaignState>('status') };
      } finally {
        worker.kill('SIGTERM');
        await exited(worker);
      }
    },
    queues,
    ['control', 'train'],
  );
}

describe('interruptions', () => {
  test('Spot reclaim (SIGKILL) and a Spot notice (SIGTERM) mid-rollout: identical results, at most one chunk redone', async () => {
    const stop = new AbortController();
    const deps = workerActivityDeps(stop.signal, {
      ...process.env,
      MOERL_CACHE_DIR: join(dir, 'cache-main'),
    });
    const store = openStore(spec('x').store);

    const [reference] = await uninterrupted(deps, [spec('spot-reference')]);
    const outcome = await interrupted(deps, spec('spot-interrupted'), ['SIGKILL', 'SIGTERM']);

    const want = await assertSameArtifacts(store, reference!, outcome.id, 'the uninterrupted run');
    assert.ok(
      want.size >= 2 * 2 * 32 + 4,
      `rollout chunks and rewards files of both iterations (${want.size})`,
    );
    assert.deepEqual(
      await checkpointFiles(store, outcome.id, 2),
      await checkpointFiles(store, reference!, 2),
    );

    const redone = outcome.state.recentIterations.map((it) => it.chunksRedone);
    const retries = outcome.state.retries.rollout;
    console.log(
      `spot interruption: rollout retries ${retries}, chunks redone per iteration ${JSON.stringify(redone)} ` +
        `(2 shards interrupted per iteration, 32 chunks each)`,
    );
    assert.ok(retries >= 2, 'the interrupted shards were retried');
    for (const r of redone) assert.ok(r <= 2, `at most one chunk per interrupted shard was redone (${r})`);
  });

  test('Spot reclaim (SIGKILL) of a rollout on 2 expert-parallel ranks: identical results, at most one chunk redone', async () => {
    const stop = new AbortController();
    const deps = workerActivityDeps(stop.signal, {
      ...process.env,
      MOERL_CACHE_DIR: join(dir, 'cache-ep-main'),
      MOERL_ROLLOUT_RANKS: '4', // EP-2 shards on any host, one CPU included
    });
    const store = openStore(spec('x').store);
    const epSpec = (name: string) => ({ ...spec(name), iterations: 1, rolloutEpWorldSize: 2 });
    // Uninterrupted references: the same campaign, and one whose rollout runs on one rank.
    const [reference, oneRank] = await uninterrupted(deps, [
      epSpec('ep-reference'),
      { ...epSpec('ep1-reference'), rolloutEpWorldSize: 1 },
    ]);

    let running = 0;
    const outcome = await interrupted(deps, epSpec('ep-interrupted'), ['SIGKILL'], (worker) => {
      running = generatorLines(worker).length;
    });

    assert.equal(running, 2 * 2, 'each of the 2 shards ran on 2 moe_generate ranks');
    assert.deepEqual(generatorLines(outcome.workers[0]!), [], 'no rank outlived its worker');
    const want = await assertSameArtifacts(store, reference!, outcome.id, 'the uninterrupted EP-2 run');
    assert.ok(want.size >= 2 * 32 + 2, `rollout chunks and rewards files (${want.size})`);
    // One rank samples the same tokens; log-probs differ by rounding only (docs/native-model.md).
    let worst = 0;
    for (const [key, text] of await artifacts(store, oneRank!)) {
      if (!key.startsWith('rollouts/')) continue;
      const [a, b] = [text, want.get(key)!].map((t) =>
        t
          .split('\n')
          .filter(Boolean)
          .map((l) => parseRolloutLine(l, { source: key, line: 0 })),
      );
      assert.equal(a!.length, b!.length, key);
      a!.forEach((r, i) => {
        assert.deepEqual(b![i]!.tokens, r.tokens, `${key} sample ${i}: EP 2 samples EP 1's tokens`);
        r.logprobs.forEach((lp, j) => (worst = Math.max(worst, Math.abs(lp - b![i]!.logprobs[j]!))));
      });
    }
    assert.ok(worst <= 2e-6, `log-probs of EP 1 and EP 2 within rounding (${worst})`);
    const redone = outcome.state.recentIterations.map((it) => it.chunksRedone);
    console.log(
      `spot interruption, rollout EP 2 (largest |log-prob EP 2 - EP 1| ${worst.toExponential(2)}): rollout retries ${outcome.state.retries.rollout}, chunks redone ${JSON.stringify(redone)} (2 shards interrupted, 32 chunks each)`,
    );
    assert.ok(outcome.state.retries.rollout >= 2, 'both interrupted shards were retried');
    for (const r of redone) assert.ok(r <= 2, `at most one chunk per interrupted shard was redone (${r})`);
  });

  test('a trainer rank killed mid-update: the update is retried and commits what an uninterrupted run commits', async () => {
    const stop = new AbortController();
    const cache = join(dir, 'cache-train');
    const deps = workerActivityDeps(stop.signal, { ...process.env, MOERL_CACHE_DIR: cache });
    const store = openStore(spec('x').store);
    await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
      const reference = await startCampaign(t.client, spec('rank-reference'), queues);
      await reference.result();

      const handle = await startCampaign(t.client, spec('rank-killed'), queues);
      const jobDir = join(cache, 'jobs', `${handle.workflowId}-u1-`);
      const victim = await waitFor(
        'a rank of the iteration 1 update',
        async () => {
          const ranks = processes('moe_train grpo', jobDir).map(pidOf);
          return ranks.length === 2 ? ranks[1] : undefined;
        },
        60_000,
      );
      process.kill(victim, 'SIGKILL');
      await handle.result();
      const state = await handle.query<CampaignState>('status');
      assert.ok(state.retries.update >= 1, 'the update was retried');
      for (const it of [1, 2])
        assert.deepEqual(
          await checkpointFiles(store, handle.workflowId, it),
          await checkpointFiles(store, reference.workflowId, it),
          `checkpoint ${it} equals the uninterrupted run's`,
        );
    });
  });
});
