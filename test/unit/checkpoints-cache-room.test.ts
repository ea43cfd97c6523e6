// The checkpoint cache stays within its byte bound, which is its volume's size: room is made
// before a download (not after), a checkpoint larger than the bound fails at once and one that
// cannot fit beside the entries in use fails retryably, both downloading nothing; a lease whose
// pid now names another process holds nothing; a rollout cancelled while its checkpoint
// downloads ends at once; a fork copies its source within the store, never into the train
// worker's cache. Stores here are a real fs store behind fakes that watch or stall
// downloads.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import {
  CheckpointCache,
  cacheLimitsFromEnv,
  commitCheckpoint,
  stageCheckpoint,
} from '../../activities/checkpoints.js';
import { createActivities } from '../../activities/index.js';
import type { ActivityDeps } from '../../activities/index.js';
import { RankSlots } from '../../activities/rollout-capacity.js';
import { FsStore } from '../../activities/store/index.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CheckpointRef, PrepareOutput, RolloutShardInput } from '../../activities/types.js';
import { testSpec } from '../support/campaign-harness.js';
import { writeLocalCheckpoint } from '../support/checkpoint-fixtures.js';

const roots: string[] = [];
function freshRoot(): string {
  const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-room-'));
  roots.push(root);
  return root;
}
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

/** `n` committed checkpoints of a dense and one expert file of 4 KiB each. */
async function checkpoints(n: number): Promise<{ store: FsStore; refs: CheckpointRef[]; root: string }> {
  const root = freshRoot();
  const store = new FsStore(join(root, 'store'));
  const refs: CheckpointRef[] = [];
  for (let i = 0; i < n; i++) {
    writeLocalCheckpoint(join(root, `local-${i}`), { worldSize: 1, bytes: 4096 });
    const staged = await stageCheckpoint(store, join(root, `local-${i}`), 'c1', i);
    const opts = { meanReward: null, keepLast: 1000, keepBest: false, keepIteration: 0, now: new Date() };
    refs.push((await commitCheckpoint(store, staged, opts)).checkpoint);
  }
  return { store, refs, root };
}

/** Room for one such checkpoint (two 4 KiB files and a manifest), not two. */
const oneCheckpoint = 2 * 4096 + 2048;

const entries = (cacheDir: string) =>
  existsSync(join(cacheDir, 'checkpoints'))
    ? readdirSync(join(cacheDir, 'checkpoints')).filter((n) => /^[0-9a-f]{64}$/.test(n))
    : [];

/** The store, recording which complete entries the cache holds at each download. */
function watchingDownloads(store: ObjectStore, cacheDir: string) {
  const seen: string[][] = [];
  const watched = Object.create(store) as ObjectStore & { seen: string[][] };
  watched.seen = seen;
  watched.getFile = (key, path) => {
    seen.push(entries(cacheDir));
    return store.getFile(key, path);
  };
  return watched;
}

function failureType(err: unknown): string | undefined {
  return err instanceof ApplicationFailure ? (err.type ?? undefined) : undefined;
}

describe('checkpoint cache within its byte bound', () => {
  test("the bound follows the cache volume's size (k8s/ sets MOERL_CACHE_VOLUME_SIZE from its sizeLimit)", () => {
    assert.equal(
      cacheLimitsFromEnv({ MOERL_CACHE_VOLUME_SIZE: '20Gi' }).maxBytes,
      Math.floor(20 * 1024 ** 3 * 0.8),
    );
    assert.equal(
      cacheLimitsFromEnv({ MOERL_CACHE_VOLUME_SIZE: '4Gi', MOERL_CACHE_MAX_BYTES: '1G' }).maxBytes,
      1024 ** 3,
    );
    assert.throws(
      () => cacheLimitsFromEnv({ MOERL_CACHE_VOLUME_SIZE: 'big' }),
      /MOERL_CACHE_VOLUME_SIZE="big" is not a size/,
    );
  });

  test('the least recently used entry is evicted before the next download, not after it', async () => {
    const { store, refs } = await checkpoints(2);
    const cacheDir = freshRoot();
    const cache = new CheckpointCache(cacheDir, { maxCheckpoints: 10, maxBytes: oneCheckpoint });
    (await cache.acquire(store, refs[0]!)).release();
    await cache.settled();
    assert.deepEqual(entries(cacheDir), [refs[0]!.manifestSha256]);
    const watched = watchingDownloads(store, cacheDir);
    (await cache.acquire(watched, refs[1]!)).release();
    await cache.settled();
    assert.ok(watched.seen.length > 0);
    for (const during of watched.seen)
      assert.deepEqual(during, [], 'nothing else in the cache while the next one downloads');
    assert.deepEqual(entries(cacheDir), [refs[1]!.manifestSha256]);
  });

  test('a checkpoint larger than the bound fails at once, not retried, downloading nothing', async () => {
    const { store, refs } = await checkpoints(1);
    const cacheDir = freshRoot();
    const cache = new CheckpointCache(cacheDir, { maxCheckpoints: 4, maxBytes: 4096 });
    const watched = watchingDownloads(store, cacheDir);
    await assert.rejects(cache.acquire(watched, refs[0]!), (err: unknown) => {
      assert.equal(failureType(err), 'CheckpointCacheTooSmall');
      assert.equal((err as ApplicationFailure).nonRetryable, true);
      assert.match((err as Error).message, /MOERL_CACHE_MAX_BYTES=4096/);
      return true;
    });
    assert.equal(watched.seen.length, 0);
  });

  test('no room beside the entries in use: a retryable failure, downloading nothing; room once released', async () => {
    const { store, refs } = await checkpoints(2);
    const cacheDir = freshRoot();
    const cache = new CheckpointCache(cacheDir, { maxCheckpoints: 10, maxBytes: oneCheckpoint });
    const held = await cache.acquire(store, refs[0]!);
    const watched = watchingDownloads(store, cacheDir);
    await assert.rejects(cache.acquire(watched, refs[1]!), (err: unknown) => {
      assert.equal(failureType(err), 'CheckpointCacheFull');
      assert.notEqual((err as ApplicationFailure).nonRetryable, true);
      return true;
    });
    assert.equal(watched.seen.length, 0);
    held.release();
    await cache.settled();
    (await cache.acquire(store, refs[1]!)).release();
    await cache.settled();
    assert.deepEqual(entries(cacheDir), [refs[1]!.manifestSha256]);
  });

  test("a lease whose pid now names another process holds nothing (the holder's start time differs)", async () => {
    const { store, refs } = await checkpoints(2);
    const cacheDir = freshRoot();
    const holder = new CheckpointCache(cacheDir, { maxCheckpoints: 1, maxBytes: Infinity });
    await holder.acquire(store, refs[0]!);
    // The holder's lease, as if the holder had died and its pid been given to a live process
    // (our parent) since.
    const leases = join(cacheDir, 'checkpoints', '.leases');
    const [lease] = readdirSync(leases);
    renameSync(join(leases, lease!), join(leases, `${process.ppid}-0badcafe.json`));
    const other = new CheckpointCache(cacheDir, { maxCheckpoints: 1, maxBytes: Infinity });
    // Its in-memory hold stays: only the lease file speaks for it to other caches.
    (await other.acquire(store, refs[1]!)).release();
    await other.settled();
    assert.deepEqual(
      entries(cacheDir),
      [refs[1]!.manifestSha256],
      'the entry of the dead holder was evicted',
    );
  });
});

