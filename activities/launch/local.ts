// LocalLauncher: one process per rank on this machine. Rank 0's bootstrap listens on a free
// loopback port; logs go to one file per rank; when any rank fails the others are stopped,
// and the job reports which rank failed first and why.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { JobStatus, Launcher, RankStatus, TrainJob, TrainJobSpec } from './types.js';

const logTailBytes = 4096;
const stopGraceMs = 3000;

function freeLoopbackPort(): Promise<number> {
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

class LocalJob implements TrainJob {
  readonly ranks: RankStatus[];
  private readonly children: ChildProcess[] = [];
  private failure: JobStatus['failure'] = null;
  private readonly done: Promise<JobStatus>;
  adopted = false;

  constructor(
    readonly spec: TrainJobSpec,
    private readonly logDir: string,
    coordinatorPort: number,
  ) {
    this.name = spec.name;
    this.ranks = Array.from({ length: spec.worldSize }, (_, rank) => ({
      rank,
      state: 'running' as const,
      exitCode: null,
      signal: null,
    }));
    mkdirSync(logDir, { recursive: true });
    const [exe, ...args] = spec.command;
    const exits = this.ranks.map(
      (rank) =>
        new Promise<void>((resolve) => {
          const log = createWriteStream(this.logPath(rank.rank));
          const child = spawn(exe!, args, {
            stdio: ['ignore', 'pipe', 'pipe'],
            env: {
              ...process.env,
              ...spec.env,
              MOERL_RANK: String(rank.rank),
              MOERL_WORLD_SIZE: String(spec.worldSize),
              MOERL_COORDINATOR: `127.0.0.1:${coordinatorPort}`,
              MOERL_FI_PROVIDER: spec.provider,
            },
          });
          child.stdout!.pipe(log, { end: false });
          child.stderr!.pipe(log, { end: false });
          this.children.push(child);
          const finish = (code: number | null, signal: NodeJS.Signals | null) => {
            rank.exitCode = code;
            rank.signal = signal;
            rank.state = code === 0 ? 'succeeded' : 'failed';
            log.end(() => {
              if (rank.state === 'failed' && this.failure === null)
                void this.recordFailure(rank).then(resolve);
              else resolve();
            });
          };
          child.on('error', (err) => {
            log.write(`launcher: cannot start ${exe}: ${err.message}\n`);
            finish(127, null);
          });
          child.on('exit', finish);
        }),
    );
    this.done = Promise.all(exits).then(() => this.status());
  }

  readonly name: string;

  private logPath(rank: number): string {
    return join(this.logDir, `rank-${rank}.log`);
  }

  private async recordFailure(rank: RankStatus): Promise<void> {
    // The first rank to fail is the cause; the others fail because it is gone.
    this.failure = { rank: rank.rank, exitCode: rank.exitCode, signal: rank.signal, logTail: '' };
    const failure = this.failure;
    this.stopAll();
    const log = await readFile(this.logPath(rank.rank), 'utf8').catch(() => '');
    failure.logTail = log.slice(-logTailBytes).trim();
  }

  private stopAll(): void {
    for (const child of this.children)
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    setTimeout(() => {
      for (const child of this.children)
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }, stopGraceMs).unref();
  }

  status(): JobStatus {
    const states = this.ranks.map((r) => r.state);
    const state = states.includes('failed')
      ? 'failed'
      : states.every((s) => s === 'succeeded')
        ? 'succeeded'
        : 'running';
    return {
      name: this.name,
      state,
      ranks: this.ranks.map((r) => ({ ...r })),
      failure: this.failure && { ...this.failure },
    };
  }

  wait(): Promise<JobStatus> {
    return this.done;
  }

  async kill(): Promise<void> {
    this.stopAll();
    await this.done;
  }

  readLog(rank: number): Promise<Buffer> {
    return readFile(this.logPath(rank));
  }
}

export class LocalLauncher implements Launcher {
  /** Jobs of this process by name; a finished job is forgotten when a new launch of its name starts. */
  private readonly jobs = new Map<string, LocalJob>();

  constructor(private readonly workDir: string) {}

  async launch(spec: TrainJobSpec): Promise<TrainJob> {
    const existing = this.jobs.get(spec.name);
    if (existing && existing.status().state === 'running') {
      existing.adopted = true;
      return existing;
    }
    const port = await freeLoopbackPort();
    const job = new LocalJob(spec, join(this.workDir, spec.name), port);
    this.jobs.set(spec.name, job);
    return job;
  }
}
