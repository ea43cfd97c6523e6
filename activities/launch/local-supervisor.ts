// The supervisor of one local training job: `node local-supervisor.js <job dir>`. LocalLauncher
// starts it as the leader of a new process group, so the job's rank processes (its children)
// live in that group and die with it: killing the group kills the whole job, and nothing of a
// job outlives it. The supervisor outlives the worker that started it, so a retry on a new
// worker process finds the job through its directory and adopts it (local.ts).
//
// Files in the job directory (written by the supervisor unless noted):
//   job.json        the TrainJobSpec and this start's launchId (written by the launcher, atomically,
//                   before the supervisor starts)
//   supervisor.pid  the supervisor naming itself (local-pid.ts): its pid = the job's process group,
//                   its start time and launchId, written atomically before any rank starts
//   status.json     the JobStatus, replaced atomically whenever a rank changes state;
//                   `"final": true` once every rank has exited
//   coordinator.port.<i>  the port step i's rank 0 listens on, written by it (0600) once the
//                   kernel gave it one: the ranks' coordinator is 127.0.0.1:0, so no port is
//                   chosen and released for another local user to take first (workers/rank.ts)
//   rank-<r>.log    each rank's stdout and stderr
//   rank-<r>/       each rank's scratch directory (MOERL_WORK_DIR)
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeFileAtomic, writeOwnClaim } from './local-pid.js';
import type { JobStatus, RankStatus, TrainJobSpec } from './types.js';
import { rankEnv } from './types.js';

const logTailBytes = 4096;
const stopGraceMs = 3000;

export const rankProgramPath = fileURLToPath(new URL('../../workers/rank.js', import.meta.url));

export interface LocalJobFile {
  spec: TrainJobSpec;
  /** This start of the job: a later start under the same name (after a failure) has another. */
  launchId: string;
}

export interface LocalStatusFile extends JobStatus {
  final: boolean;
  launchId: string;
}

export const jobFiles = {
  job: 'job.json',
  pid: 'supervisor.pid',
  status: 'status.json',
  coordinatorPort: 'coordinator.port', // the rank program adds `.<step>`
  rankLog: (rank: number) => `rank-${rank}.log`,
  rankWork: (rank: number) => `rank-${rank}`,
};

function logTail(path: string): string {
  try {
    return readFileSync(path, 'utf8').slice(-logTailBytes).trim();
  } catch {
    return '';
  }
}

function supervise(jobDir: string, launchId: string): void {
  const file = JSON.parse(readFileSync(join(jobDir, jobFiles.job), 'utf8')) as LocalJobFile;
  // A start that was slow to run: its directory was set aside as abandoned and another start
  // owns the name now. It runs nothing.
  if (file.launchId !== launchId) {
    console.error(`supervisor: ${jobDir} belongs to start ${file.launchId}, not ${launchId}`);
    process.exit(1);
  }
  const { spec } = file;
  writeOwnClaim(jobDir, jobFiles.pid, launchId);
  const ranks: RankStatus[] = Array.from({ length: spec.worldSize }, (_, rank) => ({
    rank,
    state: 'running',
    exitCode: null,
    signal: null,
  }));
  const children: ChildProcess[] = [];
  let failure: JobStatus['failure'] = null;
  let stopping = false;

  const write = (final: boolean) => {
    const state = failure ? 'failed' : ranks.every((r) => r.state === 'succeeded') ? 'succeeded' : 'running';
    const status: LocalStatusFile = { name: spec.name, state, ranks, failure, final, launchId };
    writeFileAtomic(join(jobDir, jobFiles.status), JSON.stringify(status));
  };
  const stopAll = () => {
    for (const child of children)
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    setTimeout(() => {
      for (const child of children)
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }, stopGraceMs).unref();
  };

  let running = ranks.length;
  for (const rank of ranks) {
    const logPath = join(jobDir, jobFiles.rankLog(rank.rank));
    const log = createWriteStream(logPath);
    const work = join(jobDir, jobFiles.rankWork(rank.rank));
    mkdirSync(work, { recursive: true });
    // The supervisor's environment is already reduced to what a rank may see (local.ts).
    const child = spawn(process.execPath, [rankProgramPath], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        ...spec.env,
        [rankEnv.rank]: String(rank.rank),
        [rankEnv.worldSize]: String(spec.worldSize),
        [rankEnv.coordinator]: '127.0.0.1:0',
        [rankEnv.coordinatorPortFile]: join(jobDir, jobFiles.coordinatorPort),
        [rankEnv.provider]: spec.provider,
        [rankEnv.job]: JSON.stringify(spec.job),
        [rankEnv.workDir]: work,
      },
    });
    child.stdout!.pipe(log, { end: false });
    child.stderr!.pipe(log, { end: false });
    children.push(child);
    let finished = false;
    const finish = (code: number | null, signal: NodeJS.Signals | null) => {
      if (finished) return;
      finished = true;
      rank.exitCode = code;
      rank.signal = signal;
      rank.state = code === 0 ? 'succeeded' : 'failed';
      log.end(() => {
        // The first rank to fail is the cause; the others fail because it is gone.
        if (rank.state === 'failed' && failure === null) {
          failure = {
            rank: rank.rank,
            exitCode: code,
            signal,
            logTail: stopping ? 'stopped by the launcher' : logTail(logPath),
            permanent: code === 2,
          };
          stopAll();
        }
        running--;
        write(running === 0);
        if (running === 0) process.exit(0);
      });
    };
    child.on('error', (err) => {
      log.write(`supervisor: cannot start the rank program: ${err.message}\n`);
      finish(127, null);
    });
    child.on('exit', finish);
  }
  write(false);
  const onSignal = () => {
    stopping = true;
    stopAll();
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [jobDir, launchId] = process.argv.slice(2);
  if (!jobDir || !launchId) {
    console.error('usage: node local-supervisor.js <job dir> <launch id>');
    process.exit(2);
  }
  supervise(jobDir, launchId);
}
