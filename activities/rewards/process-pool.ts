// A pool of long-lived worker processes that score one sample at a time over a line protocol:
// the pool writes one JSON request per line to the process's stdin, and the process answers
// with one JSON line on file descriptor 3, so whatever the scored code prints on stdout and
// stderr never mixes with the answers. Every sample is bounded from outside the process: a wall
// clock timeout, CPU seconds (read from /proc, the whole process tree), and bytes printed. A
// process that breaks a limit, dies or answers nonsense is killed with its process group; that
// sample fails with its reason, and the next sample gets a fresh process.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import type { Readable, Writable } from 'node:stream';

/** Why a sample's score is missing; counted per batch (docs/tasks.md, "Bring a reward function"). */
export const failureReasons = [
  'exception', // the function raised
  'timeout', // the wall clock limit passed
  'cpu', // the CPU seconds limit passed
  'memory', // the address-space limit was hit
  'output', // it printed more than the output limit
  'crash', // the process died (a signal, os._exit, a native fault)
  'bad-result', // it returned something that is not a finite number
  'start', // the process could not start or load the function
] as const;
export type FailureReason = (typeof failureReasons)[number];

export type CallResult = { ok: true; value: unknown } | { ok: false; reason: FailureReason; message: string };

/** What to run for one worker process; the environment is exactly `env` (nothing inherited). */
export interface WorkerCommand {
  command: string;
  args: string[];
  env: Record<string, string>;
  cwd?: string;
  /** Called once the process is gone (e.g. removes its scratch folder). */
  cleanup?: () => void;
  /** A limit the process's tree broke, seen from outside it (its cgroup's memory); polled. */
  limitBroken?: () => { reason: FailureReason; message: string } | undefined;
}

export interface ProcessPoolOptions {
  /** Shown in messages, e.g. "python:my_rewards:compute_score". */
  name: string;
  /** Processes at most. */
  size: number;
  spawn: () => WorkerCommand;
  /** Wall clock limit per sample. */
  timeoutMs: number;
  /** CPU seconds per sample (user + system, the process and its children); Linux only. */
  cpuSeconds?: number;
  /** Bytes a sample may print on stdout and stderr together. */
  maxOutputBytes: number;
  /** Longest answer line; a longer one is a bad result. */
  maxAnswerBytes?: number;
  /** Limit for a process to load the function and say it is ready. */
  startTimeoutMs?: number;
}

/** The tail of a sample's output kept for its failure message. */
const outputTailBytes = 2048;
const cpuPollMs = 50;
const pipeDrainMs = 250;
const clockTicks = 100; // USER_HZ: /proc/<pid>/stat counts CPU time in 1/100 s on Linux

/** Longest failure message a call returns; the rest is cut, saying so. */
export const maxFailureMessageChars = 4096;

interface Job {
  /** The request as its JSON line, encoded when the call was made. */
  line: string;
  resolve: (result: CallResult) => void;
}

/** One worker process; answers one request at a time. */
class Worker {
  private readonly child: ChildProcess;
  private buffer = '';
  private outputBytes = 0;
  private outputTail = '';
  private job: Job | undefined;
  private timers: NodeJS.Timeout[] = [];
  private cpuAtStart = 0;
  /** The process and its descendants once it loaded its function (a jail's own are among them). */
  private processesWhenLoaded = 0;
  private readonly limitBroken: WorkerCommand['limitBroken'];
  /** The first limit broken or fault seen; the process is being killed for it. */
  private failure: { reason: FailureReason; message: string } | undefined;
  state: 'starting' | 'idle' | 'busy' | 'dying' | 'dead' = 'starting';
  private loaded = false;

