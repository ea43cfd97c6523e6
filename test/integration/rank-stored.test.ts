// No rank of a job exits 0 while another rank's outputs may still be missing from the store
// (issue 19): the job's last moe_train step keeps its group until every rank has stored its
// outputs (workers/rank.ts, MOERL_STORED_FD in native/tools/moe_cli.h). Before, each rank exited
// as soon as its own outputs were stored; on Kubernetes a rank lost after its peers had exited 0
// was then replaced alone, and a lone replacement never meets its group again (the Indexed Job
// never reruns an index that succeeded): test/k8s/gang-node.test.ts found it on a real node.
// Here two rank programs run locally over tcp, one of them held up (SIGSTOP) after its
// moe_train has written its outputs, before it has stored them, as a slow upload would be.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { after, describe, it } from 'node:test';
import type { RankJob } from '../../activities/launch/types.js';
import { rankPeerLostExitCode } from '../../activities/launch/types.js';
import { freePort } from '../../cli/dev-server.js';
import { nativeTools } from '../support/native-tools.js';

const tools = nativeTools(['moe_train']);
const rankProgram = fileURLToPath(new URL('../../workers/rank.js', import.meta.url));
const roots: string[] = [];
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

interface RankProcess {
  child: ChildProcess;
  exited: Promise<number | null>;
  log: () => string;
}

/** A job of `moe_train init` on 2 ranks (tcp on loopback), each rank program in its own group. */
async function startJob(root: string): Promise<RankProcess[]> {
  const job: RankJob = {
    store: { kind: 'fs', path: join(root, 'store') },
    checkpoints: [],
    inputLists: [],
    // prettier-ignore
    steps: [['init', '--out', '{work}/out', '--experts', '4', '--dim', '32', '--layers', '1', '--heads', '2', '--expert-dim', '32']],
    outputs: [{ dir: 'out', prefix: 'checkpoint' }],
  };
  const port = await freePort();
  return [0, 1].map((rank) => {
    const child = spawn(process.execPath, [rankProgram], {
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...tools.env,
        MOERL_RANK: String(rank),
        MOERL_WORLD_SIZE: '2',
        MOERL_COORDINATOR: `127.0.0.1:${port}`,
        MOERL_FI_PROVIDER: 'tcp',
        MOERL_JOB: JSON.stringify(job),
        MOERL_WORK_DIR: join(root, `work-${rank}`),
        MOERL_STARTUP_TIMEOUT_S: '60',
        MOERL_TIMEOUT_S: '60',
      },
    });
    let log = '';
    child.stdout!.on('data', (d: Buffer) => (log += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (log += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    return { child, exited, log: () => log };
  });
}

/** The pid of the moe_train a rank program runs, once it does. */
async function stepOf(program: number): Promise<number> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    for (const entry of readdirSync('/proc').filter((e) => /^\d+$/.test(e))) {
      try {
        const status = readFileSync(`/proc/${entry}/status`, 'utf8');
        if (/^Name:\s*moe_train$/m.test(status) && new RegExp(`^PPid:\\s*${program}$`, 'm').test(status))
          return Number(entry);
      } catch {
        continue; // gone meanwhile
      }
    }
    if (Date.now() > deadline) throw new Error(`rank program ${program} started no moe_train in 60 s`);
    await sleep(20);
  }
}

/** Waits until `dir` holds files: the step has written its outputs there. */
async function written(dir: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!existsSync(dir) || readdirSync(dir).length === 0) {
    if (Date.now() > deadline) throw new Error(`nothing written into ${dir} in 60 s`);
    await sleep(20);
  }
}

const stillRunning = (rank: RankProcess) =>
  Promise.race([rank.exited.then((code) => `exited ${code}`), sleep(0).then(() => 'running')]);

/**
 * A job whose rank 1 program is stopped (SIGSTOP) once its moe_train runs, so the step writes
 * its outputs and nobody stores them; after `ms` rank 0 must still be waiting for them.
 */
async function heldJob(ms: number): Promise<{ root: string; ranks: RankProcess[] }> {
  const root = mkdtempSync(join(tmpdir(), 'moerl-rank-stored-'));
  roots.push(root);
  const ranks = await startJob(root);
  const [rank0, rank1] = ranks;
  try {
    await stepOf(rank1!.child.pid!);
    process.kill(rank1!.child.pid!, 'SIGSTOP');
    await written(join(root, 'work-1', 'out'));
    await sleep(ms);
    assert.equal(
      await stillRunning(rank0!),
      'running',
      `rank 0 waits for rank 1's outputs to be stored:\n${rank0!.log()}`,
    );
  } catch (err) {
    for (const rank of ranks) if (rank.child.exitCode === null) process.kill(-rank.child.pid!, 'SIGKILL');
    throw err;
  }
  return { root, ranks };
}

describe(
  'a job of ranks stores every output before any rank exits (real moe_train)',
  { skip: tools.skip },
  () => {
    it('a rank held up before storing its outputs holds its peers; lost, it stops them with 75, never 0', async () => {
      const { ranks } = await heldJob(3000);
      const [rank0, rank1] = ranks;
      try {
        process.kill(-rank1!.child.pid!, 'SIGKILL'); // the pod of rank 1 is lost
        assert.equal(
          await rank0!.exited,
          rankPeerLostExitCode,
          `rank 0 stops as a peer was lost:\n${rank0!.log()}`,
        );
        assert.match(rank0!.log(), /rank 1 died/);
      } finally {
        for (const rank of [rank0, rank1])
          if (rank?.child.exitCode === null) process.kill(-rank.child.pid!, 'SIGKILL');
      }
    });

    it('held up for a while, every rank stores its outputs and then exits 0', async () => {
      const { root, ranks } = await heldJob(2000);
      const [rank0, rank1] = ranks;
      try {
        process.kill(rank1!.child.pid!, 'SIGCONT');
        assert.deepEqual(
          await Promise.all([rank0!.exited, rank1!.exited]),
          [0, 0],
          rank0!.log() + rank1!.log(),
        );
        // Both ranks' files, the checkpoint's manifest listing them all.
        const stored = readdirSync(join(root, 'store', 'checkpoint'));
        const manifest = JSON.parse(
          readFileSync(join(root, 'store', 'checkpoint', 'manifest.json'), 'utf8'),
        ) as {
          files: { name: string }[];
        };
        for (const file of manifest.files) assert.ok(stored.includes(file.name), `${file.name} stored`);
      } finally {
        for (const rank of [rank0, rank1])
          if (rank?.child.exitCode === null) process.kill(-rank.child.pid!, 'SIGKILL');
      }
    });
  },
);
