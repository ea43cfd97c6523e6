// LocalLauncher: one process per rank on this machine, under a supervisor (local-supervisor.ts)
// that leads the job's own process group. A job is its directory `<work dir>/<job name>`:
// whoever creates the directory starts the job, and any worker process on the machine that
// launches the same name later finds it there and adopts it, so there is exactly one job per
// name. The supervisor names itself in the directory (local-pid.ts), and only a process that is
// that supervisor is adopted or signalled. An adopted job's files are never touched; a job whose
// supervisor died without finishing is killed as a group and started again.
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { openSync, closeSync } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  claimState,
  findSupervisor,
  parseClaim,
  processStartTime,
  signalJobGroup,
  supervisorPath,
  writeFileAtomic,
} from './local-pid.js';
import type { SupervisorClaim } from './local-pid.js';
import { jobFiles } from './local-supervisor.js';
import type { LocalJobFile, LocalStatusFile } from './local-supervisor.js';
import { deadlineEnv, newJobToken, rendezvousEnv } from './rendezvous.js';
import type { JobStatus, Launcher, TrainJob, TrainJobSpec } from './types.js';
import { rankDeadlines } from '../../workflows/spec-rendezvous.js';
import type { RankDeadlines } from '../../workflows/spec-rendezvous.js';

const pollMs = 250;
const stopGraceMs = 3000;
/** How long a starting job may have a directory but no supervisor yet (default). */
const startupGraceMs = 10_000;
/** Finished jobs' directories older than this are removed when another job launches. */
const finishedJobKeepMs = 10 * 60_000;

/**
 * The environment a rank sees: what the rank program, the store client and the native core read,
 * and nothing else of the worker's (no Temporal credentials, no unrelated secrets).
 */
export function rankEnvironment(env: NodeJS.ProcessEnv): Record<string, string> {
  const keep = (name: string) =>
    [
      'PATH',
      'HOME',
      'LANG',
      'LC_ALL',
      'TZ',
      'TMPDIR',
      'MOERL_NATIVE_BIN',
      'MOERL_CACHE_DIR',
      // where the PyTorch trainer's interpreter is (activities/engines/pytorch.ts)
      'MOERL_PYTORCH_PYTHON',
      'MOERL_TOOLS_DIR',
      'XDG_CACHE_HOME',
    ].includes(name) || /^(AWS_|FI_|OPENBLAS_|MOERL_FI_)/.test(name);
  return Object.fromEntries(
    Object.entries(env).filter((e): e is [string, string] => keep(e[0]) && e[1] !== undefined),
  );
}

async function readJson<T>(path: string): Promise<T | null> {
  try {
    return JSON.parse(await readFile(path, 'utf8')) as T;
  } catch {
    return null;
  }
}

class LocalJob implements TrainJob {
  private last: LocalStatusFile;
  private readonly done: Promise<JobStatus>;

  constructor(
    readonly name: string,
    private readonly dir: string,
    private readonly supervisor: SupervisorClaim,
    readonly adopted: boolean,
    worldSize: number,
  ) {
    this.last = {
      name,
      state: 'running',
      ranks: Array.from({ length: worldSize }, (_, rank) => ({
        rank,
        state: 'pending',
        exitCode: null,
        signal: null,
      })),
      failure: null,
      final: false,
      launchId: supervisor.launchId,
    };
    this.done = this.follow();
  }

  /** The job's status file, if it is this start's (a restart under the same name writes another's). */
  private async readStatus(): Promise<LocalStatusFile | null> {
    const status = await readJson<LocalStatusFile>(join(this.dir, jobFiles.status));
    return status?.launchId === this.supervisor.launchId ? status : null;
  }

  /** Follows status.json until it is final, or until the supervisor is gone without finishing. */
  private async follow(): Promise<JobStatus> {
    for (;;) {
      const status = await this.readStatus();
      if (status) this.last = status;
      if (this.last.final) return this.status();
      if (claimState(this.supervisor, this.dir) !== 'supervisor') {
        // Its last words may have landed between the read above and the check.
        const after = await this.readStatus();
        if (after?.final) {
          this.last = after;
          return this.status();
        }
        signalJobGroup(this.supervisor, this.dir, 'SIGKILL');
        this.last = {
          ...this.last,
          state: 'failed',
          final: true,
          failure: this.last.failure ?? {
            rank: null,
            exitCode: null,
            signal: 'SIGKILL',
            logTail: `the job's supervisor (pid ${this.supervisor.pid}) died before the job finished`,
            permanent: false,
          },
        };
        return this.status();
      }
      await sleep(pollMs);
    }
  }

  status(): JobStatus {
    const { final: _final, ...status } = this.last;
    return structuredClone(status);
  }

  wait(): Promise<JobStatus> {
    return this.done;
  }

  async kill(): Promise<void> {
    const signal = (s: NodeJS.Signals | 0) => signalJobGroup(this.supervisor, this.dir, s);
    if (signal('SIGTERM')) {
      const deadline = Date.now() + stopGraceMs;
      while (Date.now() < deadline && signal(0)) await sleep(100);
      signal('SIGKILL');
    }
    await this.done;
  }

  async cleanUp(): Promise<void> {
    await rm(this.dir, { recursive: true, force: true });
  }

