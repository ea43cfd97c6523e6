// How a reward function's worker process is started: limits, environment and isolation.
//
// What holds on every platform: the environment is a fixed minimal one (PATH, HOME, TMPDIR, PWD,
// LANG) with nothing of the worker's (no TEMPORAL_*, AWS_*, MOERL_*); each process's address
// space (RLIMIT_AS), CPU time (RLIMIT_CPU) and file size (RLIMIT_FSIZE) are limited and core
// dumps are off; the process runs in its own process group; the pool bounds wall time, CPU time
// of the whole process tree and output (process-pool.ts).
//
// With "namespaces" isolation (the default) the process runs in a jail made by bubblewrap
// (bwrap), as root or not: a new user namespace in which it is uid 65534 with no capability at
// all and no_new_privs set, and new network, PID, IPC, UTS and cgroup namespaces, so no network
// (not even loopback), no view of any other process (a fresh /proc of its own PID namespace:
// not /proc/<worker>/environ, nothing to setns into), and every process it starts dies with the
// jail. (Where the runtime masks parts of the worker's own /proc, as a container's default /proc
// mount does, the kernel refuses a fresh procfs in the jail: the jail then has no /proc at all.)
// Its root is an empty tmpfs with only the interpreter's folders, the runner and the
// function's own files bound read-only, and a size-capped tmpfs as its scratch folder: no other
// file of the worker's user is visible, nothing outside scratch is writable. CPU time is bounded
// for the whole tree, a child forked from any thread included (process-pool.ts).
//
// Memory (what one process may, plus 64 MiB for the jail itself) and the number of processes
// are bounded for the whole tree by a cgroup per worker process (cgroups.ts): always as root (where the kernel exempts the jail from RLIMIT_NPROC, so
// without a cgroup the sandbox refuses to start), and where MOERL_REWARD_CGROUP names a
// delegated one. A worker that is neither has rlimits alone: memory per process (at most
// pids × memoryBytes in all), processes per uid of the jail's own user namespace (RLIMIT_NPROC).
import { spawnSync, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { cgroupSupport, processCgroup } from './cgroups.js';
import { BadInputError } from './errors.js';
import type { WorkerCommand } from './process-pool.js';

export type Isolation = 'namespaces' | 'none';

export interface SandboxLimits {
  /** Wall clock limit per sample. */
  timeoutMs: number;
  /** CPU seconds per sample. */
  cpuSeconds: number;
  /** Address space of each process (RLIMIT_AS). */
  memoryBytes: number;
  /** Bytes printed per sample (stdout and stderr together). */
  maxOutputBytes: number;
  /** Size of the scratch folder, and of any one file written (RLIMIT_FSIZE). */
  scratchBytes: number;
  /** Processes (and threads) the function may run at once, in its jail. */
  pids: number;
}

/** Defaults of a user's reward function; the math verifier uses the same. */
export const defaultSandboxLimits: SandboxLimits = {
  timeoutMs: 10_000,
  cpuSeconds: 10,
  memoryBytes: 1024 ** 3,
  maxOutputBytes: 1024 ** 2,
  scratchBytes: 64 * 1024 ** 2,
  pids: 64,
};

/** Where the jail's scratch folder is, inside it. */
const jailScratch = '/scratch';

/** Memory of a jail's tree beyond its processes' own limit: bwrap and the page cache of what it reads. */
const jailMemoryBytes = 64 * 1024 ** 2;

/** Writes the shell's pid to each file before `--`, then runs what follows it. */
const enterCgroup =
  'while [ "$1" != -- ]; do echo $$ > "$1" || { echo "cannot join the cgroup of $1" >&2; exit 125; }; shift; done; shift; exec "$@"';

let probed: { ok: true } | { ok: false; why: string } | undefined;
/** Whether the jail mounts a /proc of its own (probed: a container's masked /proc forbids it). */
let jailProc = true;

/**
 * Whether this machine can make the jail, probed once per process: the reason it cannot
 * otherwise (not Linux, no bwrap, or user namespaces refused, e.g. by a seccomp profile).
 */
export function probeSandbox(): { ok: true } | { ok: false; why: string } {
  if (probed) return probed;
  if (process.platform !== 'linux')
    return (probed = { ok: false, why: `the jail needs Linux, not ${process.platform}` });
  const tryJail = () =>
    spawnSync('bwrap', [...jailArgs([]), '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });
  let probe = tryJail();
  if (probe.status !== 0 && /Can't mount proc/.test(probe.stderr ?? '')) {
    jailProc = false;
    probe = tryJail();
  }
  if (probe.error)
    probed = { ok: false, why: `bwrap could not run (${probe.error.message}; install bubblewrap)` };
  else if (probe.status !== 0)
    probed = {
      ok: false,
      why: `bwrap could not make the jail: ${(probe.stderr || `exit ${probe.status}`).trim()}`,
    };
  else {
    const cgroups = cgroupSupport();
    probed = cgroups.kind === 'broken' ? { ok: false, why: cgroups.why } : { ok: true };
  }
  return probed;
}

/** The sandbox limits of `options`: each one it sets, the defaults for the rest. */
export function sandboxLimits(options: Partial<SandboxLimits>): SandboxLimits {
  const limits: SandboxLimits = { ...defaultSandboxLimits };
  for (const key of Object.keys(defaultSandboxLimits) as (keyof SandboxLimits)[])
    if (options[key] !== undefined) limits[key] = options[key];
  return limits;
}

/**
 * Refuses to run `what`'s code (e.g. "reward function python:x", of kind "reward") where the
 * jail cannot be made, saying how to run it anyway, on purpose.
 */
export function requireSandbox(what: string, kind: string): void {
  const probe = probeSandbox();
  if (!probe.ok)
    throw new BadInputError(
      `${what}: the reward sandbox cannot start on this worker (${probe.why}), so the worker ` +
        `refuses to run ${kind} code; run the worker where bubblewrap can make user namespaces, or, ` +
        "on purpose, set the sandbox's isolation to none (MOERL_REWARD_ISOLATION=none; " +
        'docs/tasks.md, "Bring a reward function")',
    );
}

/** The isolation this machine gives sandboxed processes. */
export function availableIsolation(): Isolation {
  return probeSandbox().ok ? 'namespaces' : 'none';
}

/** bwrap's arguments for a jail that sees `readOnly` (and the system's /usr) and nothing else. */
function jailArgs(readOnly: string[], scratchBytes = 1024 ** 2): string[] {
  const args = [
    '--unshare-all',
    '--unshare-user',
    '--uid',
    '65534',
    '--gid',
    '65534',
    '--die-with-parent',
    '--new-session',
    '--cap-drop',
    'ALL',
    '--ro-bind',
    '/usr',
    '/usr',
    ...(jailProc ? ['--proc', '/proc'] : []),
    '--dev',
    '/dev',
    '--size',
    String(scratchBytes),
    '--tmpfs',
    jailScratch,
    '--chdir',
    jailScratch,
  ];
  for (const top of ['bin', 'sbin', 'lib', 'lib32', 'lib64']) {
    const path = `/${top}`;
    if (!existsSync(path)) continue;
    const target = realpathSync(path);
    args.push(...(target === path ? ['--ro-bind', path, path] : ['--symlink', target.slice(1), path]));
  }
  for (const path of ['/etc/ld.so.cache', '/etc/localtime', '/etc/ssl', '/etc/alternatives'])
    if (existsSync(path)) args.push('--ro-bind', path, path);
  for (const path of new Set(readOnly))
    if (path !== '/usr' && !path.startsWith('/usr/')) args.push('--ro-bind', path, path);
  return args;
}

/** The folders an interpreter needs: its prefix and, through symlinks, its real one's. */
export function interpreterPaths(program: string): string[] {
  return [dirname(dirname(program)), dirname(dirname(realpathSync(program)))];
}

export interface SandboxCommandOptions {
  /** The program and its arguments, as run inside the sandbox. */
  program: string;
  args: string[];
  limits: Pick<SandboxLimits, 'memoryBytes' | 'cpuSeconds' | 'scratchBytes' | 'pids'>;
  isolation: Isolation;
  /** What the jail sees, read-only, besides the system's /usr: the interpreter's and the function's folders. */
  readOnly?: string[];
  /** Added to the minimal environment (values from the reward's own settings, never the worker's). */
  env?: Record<string, string>;
}

/** A WorkerCommand that runs `program` under the limits and isolation asked for. */
export function sandboxCommand(options: SandboxCommandOptions): WorkerCommand {
  const { limits } = options;
  // prlimit sets the limits and becomes the program, so they are its own and its children's.
  const prlimit = [
    'prlimit',
    `--as=${limits.memoryBytes}`,
    '--core=0',
    `--cpu=${Math.ceil(limits.cpuSeconds) + 1}`,
    `--fsize=${limits.scratchBytes}`,
  ];
  if (options.isolation === 'namespaces') {
    const probe = probeSandbox();
    if (!probe.ok) throw new Error(`the reward sandbox cannot start on this machine: ${probe.why}`);
    const jail = [
      'bwrap',
      ...jailArgs(options.readOnly ?? [], limits.scratchBytes),
      '--',
      ...prlimit,
      `--nproc=${limits.pids}`,
      '--',
      options.program,
      ...options.args,
    ];
    const env = minimalEnv(jailScratch, options.env);
    const cgroups = cgroupSupport();
    if (cgroups.kind !== 'cgroups') return { command: jail[0]!, args: jail.slice(1), env };
    // The tree may use what one process may, and the jail's own share on top (bwrap, the files
    // it reads into the page cache): a single process meets its own limit first, as a clean
    // MemoryError, not the reclaim that precedes a cgroup's OOM kill.
    const treeMemoryBytes = limits.memoryBytes + jailMemoryBytes;
    const cgroup = processCgroup(cgroups, { memoryBytes: treeMemoryBytes, pids: limits.pids });
    // The shell joins the cgroup, then becomes bwrap: nothing of the jail starts outside it.
    return {
      command: 'sh',
      args: ['-c', enterCgroup, 'moerl-enter-cgroup', ...cgroup.procsFiles, '--', ...jail],
      env,
      cleanup: () => cgroup.remove(),
      limitBroken: () =>
        cgroup.outOfMemory()
          ? {
              reason: 'memory',
              message: `its processes together used more than ${treeMemoryBytes} bytes of memory`,
            }
          : undefined,
    };
  }
  const scratch = mkdtempSync(join(tmpdir(), 'moerl-reward-'));
  return {
    command: 'prlimit',
    args: [...prlimit.slice(1), '--', options.program, ...options.args],
    env: minimalEnv(scratch, options.env),
    cwd: scratch,
    cleanup: () => rmSync(scratch, { recursive: true, force: true }),
  };
}

function minimalEnv(scratch: string, env: Record<string, string> = {}): Record<string, string> {
  return {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    HOME: scratch,
    TMPDIR: scratch,
    PWD: scratch,
    LANG: 'C.UTF-8',
    ...env,
  };
}

/** Folder of the Python files beside this module's source (activities/rewards/python). */
export const pythonDir = fileURLToPath(new URL('../../../activities/rewards/python/', import.meta.url));

let rewardPython: string | undefined;

/**
 * The interpreter of the reward functions' pinned environment: MOERL_REWARD_PYTHON, else what
 * scripts/reward-python.sh prints (it makes the environment the first time).
 */
export function resolveRewardPython(env: NodeJS.ProcessEnv = process.env): string {
  if (env.MOERL_REWARD_PYTHON) return env.MOERL_REWARD_PYTHON;
  rewardPython ??= execFileSync(
    'bash',
    [fileURLToPath(new URL('../../../scripts/reward-python.sh', import.meta.url))],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
  ).trim();
  return rewardPython;
}
