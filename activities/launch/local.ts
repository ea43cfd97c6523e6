// LocalLauncher: one process per rank on this machine, under a supervisor (local-supervisor.ts)
// that leads the job's own process group. A job is its directory `<work dir>/<job name>`:
// whoever creates the directory starts the job, and any worker process on the machine that
// launches the same name later finds it there and adopts it, so there is exactly one job per
// name. An adopted job's files are never touched; a job whose supervisor died without
// finishing is killed as a group and started again.
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { openSync, closeSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { jobFiles } from './local-supervisor.js';
import type { LocalJobFile, LocalStatusFile } from './local-supervisor.js';
import type { JobStatus, Launcher, TrainJob, TrainJobSpec } from './types.js';

const pollMs = 250;
const stopGraceMs = 3000;
/** How long a starting job may have a directory but no supervisor pid yet. */
const startupGraceMs = 10_000;
/** Finished jobs' directories older than this are removed when another job launches. */
const finishedJobKeepMs = 10 * 60_000;

const supervisorPath = new URL('./local-supervisor.js', import.meta.url).pathname;

/**
 * The environment a rank sees: what the rank program, the store client and the native core read,
 * and nothing else of the worker's (no Temporal credentials, no unrelated secrets).
 */
export function rankEnvironment(env: NodeJS.ProcessEnv): Record<string, string> {
  const keep = (name: string) =>
    ['PATH', 'HOME', 'LANG', 'LC_ALL', 'TZ', 'TMPDIR', 'MOERL_NATIVE_BIN', 'MOERL_CACHE_DIR'].includes(
      name,
    ) || /^(AWS_|FI_|OPENBLAS_|MOERL_FI_)/.test(name);
  return Object.fromEntries(
    Object.entries(env).filter((e): e is [string, string] => keep(e[0]) && e[1] !== undefined),
  );
}

export function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** True while `pid` is the supervisor of `jobDir` (a recycled pid runs something else). */
function supervisorAlive(pid: number, jobDir: string): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(jobDir);
  } catch {
    return true; // no /proc: trust the signal check
  }
}

function killGroup(pgid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false;
  }
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
    private readonly pid: number,
    private readonly launchId: string,
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
      launchId,
    };
    this.done = this.follow();
  }

  /** The job's status file, if it is this start's (a restart under the same name writes another's). */
  private async readStatus(): Promise<LocalStatusFile | null> {
    const status = await readJson<LocalStatusFile>(join(this.dir, jobFiles.status));
    return status?.launchId === this.launchId ? status : null;
  }

  /** Follows status.json until it is final, or until the supervisor is gone without finishing. */
  private async follow(): Promise<JobStatus> {
    for (;;) {
      const status = await this.readStatus();
      if (status) this.last = status;
      if (this.last.final) return this.status();
      if (!supervisorAlive(this.pid, this.dir)) {
        // Its last words may have landed between the read above and the check.
        const after = await this.readStatus();
        if (after?.final) {
          this.last = after;
          return this.status();
        }
        killGroup(this.pid, 'SIGKILL');
        this.last = {
          ...this.last,
          state: 'failed',
          final: true,
          failure: this.last.failure ?? {
            rank: null,
            exitCode: null,
            signal: 'SIGKILL',
            logTail: `the job's supervisor (pid ${this.pid}) died before the job finished`,
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
    if (killGroup(this.pid, 'SIGTERM')) {
      const deadline = Date.now() + stopGraceMs;
      while (Date.now() < deadline && killGroup(this.pid, 0)) await sleep(100);
      killGroup(this.pid, 'SIGKILL');
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

export class LocalLauncher implements Launcher {
  constructor(
    private readonly workDir: string,
    private readonly env: NodeJS.ProcessEnv = process.env,
  ) {}

  async launch(spec: TrainJobSpec): Promise<TrainJob> {
    await mkdir(this.workDir, { recursive: true });
    await this.removeFinishedJobs();
    const dir = join(this.workDir, spec.name);
    for (;;) {
      const created = await mkdir(dir).then(
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
    let pid: number | null = null;
    while (pid === null && Date.now() - started < startupGraceMs) {
      const text = await readFile(join(dir, jobFiles.pid), 'utf8').catch(() => null);
      if (text !== null) pid = Number(text);
      else await sleep(pollMs); // another worker is starting it right now
    }
    const status = await readJson<LocalStatusFile>(join(dir, jobFiles.status));
    const job = await readJson<LocalJobFile>(join(dir, jobFiles.job));
    if (pid !== null && job) {
      const alive = supervisorAlive(pid, dir);
      if (alive || (status?.final && status.state === 'succeeded' && status.launchId === job.launchId))
        return new LocalJob(spec.name, dir, pid, job.launchId, true, spec.worldSize);
      killGroup(pid, 'SIGKILL'); // ranks of a supervisor that died, if any are left
    }
    // A failed or abandoned job: set it aside atomically (of two workers only one wins the
    // rename), then start afresh.
    const aside = `${dir}.dead-${process.pid}-${Date.now()}`;
    await rename(dir, aside).catch(() => undefined);
    await rm(aside, { recursive: true, force: true });
    return null;
  }

  private async start(spec: TrainJobSpec, dir: string): Promise<TrainJob> {
    const file: LocalJobFile = { spec, coordinatorPort: await freeLoopbackPort(), launchId: randomUUID() };
    await writeFile(join(dir, jobFiles.job), JSON.stringify(file));
    const out = openSync(join(dir, 'supervisor.log'), 'a');
    try {
      const child = spawn(process.execPath, [supervisorPath, dir], {
        detached: true, // a process group of its own: the job's
        stdio: ['ignore', out, out],
        env: rankEnvironment(this.env),
      });
      if (child.pid === undefined) throw new Error(`cannot start the supervisor of job ${spec.name}`);
      child.unref();
      await writeFile(join(dir, jobFiles.pid), String(child.pid));
      return new LocalJob(spec.name, dir, child.pid, file.launchId, false, spec.worldSize);
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
      const pid = Number(await readFile(join(dir, jobFiles.pid), 'utf8').catch(() => 'NaN'));
      if (status?.final || !supervisorAlive(pid, dir)) await rm(dir, { recursive: true, force: true });
    }
  }
}
