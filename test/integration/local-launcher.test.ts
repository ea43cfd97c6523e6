// LocalLauncher with real rank programs running native moe_train: exactly one job per name on
// the machine whichever worker process launches it, ranks in a process group that dies with
// the job, adopted jobs' files untouched, ranks that see only what the rank contract gives.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { LocalLauncher, rankEnvironment } from '../../activities/launch/local.js';
import type { TrainJobSpec } from '../../activities/launch/types.js';
import { nativeTools } from '../support/native-tools.js';

const tools = nativeTools(['moe_train']);
const dir = mkdtempSync(join(tmpdir(), 'moerl-local-launcher-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const env = {
  ...process.env,
  MOERL_NATIVE_BIN: join(tools.bin('moe_train'), '..'),
  TEMPORAL_API_KEY: 'secret-key',
};

/**
 * A job whose ranks run sgemm: a few seconds by default (long enough to be adopted while
 * running), far longer than any test with `untilKilled` (those tests stop it themselves).
 */
const untilKilled = 1_000_000;
function spec(name: string, repeats = 400): TrainJobSpec {
  return {
    name,
    worldSize: 2,
    job: {
      store: { kind: 'fs', path: join(dir, 'store') },
      checkpoints: [],
      inputLists: [],
      steps: [['sgemm', '--size', '512', '--repeats', String(repeats)]],
      outputs: [],
    },
    env: {},
    provider: 'shm',
    owner: { campaignId: 'c', iteration: 1, attempt: 1 },
  };
}

/** Pids of the processes whose command line names `needle`. */
function processesNaming(needle: string): number[] {
  return readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(needle);
      } catch {
        return false;
      }
    })
    .map(Number);
}