  constructor(
    private readonly options: ProcessPoolOptions,
    /** Called when the process is gone before it loaded its function. */
    private readonly onStartFailure: (failure: { reason: FailureReason; message: string }) => void,
    /** Called when the process became idle or is gone. */
    private readonly onChange: (worker: Worker) => void,
  ) {
    const cmd = options.spawn();
    this.limitBroken = cmd.limitBroken;
    this.child = spawn(cmd.command, cmd.args, {
      env: cmd.env,
      cwd: cmd.cwd,
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
      // Its own process group, so one kill reaches whatever the function started.
      detached: true,
    });
    const answers = this.child.stdio[3] as Readable;
    answers.setEncoding('utf8');
    answers.on('data', (text: string) => this.guarded(() => this.onAnswer(text)));
    for (const stream of [this.child.stdout, this.child.stderr]) {
      stream?.setEncoding('utf8');
      stream?.on('data', (text: string) => this.guarded(() => this.onOutput(text)));
    }
    (this.child.stdin as Writable).on('error', () => undefined);
    this.child.on('error', (err) =>
      this.guarded(() => {
        cmd.cleanup?.();
        this.failure ??= { reason: 'start', message: `could not start ${cmd.command}: ${err.message}` };
        this.onGone(null, null);
      }),
    );
    // 'close' comes once the pipes are drained too, so a last answer or line of output is read
    // before the process counts as gone; a process it left behind may hold them open, so 'exit'
    // plus a moment is enough.
    this.child.on('exit', (code, signal) => {
      this.guarded(() => {
        // What killed it, read before cleanup removes where that is told.
        this.failure ??= cmd.limitBroken?.();
        cmd.cleanup?.();
      });
      setTimeout(() => this.guarded(() => this.onGone(code, signal)), pipeDrainMs).unref();
    });
    this.child.on('close', (code: number | null, signal: NodeJS.Signals | null) =>
      this.guarded(() => this.onGone(code, signal)),
    );
    const startMs = options.startTimeoutMs ?? 60_000;
    this.timers.push(
      setTimeout(() => this.kill('start', `did not load its function within ${startMs} ms`), startMs),
    );
  }

  run(job: Job): void {
    this.state = 'busy';
    this.job = job;
    this.outputBytes = 0;
    this.outputTail = '';
    this.cpuAtStart = this.cpuSeconds();
    this.timers.push(
      setTimeout(
        () => this.kill('timeout', `did not return within ${this.options.timeoutMs} ms`),
        this.options.timeoutMs,
      ),
    );
    const cpuLimit = this.options.cpuSeconds;
    if (cpuLimit !== undefined || this.limitBroken) {
      this.timers.push(
        setInterval(() => {
          const broken = this.limitBroken?.();
          if (broken) this.kill(broken.reason, broken.message);
          else if (cpuLimit !== undefined && this.cpuSeconds() - this.cpuAtStart > cpuLimit)
            this.kill('cpu', `used more than ${cpuLimit} s of CPU`);
        }, cpuPollMs),
      );
    }
    (this.child.stdin as Writable).write(job.line);
  }

  /**
   * Runs an event handler's work so that nothing it throws escapes to the process (an uncaught
   * exception in a stream handler ends the whole worker): the process is killed and its sample
   * fails with the error.
   */
  private guarded(work: () => void): void {
    try {
      work();
    } catch (err) {
      this.failure ??= { reason: 'crash', message: `the pool failed handling this process: ${String(err)}` };
      if (this.state === 'dead') return;
      if (this.state !== 'dying') this.kill('crash', this.failure.message);
    }
  }

  close(): void {
    this.kill('crash', 'the pool was closed');
  }

  private clearTimers() {
    for (const timer of this.timers) clearTimeout(timer);
    this.timers = [];
  }

  private onOutput(text: string) {
    this.outputBytes += Buffer.byteLength(text);
    this.outputTail = (this.outputTail + text).slice(-outputTailBytes);
    if (this.outputBytes > this.options.maxOutputBytes) {
      this.kill('output', `printed more than ${this.options.maxOutputBytes} bytes`);
    }
  }

  private onAnswer(text: string) {
    this.buffer += text;
    let newline: number;
    while ((newline = this.buffer.indexOf('\n')) >= 0) {
      const line = this.buffer.slice(0, newline);
      this.buffer = this.buffer.slice(newline + 1);
      this.onAnswerLine(line);
    }
    const limit = this.options.maxAnswerBytes ?? 64 * 1024;
    if (this.buffer.length > limit) this.kill('bad-result', `answered more than ${limit} bytes`);
  }

