// A server process in a process group of its own, with its output appended to a log file:
// stopping it signals the whole group, so nothing it started outlives it. Such processes are
// also sent SIGTERM when this process exits, and on Linux setpriv's parent-death signal covers
// a test process that is killed outright.
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, closeSync, constants, fstatSync, openSync } from 'node:fs';
import { delimiter, join } from 'node:path';

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

function findOnPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not in this PATH entry
    }
  }
  return undefined;
}