/** Pids of the rank programs of the job in `jobDir` (their scratch directories are in it). */
function rankPidsOf(jobDir: string): number[] {
  return processesNaming('rank.js').filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/environ`, 'utf8').includes(`MOERL_WORK_DIR=${jobDir}/`);
    } catch {
      return false;
    }
  });
}

/** Waits (on a loaded machine, for a while) until both ranks of the job in `jobDir` run. */
async function ranksRunning(jobDir: string): Promise<number[]> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const pids = rankPidsOf(jobDir);
    if (pids.length === 2) return pids;
    if (Date.now() > deadline)
      throw new Error(`the ranks of ${jobDir} did not start: ${pids.length} running`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The pids of `pids` still alive after waiting up to 10 s for them to go. */
async function stillAlive(pids: number[]): Promise<number[]> {
  const deadline = Date.now() + 10_000;
  let alive = pids.filter((pid) => existsSync(`/proc/${pid}`));
  while (alive.length > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    alive = alive.filter((pid) => existsSync(`/proc/${pid}`));
  }
  return alive;
}

/** Launches `name` from a separate node process (another worker) and reports whether it adopted. */
async function launchFromAnotherProcess(
  work: string,
  name: string,
): Promise<{ adopted: boolean; state: string }> {
  const local = fileURLToPath(new URL('../../activities/launch/local.js', import.meta.url));
  const script = `
    const { LocalLauncher } = await import(${JSON.stringify(local)});
    const job = await new LocalLauncher(${JSON.stringify(work)}).launch(${JSON.stringify(spec(name))});
    console.log(JSON.stringify({ adopted: job.adopted, state: (await job.wait()).state }));`;
  const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], {
    env,
  });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as { adopted: boolean; state: string };
}

describe('LocalLauncher (real rank programs)', { skip: tools.skip }, () => {
  test('exactly one job per name: a launch from another worker process adopts the running job', async () => {
    const work = join(dir, 'jobs-adopt');
    const job = await new LocalLauncher(work, env).launch(spec('adopt-me'));
    assert.equal(job.adopted, false);
    const sentinel = join(work, 'adopt-me', 'rank-0', 'kept.txt');
    await ranksRunning(join(work, 'adopt-me'));
    writeFileSync(sentinel, 'the job wrote this');
    const other = await launchFromAnotherProcess(work, 'adopt-me');
    assert.deepEqual(other, { adopted: true, state: 'succeeded' });
    assert.equal((await job.wait()).state, 'succeeded');
    assert.equal(processesNaming(join(work, 'adopt-me')).length, 0, 'one job ran, and it is gone');
    const log = readFileSync(join(work, 'adopt-me', 'rank-0.log'), 'utf8');
    assert.equal(log.match(/"sgemm_size"/g)?.length ?? 0, 1, `one sgemm run on rank 0, not two:\n${log}`);
    assert.ok(
      existsSync(sentinel) || !existsSync(join(work, 'adopt-me', 'rank-0')),
      'adoption touched no file',
    );
    await job.cleanUp();
    assert.equal(existsSync(join(work, 'adopt-me')), false);
  });

  test('ranks live in the job’s process group: kill() leaves no process of the job', async () => {
    const work = join(dir, 'jobs-kill');
    const job = await new LocalLauncher(work, env).launch(spec('kill-me', untilKilled));
    const ranks = await ranksRunning(join(work, 'kill-me'));
    await job.kill();
    const status = await job.wait();
    assert.equal(status.state, 'failed');
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(processesNaming(join(work, 'kill-me')), [], 'no supervisor is left');
    assert.deepEqual(await stillAlive(ranks), [], 'no rank is left');
  });

  test('a job whose supervisor died is killed as a group and started again by the next launch', async () => {
    const work = join(dir, 'jobs-orphan');
    const first = await new LocalLauncher(work, env).launch(spec('orphan', untilKilled));
    const ranks = await ranksRunning(join(work, 'orphan'));
    const { pid } = JSON.parse(readFileSync(join(work, 'orphan', 'supervisor.pid'), 'utf8')) as {
      pid: number;
    };
    process.kill(pid, 'SIGKILL'); // the supervisor alone: its ranks are orphaned in its group
    // The signal lands when the kernel next runs it: on a loaded host, not at once.
    for (let waited = 0; processesNaming(join(work, 'orphan')).includes(pid); waited += 50) {
      if (waited > 10_000) throw new Error(`the supervisor ${pid} outlived SIGKILL by 10 s`);
      await new Promise((r) => setTimeout(r, 50));
    }
    const again = await new LocalLauncher(work, env).launch(spec('orphan', 1));
    assert.equal(again.adopted, false, 'a job without its supervisor is not adopted');
    assert.equal((await again.wait()).state, 'succeeded');
    assert.equal((await first.wait()).state, 'failed');
    assert.deepEqual(await stillAlive(ranks), [], 'the orphaned ranks were killed');
  });

  test('each step forms its group through the port its own rank 0 publishes in the job directory', async () => {
    const work = join(dir, 'jobs-group');
    const grouped = spec('group');
    // Two moe_train inits, each meeting every rank at its own rank 0's coordinator (a step's
    // rank 1 must not dial the port of the step before it, whose rank 0 is gone); sgemm after
    // them, so no init is the last step (that one waits for the outputs to be stored).
    const init = (out: string) =>
      // prettier-ignore
      ['init', '--out', `{work}/${out}`, '--experts', '4', '--dim', '32', '--layers', '1', '--heads', '2', '--expert-dim', '32'];
    grouped.job.steps = [init('a'), init('b'), ['sgemm', '--size', '64', '--repeats', '1']];
    const launcher = new LocalLauncher(work, env, {
      deadlines: { startupTimeoutSeconds: 20, exchangeTimeoutSeconds: 20 },
    });
    const job = await launcher.launch(grouped);
    const status = await job.wait();
    const logs = [0, 1].map((r) => readFileSync(join(work, 'group', `rank-${r}.log`), 'utf8')).join('\n');
    assert.equal(status.state, 'succeeded', logs);
    for (const step of [0, 1]) {
      const portFile = join(work, 'group', `coordinator.port.${step}`);
      assert.match(readFileSync(portFile, 'utf8'), /^[1-9]\d*\n$/);
      assert.equal(statSync(portFile).mode & 0o777, 0o600);
    }
    await job.cleanUp();
  });

  test('ranks see the rank contract (a job token, the deadlines) and the store credentials, not the worker’s secrets', async () => {
    const work = join(dir, 'jobs-env');
    const job = await new LocalLauncher(work, { ...env, AWS_ACCESS_KEY_ID: 'store-key' }).launch(
      spec('env', untilKilled),
    );
    const rankPids = await ranksRunning(join(work, 'env'));
    const environ = readFileSync(`/proc/${rankPids[0]}/environ`, 'utf8').split('\0');
    const jobDir = join(work, 'env');
    const jobFileTexts = readdirSync(jobDir, { withFileTypes: true })
      .filter((f) => f.isFile())
      .map((f) => readFileSync(join(jobDir, f.name), 'utf8'));
    const jobDirMode = statSync(jobDir).mode & 0o777;
    const jobFile = JSON.parse(readFileSync(join(jobDir, 'job.json'), 'utf8')) as object;
    await job.kill();
    assert.ok(environ.includes('MOERL_RANK=0') || environ.includes('MOERL_RANK=1'), environ.join(' '));
    // No port chosen ahead and released (another local user could bind it first): rank 0 binds
    // port 0 and publishes what it got in the job's own directory, which only this user reads.
    assert.ok(environ.includes('MOERL_COORDINATOR=127.0.0.1:0'), environ.join(' '));
    assert.ok(environ.includes(`MOERL_COORDINATOR_PORT_FILE=${join(jobDir, 'coordinator.port')}`));
    assert.equal(jobDirMode, 0o700);
    assert.deepEqual(Object.keys(jobFile).sort(), ['launchId', 'spec'], 'job.json names no port');
    // The rendezvous: a fresh job token (in no file of the job) and the default deadlines.
    const token =
      environ.find((e) => e.startsWith('MOERL_JOB_TOKEN='))?.slice('MOERL_JOB_TOKEN='.length) ?? '';
    assert.match(token, /^[A-Za-z0-9_-]{43}$/, 'a job token');
    assert.ok(!jobFileTexts.some((text) => text.includes(token)), 'the token is written to no job file');
    assert.ok(environ.includes('MOERL_STARTUP_TIMEOUT_S=600'), 'the local start-up deadline');
    assert.ok(environ.includes('MOERL_TIMEOUT_S=60'), 'the exchange deadline');
    assert.ok(environ.includes('AWS_ACCESS_KEY_ID=store-key'));
    assert.ok(!environ.some((e) => e.startsWith('TEMPORAL_API_KEY=')), 'no Temporal credentials');
    assert.deepEqual(
      Object.keys(rankEnvironment({ TEMPORAL_API_KEY: 'x', PATH: '/bin', FI_PROVIDER: 'tcp' })).sort(),
      ['FI_PROVIDER', 'PATH'],
    );
  });
});