  private onAnswerLine(line: string) {
    if (this.state === 'dying' || this.state === 'dead') return;
    let answer: { ready?: boolean; value?: unknown; error?: string; kind?: string };
    try {
      answer = JSON.parse(line) as typeof answer;
    } catch {
      this.kill('bad-result', `answered a line that is not JSON: ${quote(line)}`);
      return;
    }
    const kind: FailureReason = failureReasons.includes(answer.kind as FailureReason)
      ? (answer.kind as FailureReason)
      : 'exception';
    if (this.state === 'starting') {
      if (answer.ready === true) {
        this.clearTimers();
        this.loaded = true;
        this.processesWhenLoaded = this.tree().length;
        this.state = 'idle';
        this.onChange(this);
      } else {
        this.kill(
          kind === 'memory' ? 'memory' : 'start',
          answer.error ?? `answered before loading: ${quote(line)}`,
        );
      }
      return;
    }
    if (this.state !== 'busy' || !this.job) {
      this.kill('bad-result', `answered out of turn: ${quote(line)}`);
      return;
    }
    if (answer.error !== undefined && kind === 'memory') {
      // Out of memory leaves the process in an unknown state: the job fails and a fresh one follows.
      this.kill('memory', answer.error);
      return;
    }
    const job = this.job;
    this.job = undefined;
    this.clearTimers();
    this.state = 'idle';
    job.resolve(
      answer.error === undefined
        ? { ok: true, value: answer.value }
        : { ok: false, reason: kind, message: this.withOutput(answer.error) },
    );
    // Processes the sample started and left running would count against the next sample's
    // limits (and could meddle with it): the process is retired, and a fresh one follows.
    if (this.tree().length > this.processesWhenLoaded)
      this.kill('crash', 'left processes running after its sample');
    else this.onChange(this);
  }

  /** CPU seconds of the process and its descendants (0 where /proc is missing). */
  private cpuSeconds(): number {
    let ticks = 0;
    for (const id of this.tree()) {
      try {
        const stat = readFileSync(`/proc/${id}/stat`, 'utf8');
        // The fields after the command name (which may hold spaces): utime, stime, and cutime,
        // cstime (children waited for) are the 14th to 17th of the line.
        const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        for (const i of [11, 12, 13, 14]) ticks += Number(fields[i] ?? 0);
      } catch {
        // The process is gone; its time no longer counts.
      }
    }
    return ticks / clockTicks;
  }

  /** The process and its descendants, as /proc shows them now (none where /proc is missing). */
  private tree(): number[] {
    const pid = this.child.pid;
    if (pid === undefined || process.platform !== 'linux') return [];
    const seen = new Set<number>();
    const visit = (id: number) => {
      if (seen.has(id)) return;
      seen.add(id);
      try {
        // Every thread's children: a child forked from a thread other than the main one is listed
        // under that thread only.
        for (const task of readdirSync(`/proc/${id}/task`)) {
          const children = readFileSync(`/proc/${id}/task/${task}/children`, 'utf8').trim();
          if (children) for (const child of children.split(' ')) visit(Number(child));
        }
      } catch {
        // The process is gone, and with it the list of its children.
      }
    };
    visit(pid);
    return [...seen];
  }

  /** Kills the process tree and group; the job (or the start) fails with `reason` once it is gone. */
  private kill(reason: FailureReason, message: string) {
    if (this.state === 'dying' || this.state === 'dead') return;
    this.state = 'dying';
    this.failure ??= { reason, message };
    this.clearTimers();
    // Each descendant first, while the tree still holds them: one in a session of its own (setsid)
    // is out of the process group's reach. Then the group, for what started since.
    for (const id of this.tree().reverse()) {
      try {
        process.kill(id, 'SIGKILL');
      } catch {
        // Gone already.
      }
    }
    try {
      if (this.child.pid !== undefined) process.kill(-this.child.pid, 'SIGKILL');
    } catch {
      this.child.kill('SIGKILL');
    }
  }

