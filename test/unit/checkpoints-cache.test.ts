// The worker's checkpoint cache is bounded (count, bytes), evicts least recently used first,
// also across a restart, and never evicts an entry in use — in this process or another.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  truncateSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createInterface } from 'node:readline';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  acquireCheckpoint,
  CheckpointCache,
  cacheLimitsFromEnv,
  commitCheckpoint,
  sha256Hex,
  stageCheckpoint,
} from '../../activities/checkpoints.js';
import { FsStore } from '../../activities/store/index.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CheckpointRef } from '../../activities/types.js';
import { writeLocalCheckpoint } from '../support/checkpoint-fixtures.js';

const roots: string[] = [];
function freshRoot(): string {
  const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-cache-'));
  roots.push(root);
  return root;
}
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

const fileBytes = 4096;
/** Each checkpoint: dense + one expert file of 4 KiB, and the manifest. */
async function checkpoints(n: number): Promise<{ store: FsStore; refs: CheckpointRef[] }> {
  const root = freshRoot();
  const store = new FsStore(join(root, 'store'));
  const refs: CheckpointRef[] = [];
  for (let i = 0; i < n; i++) {
    const dir = join(root, `local-${i}`);
    writeLocalCheckpoint(dir, { worldSize: 1, bytes: fileBytes });
    const staged = await stageCheckpoint(store, dir, 'c1', i);
    const opts = { meanReward: null, keepLast: 1000, keepBest: false, keepIteration: 0, now: new Date() };
    refs.push((await commitCheckpoint(store, staged, opts)).checkpoint);
  }
  return { store, refs };
}

/** Complete entries in the cache: their manifest sha256s. */
const entries = (cacheDir: string) =>
  existsSync(join(cacheDir, 'checkpoints'))
    ? readdirSync(join(cacheDir, 'checkpoints')).filter((n) => /^[0-9a-f]{64}$/.test(n))
    : [];

async function assertComplete(dir: string, ref: CheckpointRef) {
  assert.equal(sha256Hex(await readFile(join(dir, 'manifest.json'))), ref.manifestSha256, dir);
  const manifest = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8')) as {
    files: { name: string; sha256: string }[];
  };
  for (const f of manifest.files)
    assert.equal(sha256Hex(await readFile(join(dir, f.name))), f.sha256, f.name);
}

/** Counts getFile calls: downloads. */
function countingDownloads(store: ObjectStore) {
  const counted = Object.create(store) as ObjectStore & { downloads: number };
  counted.downloads = 0;
  counted.getFile = (key, path) => {
    counted.downloads++;
    return store.getFile(key, path);
  };
  return counted;
}

