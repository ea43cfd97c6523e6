// Trainer ranks with their own filesystems: a checkpoint saved by 4 real moe_train ranks is
// committed, each of 2 ranks fetches only its part (fetchCheckpointForRank), and moe_train
// on 2 ranks trains a step from those partial directories.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { commitCheckpoint, fetchCheckpointForRank, stageCheckpoint } from '../../activities/checkpoints.js';
import { FsStore } from '../../activities/store/index.js';
import { freePort } from '../../cli/dev-server.js';
import { nativeTools } from '../support/native-tools.js';

const tools = nativeTools(['moe_train']);
const roots: string[] = [];
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

/** Runs moe_train on `worldSize` local ranks (tcp on loopback); `args(rank)` per rank. */
async function ranks(worldSize: number, args: (rank: number) => string[]): Promise<void> {
  const port = await freePort();
  const exits = Array.from({ length: worldSize }, (_, rank) => {
    const child = spawn(tools.bin('moe_train'), args(rank), {
      env: {
        ...tools.env,
        MOERL_RANK: String(rank),
        MOERL_WORLD_SIZE: String(worldSize),
        MOERL_COORDINATOR: `127.0.0.1:${port}`,
        MOERL_FI_PROVIDER: 'tcp',
        MOERL_TIMEOUT_S: '60',
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    return new Promise<void>((resolve, reject) =>
      child.on('exit', (code) =>
        code === 0 ? resolve() : reject(new Error(`rank ${rank} exited with ${code}: ${stderr}`)),
      ),
    );
  });
  await Promise.all(exits);
}

describe('checkpoints for ranks in pods (real moe_train)', { skip: tools.skip }, () => {
  test('fetchCheckpointForRank: 2 ranks train from their own partial copies of a 4-rank checkpoint', async () => {
    const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-rank-native-'));
    roots.push(root);
    const saved = join(root, 'saved');
    // prettier-ignore
    await ranks(4, () => ['init', '--out', saved, '--experts', '8', '--dim', '32', '--layers', '1', '--heads', '2', '--expert-dim', '32']);
    const store = new FsStore(join(root, 'store'));
    const staged = await stageCheckpoint(store, saved, 'c1', 0);
    const opts = { meanReward: null, keepLast: 1, keepBest: false, keepIteration: 0, now: new Date() };
    const { checkpoint } = await commitCheckpoint(store, staged, opts);

    const dirs = [0, 1].map((r) => join(root, `rank-${r}`, 'policy'));
    for (const rank of [0, 1])
      await fetchCheckpointForRank(store, checkpoint, dirs[rank]!, { rank, worldSize: 2 });
    const expertFiles = (dir: string) =>
      readdirSync(dir)
        .filter((n) => n.startsWith('experts-'))
        .sort();
    assert.deepEqual(expertFiles(dirs[0]!), ['experts-rank0.safetensors', 'experts-rank1.safetensors']);
    assert.deepEqual(expertFiles(dirs[1]!), ['experts-rank2.safetensors', 'experts-rank3.safetensors']);

    const out = join(root, 'out');
    // prettier-ignore
    await ranks(2, (rank) => ['sft', '--checkpoint', dirs[rank]!, '--out', out, '--task', 'add', '--steps', '1']);
    assert.ok(readdirSync(out).includes('manifest.json'), 'the step saved a checkpoint');
  });
});
