// What a trainer rank with its own filesystem fetches of a checkpoint (dense plus the expert
// files covering its experts, verified), and staging from manifest text alone.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import {
  commitCheckpoint,
  fetchCheckpointForRank,
  rankFiles,
  sha256Hex,
  stagedCheckpointFromManifest,
} from '../../activities/checkpoints.js';
import * as keys from '../../activities/layout.js';
import { FsStore } from '../../activities/store/index.js';
import type { CheckpointManifest } from '../../activities/types.js';
import { writeLocalCheckpoint } from '../support/checkpoint-fixtures.js';

const roots: string[] = [];
function freshRoot(): string {
  const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-rank-'));
  roots.push(root);
  return root;
}
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

const opts = { meanReward: null, keepLast: 3, keepBest: false, keepIteration: 0, now: new Date() };

/** A checkpoint saved by `worldSize` ranks, its files uploaded one by one (as ranks in pods do). */
async function committedByRanks(worldSize: number, experts: number) {
  const root = freshRoot();
  const store = new FsStore(join(root, 'store'));
  const local = join(root, 'saved');
  writeLocalCheckpoint(local, { worldSize, experts });
  const key = keys.checkpointKey('c1', 5);
  for (const name of readdirSync(local))
    if (name !== 'manifest.json') await store.putFile(`${key}/${name}`, join(local, name));
  const text = await readFile(join(local, 'manifest.json'), 'utf8');
  const staged = stagedCheckpointFromManifest('c1', 5, text);
  const { checkpoint } = await commitCheckpoint(store, staged, opts);
  return { store, checkpoint, root };
}

const manifest = (worldSize: number, experts: number) =>
  ({
    format: 'moerl-checkpoint',
    world_size: worldSize,
    config: { num_experts: experts },
    files: [],
  }) as unknown as CheckpointManifest;
const experts = (...s: number[]) => ['dense.safetensors', ...s.map((r) => `experts-rank${r}.safetensors`)];

describe('checkpoints for one trainer rank', () => {
  test('fetchCheckpointForRank: the expert files a rank reads, for saved and running world sizes that differ', () => {
    // 8 experts saved by 4 ranks (2 each): running on 2 ranks, rank 1 owns experts 4..7.
    assert.deepEqual(rankFiles(manifest(4, 8), 'm', 0, 2), experts(0, 1));
    assert.deepEqual(rankFiles(manifest(4, 8), 'm', 1, 2), experts(2, 3));
    // Running on more ranks than saved: rank 5 of 8 owns expert 5, in saved file 2.
    assert.deepEqual(rankFiles(manifest(4, 8), 'm', 5, 8), experts(2));
    assert.deepEqual(rankFiles(manifest(1, 8), 'm', 3, 4), experts(0));
    assert.deepEqual(rankFiles(manifest(2, 8), 'm', 0, 1), experts(0, 1));
    assert.throws(() => rankFiles(manifest(4, 8), 'm', 0, 3), {
      message: 'm: 8 experts cannot be split evenly over 3 ranks',
    });
    assert.throws(() => rankFiles(manifest(3, 8), 'm', 0, 2), {
      message: 'm: world_size 3 does not divide num_experts 8',
    });
    assert.throws(() => rankFiles(manifest(4, 8), 'm', 2, 2), { message: 'rank 2 is not in [0, 2)' });
    assert.throws(
      () => rankFiles({ ...manifest(4, 8), config: {} }, 'm', 0, 2),
      /config.num_experts undefined/,
    );
  });

  test('fetchCheckpointForRank: fetches dense and the covering expert files, verified, manifest last', async () => {
    const { store, checkpoint, root } = await committedByRanks(4, 8);
    const dir = join(root, 'rank1');
    await fetchCheckpointForRank(store, checkpoint, dir, { rank: 1, worldSize: 2 });
    assert.deepEqual(readdirSync(dir).sort(), [...experts(2, 3), 'manifest.json'].sort());
    // A corrupt object in the store: BadInput naming the key, expected and actual.
    const key = `${checkpoint.key}/experts-rank0.safetensors`;
    await store.put(key, 'not the expert weights');
    const other = join(root, 'rank0');
    await assert.rejects(
      fetchCheckpointForRank(store, checkpoint, other, { rank: 0, worldSize: 2 }),
      (err: Error & { type?: string }) => {
        assert.equal(err.type, 'BadInput');
        assert.match(
          err.message,
          new RegExp(
            `checkpoint file ${key} is corrupt: 22 bytes, sha256 [0-9a-f]{64}; the manifest says \\d+ bytes, sha256 [0-9a-f]{64}`,
          ),
        );
        return true;
      },
    );
    assert.equal(existsSync(join(other, 'manifest.json')), false, 'incomplete: no manifest');
    // Files already there and matching are kept; a damaged local one is fetched again.
    writeFileSync(join(dir, 'experts-rank2.safetensors'), 'damaged');
    await fetchCheckpointForRank(store, checkpoint, dir, { rank: 1, worldSize: 2 });
    const m = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8')) as CheckpointManifest;
    const expected = m.files.find((f) => f.name === 'experts-rank2.safetensors')!;
    assert.equal(sha256Hex(await readFile(join(dir, 'experts-rank2.safetensors'))), expected.sha256);
  });

  test('stagedCheckpointFromManifest: builds the staged checkpoint from manifest text, and names bad text', () => {
    const staged = stagedCheckpointFromManifest(
      'c1',
      7,
      JSON.stringify({
        format: 'moerl-checkpoint',
        world_size: 1,
        files: [{ name: 'dense.safetensors', bytes: 3, sha256: 'a'.repeat(64) }],
      }),
    );
    assert.equal(staged.key, keys.checkpointKey('c1', 7));
    assert.equal(staged.manifest.files.length, 1);
    assert.throws(
      () => stagedCheckpointFromManifest('c1', 7, '{'),
      /the staged manifest of iteration 7 is not valid JSON/,
    );
    assert.throws(
      () =>
        stagedCheckpointFromManifest(
          'c1',
          7,
          JSON.stringify({
            format: 'moerl-checkpoint',
            files: [{ name: '../x', bytes: 3, sha256: 'a'.repeat(64) }],
          }),
          'rank 0 manifest',
        ),
      { message: 'rank 0 manifest files[0]: name "../x" is not a plain file name' },
    );
    assert.throws(
      () =>
        stagedCheckpointFromManifest(
          'c1',
          7,
          JSON.stringify({
            format: 'moerl-checkpoint',
            files: [{ name: 'dense.safetensors', bytes: 3, sha256: 'xyz' }],
          }),
        ),
      /files\[0\] \(dense.safetensors\): sha256 "xyz" is not 64 lowercase hex digits/,
    );
  });
});