describe('bounded checkpoint cache', () => {
  test('bounded checkpoint cache: many acquires and releases of distinct checkpoints keep it within its count and byte bounds', async () => {
    const { store, refs } = await checkpoints(10);
    const byCount = freshRoot();
    const cache = new CheckpointCache(byCount, { maxCheckpoints: 3, maxBytes: Infinity });
    for (const round of [0, 1])
      for (const ref of round ? [...refs].reverse() : refs) {
        const lease = await acquireCheckpoint(store, ref, cache);
        await assertComplete(lease.dir, ref);
        lease.release();
        await cache.settled();
        assert.ok(entries(byCount).length <= 3, `${entries(byCount).length} entries`);
      }
    assert.equal(entries(byCount).length, 3);

    const entryBytes =
      2 * fileBytes + statSync(join(byCount, 'checkpoints', entries(byCount)[0]!, 'manifest.json')).size;
    const byBytes = freshRoot();
    const small = new CheckpointCache(byBytes, {
      maxCheckpoints: 100,
      maxBytes: Math.floor(2.5 * entryBytes),
    });
    for (const ref of refs) {
      const lease = await small.acquire(store, ref);
      lease.release();
      await small.settled();
      assert.ok(entries(byBytes).length <= 2, `${entries(byBytes).length} entries`);
    }
    assert.equal(entries(byBytes).length, 2);
  });

  test('bounded checkpoint cache: an entry in use is never evicted, even when that leaves the cache over its bound', async () => {
    const { store, refs } = await checkpoints(6);
    const dir = freshRoot();
    const cache = new CheckpointCache(dir, { maxCheckpoints: 1, maxBytes: Infinity });
    const held = await cache.acquire(store, refs[0]!);
    const second = await cache.acquire(store, refs[1]!);
    assert.equal(entries(dir).length, 2, 'both in use: over the bound for now');
    second.release();
    await cache.settled();
    assert.deepEqual(entries(dir), [refs[0]!.manifestSha256], 'the released one goes, the held one stays');
    // Acquires and releases of others, concurrently, while one stays held.
    await Promise.all(
      refs.slice(1).map(async (ref) => {
        const lease = await cache.acquire(store, ref);
        await assertComplete(lease.dir, ref);
        lease.release();
      }),
    );
    await cache.settled();
    await assertComplete(held.dir, refs[0]!);
    assert.deepEqual(entries(dir), [refs[0]!.manifestSha256]);
    held.release();
    held.release(); // a second release is ignored
    const next = await cache.acquire(store, refs[1]!);
    assert.deepEqual(entries(dir), [refs[1]!.manifestSha256], 'released: now it can go');
    next.release();
    await cache.settled();
  });

  test('bounded checkpoint cache: concurrent acquires of one checkpoint share one download', async () => {
    const { store, refs } = await checkpoints(1);
    const counted = countingDownloads(store);
    const cache = new CheckpointCache(freshRoot(), { maxCheckpoints: 2, maxBytes: Infinity });
    const leases = await Promise.all([1, 2, 3, 4, 5].map(() => cache.acquire(counted, refs[0]!)));
    assert.equal(counted.downloads, 2, 'each of its two files once');
    for (const l of leases) assert.equal(l.dir, leases[0]!.dir);
    for (const l of leases) l.release();
    await cache.settled();
    (await cache.acquire(counted, refs[0]!)).release();
    assert.equal(counted.downloads, 2, 'cached: no download');
  });

  test('bounded checkpoint cache: an entry written over in the cache (a file changed, cut short, another manifest) is fetched again, never used', async () => {
    // Before: an entry counted as installed once its manifest.json existed.
    const { store, refs } = await checkpoints(2);
    const counted = countingDownloads(store);
    const cache = new CheckpointCache(freshRoot(), { maxCheckpoints: 2, maxBytes: Infinity });
    const use = async (ref: CheckpointRef) => {
      const lease = await cache.acquire(counted, ref);
      await assertComplete(lease.dir, ref);
      lease.release();
      await cache.settled();
      return lease.dir;
    };
    const dir = await use(refs[0]!);
    assert.equal(counted.downloads, 2);
    const dense = join(dir, 'dense.safetensors');
    const original = readFileSync(dense);
    const damages: [string, () => void][] = [
      [
        'one byte changed, same size',
        () => writeFileSync(dense, Buffer.from(original.map((b, i) => (i === 100 ? b ^ 0xff : b)))),
      ],
      ['cut short', () => truncateSync(dense, original.length - 1)],
      [
        "another checkpoint's manifest",
        () =>
          copyFileSync(
            join(cache.root, refs[1]!.manifestSha256, 'manifest.json'),
            join(dir, 'manifest.json'),
          ),
      ],
    ];
    await use(refs[1]!);
    for (const [how, damage] of damages) {
      const before: number = counted.downloads;
      await sleep(20); // past the file system's clock tick: the write has a ctime of its own
      damage();
      assert.equal(await use(refs[0]!), dir, how);
      assert.equal(counted.downloads, before + 2, `${how}: fetched again`);
      await use(refs[0]!);
      assert.equal(counted.downloads, before + 2, `${how}: then cached`);
    }
  });

  test('bounded checkpoint cache: a restarted cache (new object, same directory) evicts the least recently used first', async () => {
    const { store, refs } = await checkpoints(5);
    const [a, b, c, d, e] = refs as [
      CheckpointRef,
      CheckpointRef,
      CheckpointRef,
      CheckpointRef,
      CheckpointRef,
    ];
    const dir = freshRoot();
    const first = new CheckpointCache(dir, { maxCheckpoints: 3, maxBytes: Infinity });
    for (const ref of [a, b, c, a]) {
      (await first.acquire(store, ref)).release();
      await first.settled();
    }
    const restarted = new CheckpointCache(dir, { maxCheckpoints: 3, maxBytes: Infinity });
    (await restarted.acquire(store, d)).release();
    await restarted.settled();
    assert.deepEqual(
      entries(dir).sort(),
      [a, c, d].map((r) => r.manifestSha256).sort(),
      'b was used least recently',
    );
    (await restarted.acquire(store, e)).release();
    await restarted.settled();
    assert.deepEqual(entries(dir).sort(), [a, d, e].map((r) => r.manifestSha256).sort(), 'then c');
  });

  test('bounded checkpoint cache: an entry another live worker process holds is never evicted; a dead one holds nothing', async () => {
    const { store, refs } = await checkpoints(3);
    const dir = freshRoot();
    const module = fileURLToPath(new URL('../../activities/checkpoints.js', import.meta.url));
    const storeModule = fileURLToPath(new URL('../../activities/store/index.js', import.meta.url));
    const script = `
      const { CheckpointCache } = await import(${JSON.stringify(module)});
      const { FsStore } = await import(${JSON.stringify(storeModule)});
      const cache = new CheckpointCache(${JSON.stringify(dir)}, { maxCheckpoints: 1, maxBytes: Infinity });
      await cache.acquire(new FsStore(${JSON.stringify(store.root)}), ${JSON.stringify(refs[0])});
      console.log('held');
      setInterval(() => {}, 1000);`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      const lines = createInterface({ input: child.stdout! });
      for await (const line of lines) if (line === 'held') break;
      const cache = new CheckpointCache(dir, { maxCheckpoints: 1, maxBytes: Infinity });
      (await cache.acquire(store, refs[1]!)).release();
      await cache.settled();
      assert.deepEqual(entries(dir), [refs[0]!.manifestSha256], 'the other process holds it');
      child.kill('SIGKILL');
      await new Promise((resolve) => child.once('exit', resolve));
      (await cache.acquire(store, refs[2]!)).release();
      await cache.settled();
      assert.deepEqual(entries(dir), [refs[2]!.manifestSha256], 'its holder died');
    } finally {
      child.kill('SIGKILL');
    }
  });

  test('bounded checkpoint cache: partial directories of dead downloads go once stale, fresh ones stay', async () => {
    const { store, refs } = await checkpoints(1);
    const dir = freshRoot();
    const stale = join(dir, 'checkpoints', `${'a'.repeat(64)}.partial-999999-deadbeef`);
    const fresh = join(dir, 'checkpoints', `${'b'.repeat(64)}.partial-999999-cafebabe`);
    for (const p of [stale, fresh]) mkdirSync(p, { recursive: true });
    const hourAgo = new Date(Date.now() - 3600_000);
    utimesSync(stale, hourAgo, hourAgo);
    const cache = new CheckpointCache(dir, { maxCheckpoints: 0, maxBytes: Infinity });
    (await cache.acquire(store, refs[0]!)).release();
    await cache.settled();
    assert.equal(existsSync(stale), false);
    assert.equal(existsSync(fresh), true);
    assert.deepEqual(entries(dir), [], 'maxCheckpoints 0: nothing kept once released');
  });

  test('bounded checkpoint cache: limits from MOERL_CACHE_MAX_CHECKPOINTS and MOERL_CACHE_MAX_BYTES', () => {
    assert.deepEqual(cacheLimitsFromEnv({}), { maxCheckpoints: 4, maxBytes: Infinity });
    assert.deepEqual(
      cacheLimitsFromEnv({ MOERL_CACHE_MAX_CHECKPOINTS: '2', MOERL_CACHE_MAX_BYTES: '1000' }),
      {
        maxCheckpoints: 2,
        maxBytes: 1000,
      },
    );
    assert.equal(cacheLimitsFromEnv({ MOERL_CACHE_MAX_BYTES: '50G' }).maxBytes, 50 * 1024 ** 3);
    assert.equal(cacheLimitsFromEnv({ MOERL_CACHE_MAX_BYTES: '1.5TiB' }).maxBytes, 1.5 * 1024 ** 4);
    assert.throws(
      () => cacheLimitsFromEnv({ MOERL_CACHE_MAX_CHECKPOINTS: 'four' }),
      /MOERL_CACHE_MAX_CHECKPOINTS="four"/,
    );
    assert.throws(
      () => cacheLimitsFromEnv({ MOERL_CACHE_MAX_BYTES: '-1' }),
      /MOERL_CACHE_MAX_BYTES="-1" is not a size/,
    );
  });
});