describe('rollout cancelled while its checkpoint downloads', () => {
  test('ends at once (the download may take minutes)', async () => {
    const { store, refs, root } = await checkpoints(1);
    let downloading!: () => void;
    const started = new Promise<void>((resolve) => (downloading = resolve));
    const stalled = Object.create(store) as ObjectStore;
    stalled.getFile = () => {
      downloading();
      return new Promise<void>(() => undefined);
    };
    const deps = {
      openStore: () => stalled,
      cacheDir: join(root, 'cache'),
      checkpoints: new CheckpointCache(join(root, 'cache')),
      binDir: join(root, 'no-bin'),
      shutdown: new AbortController().signal,
      workerId: 'host/1/abc',
      rolloutRanks: new RankSlots(2),
    } as unknown as ActivityDeps;
    const spec = testSpec({ rolloutEpWorldSize: 1 });
    const input: RolloutShardInput = {
      campaignId: 'c1',
      iteration: 1,
      shard: 0,
      spec,
      policy: refs[0]!,
      promptStart: 0,
      promptCount: 2,
      hyperparameters: spec.hyperparameters,
    };
    const env = new MockActivityEnvironment({ heartbeatTimeoutMs: 1000 });
    const run = env.run(createActivities(deps).rolloutShard, input);
    await started;
    env.cancel();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error('rolloutShard still running 5 s after the cancel')), 5000);
    });
    await assert.rejects(
      Promise.race([run, late]).finally(() => clearTimeout(timer)),
      (err: unknown) => {
        assert.equal(failureType(err), 'RolloutInterrupted', String(err));
        assert.match((err as Error).message, /the activity was cancelled/);
        return true;
      },
    );
  });
});

describe('a fork stages its source checkpoint', () => {
  test('within the store, streamed: nothing is downloaded to the worker', async () => {
    const { store, refs, root } = await checkpoints(1);
    const noDownloads = Object.create(store) as ObjectStore;
    noDownloads.getFile = (key) => Promise.reject(new Error(`downloaded ${key} to the worker`));
    const deps = {
      openStore: () => noDownloads,
      cacheDir: join(root, 'cache'),
      checkpoints: new CheckpointCache(join(root, 'cache'), { maxCheckpoints: 4, maxBytes: 1024 }),
      shutdown: new AbortController().signal,
      workerId: 'host/1/abc',
    } as unknown as ActivityDeps;
    const spec = testSpec({ store: { kind: 'fs', path: join(root, 'store') } });
    const env = new MockActivityEnvironment({ heartbeatTimeoutMs: 1000 });
    const out: PrepareOutput = await env.run(createActivities(deps).preparePolicy, {
      campaignId: 'fork-1',
      spec,
      source: { kind: 'fork' as const, checkpoint: refs[0]! },
    });
    assert.equal(out.staged.campaignId, 'fork-1');
    for (const f of out.staged.manifest.files)
      assert.deepEqual(
        await store.get(`${out.staged.key}/${f.name}`),
        await store.get(`${refs[0]!.key}/${f.name}`),
        f.name,
      );
    assert.deepEqual(entries(join(root, 'cache')), []);
  });
});