  private onGone(code: number | null, signal: NodeJS.Signals | null) {
    if (this.state === 'dead') return;
    const wasStarting = !this.loaded;
    this.state = 'dead';
    this.clearTimers();
    const failure = this.failure ?? {
      reason: /MemoryError|out of memory|Cannot allocate memory|bad_alloc/i.test(this.outputTail)
        ? ('memory' as const)
        : wasStarting
          ? ('start' as const)
          : ('crash' as const),
      message: `${signal ? `was killed by ${signal}` : `exited with code ${code}`}${wasStarting ? ' before loading its function' : ''}`,
    };
    const withOutput = { reason: failure.reason, message: this.withOutput(failure.message) };
    const job = this.job;
    this.job = undefined;
    if (job) job.resolve({ ok: false, ...withOutput });
    else if (wasStarting) this.onStartFailure(withOutput);
    this.onChange(this);
  }

  private withOutput(message: string): string {
    const tail = this.outputTail.trim();
    return capMessage(tail ? `${message}; last output: ${quote(tail.slice(-400))}` : message);
  }
}

/** `message`, cut to maxFailureMessageChars, saying how long it was. */
function capMessage(message: string): string {
  if (message.length <= maxFailureMessageChars) return message;
  const note = ` ... (truncated: ${message.length} characters in all, ${maxFailureMessageChars} kept)`;
  return message.slice(0, maxFailureMessageChars - note.length) + note;
}

/** A message-safe, one-line excerpt. */
function quote(text: string): string {
  // eslint-disable-next-line no-control-regex -- control characters are what this removes
  const line = text.replace(/[\x00-\x1f\x7f]+/g, ' ');
  return JSON.stringify(line.length > 400 ? `${line.slice(0, 400)}...` : line);
}

/**
 * Scores requests in up to `size` processes, started on demand and replaced when they die. A
 * process that cannot load its function fails every later call at once with the same message
 * (the function is broken, not the sample), until the pool is closed.
 */
export class ProcessPool {
  private readonly workers: Worker[] = [];
  private readonly queue: Job[] = [];
  private broken: { reason: FailureReason; message: string } | undefined;
  private closed = false;
  /** Processes started over the pool's life (replacements included). */
  started = 0;

  constructor(readonly options: ProcessPoolOptions) {
    if (!(options.size >= 1)) throw new Error(`pool ${options.name}: size must be at least 1`);
  }

  call(request: unknown): Promise<CallResult> {
    if (this.closed) return Promise.resolve({ ok: false, reason: 'start', message: 'the pool is closed' });
    if (this.broken) return Promise.resolve({ ok: false, ...this.broken });
    let line: string;
    try {
      line = `${JSON.stringify(request)}\n`;
    } catch (err) {
      // E.g. a RangeError for a request nested too deep for the stack: that sample fails alone.
      return Promise.resolve({
        ok: false,
        reason: 'exception',
        message: capMessage(`${this.options.name}: the request could not be encoded as JSON: ${String(err)}`),
      });
    }
    return new Promise((resolve) => {
      this.queue.push({ line, resolve });
      this.dispatch();
    });
  }

  /** Kills every process; calls still queued fail. */
  close(): void {
    this.closed = true;
    for (const job of this.queue.splice(0))
      job.resolve({ ok: false, reason: 'start', message: 'the pool is closed' });
    for (const worker of this.workers) worker.close();
  }

  private dispatch() {
    if (this.closed) return;
    if (this.broken) {
      for (const job of this.queue.splice(0)) job.resolve({ ok: false, ...this.broken });
      return;
    }
    for (const worker of this.workers) {
      if (this.queue.length === 0) break;
      if (worker.state === 'idle') worker.run(this.queue.shift() as Job);
    }
    const starting = this.workers.filter((w) => w.state === 'starting').length;
    let wanted = Math.min(this.queue.length - starting, this.options.size - this.workers.length);
    while (wanted-- > 0) {
      this.started++;
      this.workers.push(
        new Worker(
          this.options,
          (failure) => {
            this.broken ??= { reason: failure.reason, message: `${this.options.name}: ${failure.message}` };
          },
          (worker) => {
            if (worker.state === 'dead') this.workers.splice(this.workers.indexOf(worker), 1);
            this.dispatch();
          },
        ),
      );
    }
  }
}
