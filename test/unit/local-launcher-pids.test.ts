// LocalLauncher's trust in supervisor.pid, with real supervisors and rank programs whose jobs
// have no native step (so no native tools are needed): a pid file that is empty or garbage, a
// supervisor whose launching worker died before anyone wrote its pid, and a pid file naming a
// live process that is not the job's supervisor (the kernel reused the pid). A worker that
// trusted any of these adopted pid 0 (and kill() then signalled its own process group), started
// a second job of the same name, or SIGKILLed a stranger's process group.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  claimState,
  parseClaim,
  processStartTime,
  signalJobGroup,
} from '../../activities/launch/local-pid.js';
import type { LocalJobFile, LocalStatusFile } from '../../activities/launch/local-supervisor.js';
import { jobFiles } from '../../activities/launch/local-supervisor.js';
import { LocalLauncher, rankEnvironment } from '../../activities/launch/local.js';
import type { TrainJobSpec } from '../../activities/launch/types.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-local-pids-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** How long these tests let a job directory go without a supervisor before starting afresh. */
const startupGraceMs = 500;
const supervisorPath = fileURLToPath(new URL('../../activities/launch/local-supervisor.js', import.meta.url));

/** A job of 2 ranks with nothing to do: each rank starts, finds no step and exits 0. */
function spec(name: string): TrainJobSpec {
  return {
    name,
    worldSize: 2,
    job: {
      store: { kind: 'fs', path: join(dir, 'store') },
      checkpoints: [],
      inputLists: [],
      steps: [],
      outputs: [],
    },
    env: {},
    provider: 'shm',
    owner: { campaignId: 'c', iteration: 1, attempt: 1 },
  };
}

/** A job directory as a launcher leaves it after writing job.json (and nothing else yet). */
function jobDirWith(work: string, name: string, launchId: string): string {
  const jobDir = join(work, name);
  mkdirSync(jobDir, { recursive: true });
  const file: LocalJobFile = { spec: spec(name), launchId };
  writeFileSync(join(jobDir, jobFiles.job), JSON.stringify(file));
  return jobDir;
}

const launcher = (work: string) => new LocalLauncher(work, process.env, { startupGraceMs });

describe('LocalLauncher and supervisor.pid', () => {
  test('an empty or garbage supervisor.pid is never adopted (pid 0 is the worker’s own process group)', async () => {
    for (const [i, text] of ['', '0', 'not a pid'].entries()) {
      const work = join(dir, `garbage-${i}`);
      const jobDir = jobDirWith(work, 'job', `stale-${i}`);
      writeFileSync(join(jobDir, jobFiles.pid), text);
      const job = await launcher(work).launch(spec('job'));
      assert.equal(job.adopted, false, `supervisor.pid ${JSON.stringify(text)} was adopted`);
      const done = await job.wait();
      assert.equal(done.state, 'succeeded', `the job started afresh and ran: ${JSON.stringify(done)}`);
      const status = JSON.parse(readFileSync(join(jobDir, jobFiles.status), 'utf8')) as LocalStatusFile;
      assert.notEqual(status.launchId, `stale-${i}`);
    }
  });

  test('a supervisor whose worker died before its pid was written is adopted, not started twice', async () => {
    const work = join(dir, 'unwritten');
    const launchId = 'the-first-start';
    const jobDir = jobDirWith(work, 'job', launchId);
    // What the first worker did before it was killed: spawn the supervisor, nothing more.
    const supervisor = spawn(process.execPath, [supervisorPath, jobDir, launchId], {
      detached: true,
      stdio: 'ignore',
      env: rankEnvironment(process.env),
    });
    supervisor.unref();
    const job = await launcher(work).launch(spec('job'));
    assert.equal(job.adopted, true, 'the running supervisor was adopted');
    assert.equal((await job.wait()).state, 'succeeded');
    const status = JSON.parse(readFileSync(join(jobDir, jobFiles.status), 'utf8')) as LocalStatusFile;
    assert.equal(status.launchId, launchId, 'the first start ran the job; no second one was started');
  });

  test('a pid reused by another process is neither adopted nor signalled', async () => {
    const work = join(dir, 'reused');
    const jobDir = jobDirWith(work, 'job', 'long-gone');
    // A stranger leading a process group of its own, as a supervisor does, under the pid that
    // the job's dead supervisor once had.
    const stranger = spawn('sleep', ['60'], { detached: true, stdio: 'ignore' });
    const exited = new Promise((resolve) => stranger.once('exit', resolve));
    try {
      writeFileSync(join(jobDir, jobFiles.pid), String(stranger.pid));
      const job = await launcher(work).launch(spec('job'));
      assert.equal(job.adopted, false);
      assert.equal((await job.wait()).state, 'succeeded');
      assert.equal(stranger.exitCode, null, 'the stranger was not killed');
      assert.equal(stranger.signalCode, null, 'the stranger was not signalled');
      assert.ok(existsSync(`/proc/${stranger.pid}`));
    } finally {
      stranger.kill('SIGKILL');
      await exited;
    }
  });
});

describe('supervisor claims (local-pid.ts)', () => {
  test('only a whole claim with a pid above 1 is read; a bare pid, 0, 1, -1 or NaN never', () => {
    for (const text of ['', '0', '1', '-1', 'NaN', '4242', '{"pid"', 'null', '{"pid":4242}'])
      assert.equal(parseClaim(text), null, JSON.stringify(text));
    for (const pid of [0, 1, -1, 2.5, '4242', null])
      assert.equal(parseClaim(JSON.stringify({ pid, startTime: '1', launchId: 'l' })), null, String(pid));
    assert.deepEqual(parseClaim('{"pid":4242,"startTime":"77","launchId":"l"}'), {
      pid: 4242,
      startTime: '77',
      launchId: 'l',
    });
  });

  test('a live pid with another start time is another process; a reaped one is gone', async () => {
    const jobDir = join(dir, 'claims');
    const child = spawn('sleep', ['60'], { stdio: 'ignore' });
    const exited = new Promise((resolve) => child.once('exit', resolve));
    const pid = child.pid!;
    const startTime = processStartTime(pid);
    assert.match(startTime ?? '', /^\d+$/);
    assert.equal(
      claimState({ pid, startTime: String(Number(startTime) - 1), launchId: 'l' }, jobDir),
      'other',
    );
    assert.equal(claimState({ pid, startTime, launchId: 'l' }, jobDir), 'other', 'sleep is no supervisor');
    assert.equal(signalJobGroup({ pid, startTime: '1', launchId: 'l' }, jobDir, 'SIGKILL'), false);
    child.kill('SIGKILL');
    await exited;
    assert.equal(claimState({ pid, startTime, launchId: 'l' }, jobDir), 'gone');
    // Signal 0 only checks: were the guard missing, nothing would be hurt.
    for (const bad of [0, 1, -1, NaN])
      assert.equal(
        signalJobGroup({ pid: bad, startTime: null, launchId: 'l' }, jobDir, 0),
        false,
        String(bad),
      );
  });
});
