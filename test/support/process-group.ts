// A server process in a process group of its own, with its output appended to a log file:
// stopping it signals the whole group, so nothing it started outlives it. Such processes are
// also sent SIGTERM when this process exits, and on Linux setpriv's parent-death signal covers
// a test process that is killed outright.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, fstatSync, openSync } from 'node:fs';
import { findOnPath, logTail } from '../../cli/dev-server.js';

export interface GroupProcess {
  name: string;
  /** The command line, for error messages. */
  command: string;
  logFile: string;
  /** Size of the log when the process started: its own output begins there. */
  logStart: number;
  /** Resolves with "code N" or "signal S" when the process has exited. */
  exited: Promise<string>;
  /** Set once the process has exited. */
  exitReason: string | undefined;
  /** SIGTERM to the group, SIGKILL after `graceMs`; resolves when the leader has exited. */
  stop(graceMs: number): Promise<void>;
  /** SIGKILL to the whole group at once, as a machine lost; resolves when the leader has exited. */
  kill(): Promise<void>;
  /** Sends `signal` to the whole group (SIGSTOP and SIGCONT stall and resume it). */
  signal(signal: NodeJS.Signals): void;
}

const liveGroups = new Set<number>();
process.once('exit', () => {
  for (const pgid of liveGroups) signalGroup(pgid, 'SIGTERM');
});

export function spawnGroup(
  name: string,
  binary: string,
  args: string[],
  logFile: string,
  env: NodeJS.ProcessEnv = process.env,
): GroupProcess {
  const logFd = openSync(logFile, 'a');
  const logStart = fstatSync(logFd).size;
  const setpriv = process.platform === 'linux' ? findOnPath('setpriv') : undefined;
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'TERM', binary, ...args]] : [binary, args];
  let child: ChildProcess;
  try {
    // detached: the child leads a new process group (setpriv execs, so it keeps the pid).
    child = spawn(file, argv, { stdio: ['ignore', logFd, logFd], env, detached: true });
  } finally {
    closeSync(logFd);
  }
  child.once('error', () => undefined); // a failed spawn also ends in 'exit'
  const pgid = child.pid;
  const proc: GroupProcess = {
    name,
    command: [binary, ...args].join(' '),
    logFile,
    logStart,
    exitReason: undefined,
    exited: new Promise<string>((resolve) =>
      child.once('exit', (code, signal) => resolve(signal ? `signal ${signal}` : `code ${code}`)),
    ),
    async stop(graceMs) {
      if (pgid === undefined || proc.exitReason) return;
      signalGroup(pgid, 'SIGTERM');
      const timer = setTimeout(() => signalGroup(pgid, 'SIGKILL'), graceMs);
      await proc.exited;
      clearTimeout(timer);
      // Whatever the leader left behind in its group goes with it.
      signalGroup(pgid, 'SIGKILL');
    },
    async kill() {
      if (pgid === undefined || proc.exitReason) return;
      signalGroup(pgid, 'SIGKILL');
      await proc.exited;
    },
    signal(signal) {
      if (pgid !== undefined && !proc.exitReason) signalGroup(pgid, signal);
    },
  };
  if (pgid !== undefined) liveGroups.add(pgid);
  void proc.exited.then((reason) => {
    proc.exitReason = reason;
    if (pgid !== undefined) liveGroups.delete(pgid);
  });
  return proc;
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // the group is gone already
  }
}

/** What went wrong in a probe: the command's stderr when it has one, else the message and its cause. */
export function probeFailureText(err: unknown): string {
  const stderr = (err as { stderr?: string } | null)?.stderr?.trim();
  if (stderr) return stderr;
  if (err instanceof Error)
    return `${err.message}${err.cause instanceof Error ? `: ${err.cause.message}` : ''}`;
  return String(err);
}

/**
 * Waits until `probe` answers true (anything else is why not yet), failing early when the
 * process exits; the error names the component and its command and carries its log tail.
 */
export async function waitUntilReady(
  proc: GroupProcess,
  deadline: number,
  probe: () => Promise<true | string>,
  fail: (message: string) => Error,
): Promise<void> {
  const failure = (what: string) =>
    fail(`${proc.name} ${what}; command: ${proc.command}\n${logTail(proc.logFile, proc.logStart)}`);
  let last = 'no answer yet';
  while (Date.now() < deadline) {
    if (proc.exitReason) throw failure(`exited with ${proc.exitReason} before it was ready`);
    try {
      const answer = await probe();
      if (answer === true) return;
      last = answer;
    } catch (err) {
      last = probeFailureText(err);
    }
    await Promise.race([proc.exited, new Promise((done) => setTimeout(done, 200))]);
  }
  throw failure(`not ready before the start-up deadline (last: ${last})`);
}
