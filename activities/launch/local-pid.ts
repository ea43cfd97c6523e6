// Which process is a local job's supervisor. The supervisor names itself: it writes the job's
// supervisor.pid — its pid, the kernel's start time of that pid and the launch it supervises —
// atomically (a temporary file renamed into place), so a reader sees a whole claim or none, and
// a worker killed right after spawning it leaves no job without one. A pid is trusted only
// while the process holding it started at that time and runs the supervisor of that launch:
// the kernel hands a dead supervisor's pid to new processes, and such a process is neither
// adopted nor signalled. A pid <= 1 is never trusted (kill(0) and kill(-0) signal the caller's
// own process group, kill(-1) every process it may signal).
import { readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const supervisorPath = fileURLToPath(new URL('./local-supervisor.js', import.meta.url));

/** supervisor.pid, as the supervisor writes it about itself. */
export interface SupervisorClaim {
  pid: number;
  /** /proc/<pid>/stat's starttime (clock ticks after boot); null on a system without /proc. */
  startTime: string | null;
  /** The start of the job it supervises (job.json's launchId). */
  launchId: string;
}

/** A pid that names one process other than init: never 0, 1, negative, fractional or NaN. */
export function isTrustedPid(pid: unknown): pid is number {
  return typeof pid === 'number' && Number.isSafeInteger(pid) && pid > 1;
}

/** The claim in `text`, or null for anything else (empty, half written, a bare or bad pid). */
export function parseClaim(text: string | null): SupervisorClaim | null {
  if (!text) return null;
  let claim: Partial<SupervisorClaim>;
  try {
    claim = JSON.parse(text) as Partial<SupervisorClaim>;
  } catch {
    return null;
  }
  if (!claim || !isTrustedPid(claim.pid) || typeof claim.launchId !== 'string' || !claim.launchId)
    return null;
  const startTime = typeof claim.startTime === 'string' ? claim.startTime : null;
  return { pid: claim.pid, startTime, launchId: claim.launchId };
}

/**
 * `pid`'s state and start time from /proc/<pid>/stat: null when there is no such process,
 * undefined when the system has no /proc.
 */
function procStat(pid: number): { state: string; startTime: string } | null | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    try {
      readdirSync('/proc/self');
      return null;
    } catch {
      return undefined;
    }
  }
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return { state: fields[0] ?? '', startTime: fields[19] ?? '' };
}

/** The kernel's start time of `pid`; null without such a process or without /proc. */
export function processStartTime(pid: number): string | null {
  return procStat(pid)?.startTime ?? null;
}

/**
 * What the claim's pid is now: the supervisor of `jobDir` it names (`supervisor`), no process
 * or the supervisor's unreaped remains (`gone`), or another process under a reused pid (`other`).
 * Without /proc only the signal check remains, and a live pid counts as the supervisor.
 */
export function claimState(claim: SupervisorClaim, jobDir: string): 'supervisor' | 'gone' | 'other' {
  if (!isTrustedPid(claim.pid)) return 'other';
  const stat = procStat(claim.pid);
  if (stat === undefined) {
    try {
      process.kill(claim.pid, 0);
      return 'supervisor';
    } catch {
      return 'gone';
    }
  }
  if (stat === null) return 'gone';
  if (stat.startTime !== claim.startTime) return 'other';
  if (stat.state === 'Z' || stat.state === 'X') return 'gone';
  return isSupervisorOf(commandLine(claim.pid), jobDir, claim.launchId) ? 'supervisor' : 'other';
}

function commandLine(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

/** The supervisor's argv is `node local-supervisor.js <job dir> <launch id>`. */
function isSupervisorOf(argv: string[], jobDir: string, launchId: string): boolean {
  return argv[1] === supervisorPath && argv[2] === jobDir && argv[3] === launchId;
}

/**
 * The supervisor of this launch found among the running processes, for a job directory whose
 * supervisor has not written its claim yet (it is still starting). Null without one, or without
 * /proc.
 */
export function findSupervisor(jobDir: string, launchId: string): SupervisorClaim | null {
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return null;
  }
  for (const entry of entries) {
    const pid = Number(entry);
    if (!isTrustedPid(pid) || !isSupervisorOf(commandLine(pid), jobDir, launchId)) continue;
    const stat = procStat(pid);
    if (stat && stat.state !== 'Z' && stat.state !== 'X') return { pid, startTime: stat.startTime, launchId };
  }
  return null;
}

/**
 * Signals the job's process group (the supervisor's pid is its id): while the supervisor lives,
 * or after it died, for ranks it left behind. Not when the pid now belongs to another process:
 * the kernel reuses no pid while a process group of that id has members, so a reused pid means
 * nothing of the job is left, and the group of that id is someone else's.
 */
export function signalJobGroup(claim: SupervisorClaim, jobDir: string, signal: NodeJS.Signals | 0): boolean {
  if (!isTrustedPid(claim.pid) || claimState(claim, jobDir) === 'other') return false;
  try {
    process.kill(-claim.pid, signal);
    return true;
  } catch {
    return false;
  }
}

/** Replaces `path` with `text` at once: a reader sees the old file or the new one, never a part. */
export function writeFileAtomic(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, path);
}

/** Writes this process's claim to supervise `launchId` into `jobDir`. */
export function writeOwnClaim(jobDir: string, pidFile: string, launchId: string): void {
  const claim: SupervisorClaim = { pid: process.pid, startTime: processStartTime(process.pid), launchId };
  writeFileAtomic(join(jobDir, pidFile), JSON.stringify(claim));
}
