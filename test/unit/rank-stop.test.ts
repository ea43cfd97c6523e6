// The rank program stopped by SIGTERM (a Kueue preemption suspends the Job, a node is drained)
// exits 143 whatever its native step made of the signal, so the Job's podFailurePolicy can
// ignore the stop instead of counting it against backoffLimit. The native step here is a fake
// moe_train that waits to be killed.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, describe, test } from 'node:test';

const dir = mkdtempSync(join(tmpdir(), 'moerl-rank-stop-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const rankProgram = fileURLToPath(new URL('../../workers/rank.js', import.meta.url));

/** Runs the rank program with a fake moe_train, sends SIGTERM once the step runs; its exit code. */
function stoppedRank(fakeTool: string): Promise<number | null> {
  const bin = mkdtempSync(join(dir, 'bin-'));
  writeFileSync(join(bin, 'moe_train'), `#!/bin/sh\n${fakeTool}\n`);
  chmodSync(join(bin, 'moe_train'), 0o755);
  mkdirSync(join(dir, 'store'), { recursive: true });
  const job = {
    store: { kind: 'fs', path: join(dir, 'store') },
    checkpoints: [],
    inputLists: [],
    steps: [['grpo']],
    outputs: [],
  };
  const child = spawn(process.execPath, [rankProgram], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: {
      PATH: process.env.PATH,
      MOERL_NATIVE_BIN: bin,
      MOERL_RANK: '0',
      MOERL_WORLD_SIZE: '1',
      MOERL_JOB: JSON.stringify(job),
      MOERL_WORK_DIR: mkdtempSync(join(dir, 'work-')),
    },
  });
  child.stdout.on('data', (b: Buffer) => {
    if (b.toString().includes('step started')) child.kill('SIGTERM');
  });
  return new Promise((resolve) => child.on('exit', (code) => resolve(code)));
}

describe('rank program stopped by SIGTERM', () => {
  test('exits 143 when its native step dies of the signal', async () => {
    assert.equal(await stoppedRank('echo step started; exec sleep 30'), 143);
  });

  test('exits 143 when its native step turns the signal into exit 1', async () => {
    assert.equal(await stoppedRank("trap 'exit 1' TERM; echo step started; sleep 30 & wait"), 143);
  });
});