  readLog(rank: number): Promise<Buffer> {
    return readFile(join(this.dir, jobFiles.rankLog(rank)));
  }
}

export interface LocalLauncherOptions {
  /** How long a job directory may have no supervisor before it counts as abandoned (10 s). */
  startupGraceMs?: number;
  /** The ranks' rendezvous deadlines (the spec's launcher section); absent: the defaults. */
  deadlines?: RankDeadlines;
}

export class LocalLauncher implements Launcher {
  private readonly startupGraceMs: number;
  private readonly deadlines: RankDeadlines;

  constructor(
    private readonly workDir: string,
    private readonly env: NodeJS.ProcessEnv = process.env,
    options: LocalLauncherOptions = {},
  ) {
    this.startupGraceMs = options.startupGraceMs ?? startupGraceMs;
    this.deadlines = options.deadlines ?? rankDeadlines({ kind: 'local' });
  }

  async launch(spec: TrainJobSpec): Promise<TrainJob> {
    await mkdir(this.workDir, { recursive: true });
    await this.removeFinishedJobs();
    const dir = join(this.workDir, spec.name);
    for (;;) {
      // Only this user may read the job's files or plant one (rank 0's coordinator.port).
      const created = await mkdir(dir, { mode: 0o700 }).then(
        () => true,
        (err: NodeJS.ErrnoException) => {
          if (err.code === 'EEXIST') return false;
          throw err;
        },
      );
      if (created) return this.start(spec, dir);
      const existing = await this.existing(spec, dir);
      if (existing) return existing;
    }
  }

  /** The job in `dir` if it can be adopted; otherwise it is removed and null returned. */
  private async existing(spec: TrainJobSpec, dir: string): Promise<TrainJob | null> {
    const started = Date.now();
    let job: LocalJobFile | null = null;
    let claim: SupervisorClaim | null = null;
    // Another worker may be starting it right now: it writes job.json, then spawns the
    // supervisor, which names itself as it starts. A supervisor found running before it has
    // written its claim is the one (the worker that spawned it may have died since).
    for (;;) {
      job = await readJson<LocalJobFile>(join(dir, jobFiles.job));
      if (job) {
        const written = parseClaim(await readFile(join(dir, jobFiles.pid), 'utf8').catch(() => null));
        claim = written?.launchId === job.launchId ? written : findSupervisor(dir, job.launchId);
        if (claim) break;
      }
      if (Date.now() - started >= this.startupGraceMs) break;
      await sleep(pollMs);
    }
    if (job && claim) {
      const status = await readJson<LocalStatusFile>(join(dir, jobFiles.status));
      const succeeded = status?.final && status.state === 'succeeded' && status.launchId === job.launchId;
      if (succeeded || claimState(claim, dir) === 'supervisor')
        return new LocalJob(spec.name, dir, claim, true, spec.worldSize);
      signalJobGroup(claim, dir, 'SIGKILL'); // ranks of a supervisor that died, if any are left
    }
    // A failed or abandoned job: set it aside atomically (of two workers only one wins the
    // rename), then start afresh.
    const aside = `${dir}.dead-${process.pid}-${Date.now()}`;
    await rename(dir, aside).catch(() => undefined);
    await rm(aside, { recursive: true, force: true });
    return null;
  }

  private async start(spec: TrainJobSpec, dir: string): Promise<TrainJob> {
    const file: LocalJobFile = { spec, launchId: randomUUID() };
    writeFileAtomic(join(dir, jobFiles.job), JSON.stringify(file));
    const out = openSync(join(dir, 'supervisor.log'), 'a');
    try {
      const child = spawn(process.execPath, [supervisorPath, dir, file.launchId], {
        detached: true, // a process group of its own: the job's
        stdio: ['ignore', out, out],
        // The job's token reaches its ranks through the supervisor's environment only: never
        // job.json (adopters need none; they only follow the job).
        env: {
          ...rankEnvironment(this.env),
          ...deadlineEnv(this.deadlines),
          [rendezvousEnv.jobToken]: newJobToken(),
        },
      });
      if (child.pid === undefined) throw new Error(`cannot start the supervisor of job ${spec.name}`);
      child.unref();
      // The supervisor writes its own claim; its start time is read here at once, while the
      // unreaped child still holds its pid.
      const claim = { pid: child.pid, startTime: processStartTime(child.pid), launchId: file.launchId };
      return new LocalJob(spec.name, dir, claim, false, spec.worldSize);
    } finally {
      closeSync(out);
    }
  }

  /** Directories of jobs that finished (or were abandoned) a while ago: nobody will adopt them. */
  private async removeFinishedJobs(): Promise<void> {
    const now = Date.now();
    for (const name of await readdir(this.workDir).catch(() => [] as string[])) {
      const dir = join(this.workDir, name);
      const info =
        (await stat(join(dir, jobFiles.status)).catch(() => null)) ?? (await stat(dir).catch(() => null));
      if (!info || now - info.mtimeMs < finishedJobKeepMs) continue;
      const status = await readJson<LocalStatusFile>(join(dir, jobFiles.status));
      const claim = parseClaim(await readFile(join(dir, jobFiles.pid), 'utf8').catch(() => null));
      if (status?.final || !claim || claimState(claim, dir) !== 'supervisor')
        await rm(dir, { recursive: true, force: true });
    }
  }
}
