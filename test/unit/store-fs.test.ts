// The fs ObjectStore: the shared contract suite, plus what only a directory can show —
// no temporary files or empty directories left behind, and openStore's path resolution.
import assert from 'node:assert/strict';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Readable } from 'node:stream';
import { after, describe, test } from 'node:test';
import { FsStore, openStore, StoreError } from '../../activities/store/index.js';
import { writeFileAtomically } from '../../activities/store/local-file.js';
import { keys, storeContract } from '../support/store-contract.js';

const roots: string[] = [];
function freshRoot(): string {
  const root = mkdtempSync(join(tmpdir(), 'moerl-store-fs-'));
  roots.push(root);
  return root;
}
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

storeContract('fs', async () => new FsStore(join(freshRoot(), 'store')));

describe('fs store', () => {
  test('writes leave no temporary files; deletes leave no empty directories', async () => {
    const root = freshRoot();
    const store = new FsStore(root);
    await store.put('campaigns/c1/checkpoints/000001/manifest.json', '{}');
    await store.createIfAbsent('campaigns/c1/checkpoints/000001/lock', 'x');
    await store.createIfAbsent('campaigns/c1/checkpoints/000001/lock', 'y');
    assert.deepEqual(readdirSync(join(root, 'campaigns/c1/checkpoints/000001')).sort(), [
      'lock',
      'manifest.json',
    ]);
    await store.put('campaigns/c1/spec.json', '{}');

    await store.deletePrefix('campaigns/c1/checkpoints/');
    assert.equal(existsSync(join(root, 'campaigns/c1/checkpoints')), false);
    assert.deepEqual(readdirSync(join(root, 'campaigns/c1')), ['spec.json']);
    await store.delete('campaigns/c1/spec.json');
    assert.deepEqual(readdirSync(root), []);
  });

  test('deletePrefix removes temporary files of dead writers, not those of live ones', async () => {
    const root = freshRoot();
    const store = new FsStore(root, { staleAfterMs: 60_000 });
    await store.put('campaigns/c1/checkpoints/000002/dense.safetensors', 'x');
    const dir = join(root, 'campaigns/c1/checkpoints/000002');
    const dead = join(dir, '.moerl-partial-0123456789abcdef');
    const live = join(root, 'campaigns/c1/checkpoints/000003/.moerl-partial-fedcba9876543210');
    writeFileSync(dead, 'half of a file');
    const anHourAgo = new Date(Date.now() - 3_600_000);
    utimesSync(dead, anHourAgo, anHourAgo);
    mkdirSync(dirname(live));
    writeFileSync(live, 'being written');
    assert.deepEqual(await keys(store, ''), ['campaigns/c1/checkpoints/000002/dense.safetensors']);

    assert.equal(await store.deletePrefix('campaigns/c1/checkpoints/'), 1);
    assert.equal(existsSync(dir), false);
    assert.equal(readFileSync(live, 'utf8'), 'being written');
  });

  test('a file and a directory of keys cannot share a name: a clear, non-retryable error', async () => {
    const store = new FsStore(freshRoot());
    await store.put('campaigns/c1/spec.json', '{}');
    await assert.rejects(
      store.put('campaigns/c1', 'x'),
      (err: unknown) =>
        err instanceof StoreError && !err.retryable && /campaigns\/c1: conflicts/.test(err.message),
    );
    await assert.rejects(store.put('campaigns/c1/spec.json/inner', 'x'), StoreError);
  });

  test('a local write that fails mid-way leaves the old file and no temporary file', async () => {
    const dir = freshRoot();
    const target = join(dir, 'policy.safetensors');
    await writeFileAtomically(target, Buffer.from('old'));
    const broken = Readable.from(
      (async function* () {
        yield Buffer.alloc(1 << 20);
        throw new Error('connection lost');
      })(),
    );
    await assert.rejects(writeFileAtomically(target, broken), /connection lost/);
    assert.deepEqual(readdirSync(dir), ['policy.safetensors']);
  });

  test('openStore: a relative fs path resolves against baseDir; describe names the folder', () => {
    const base = freshRoot();
    const store = openStore({ kind: 'fs', path: 'store' }, { baseDir: base });
    assert.equal(store.describe(), `fs:${join(base, 'store')}`);
    const absolute = openStore({ kind: 'fs', path: join(base, 'abs') }, { baseDir: '/elsewhere' });
    assert.equal(absolute.describe(), `fs:${join(base, 'abs')}`);
  });
});
