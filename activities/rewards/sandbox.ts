// How a reward function's worker process is started: limits, environment and isolation.
//
// What holds on every platform: the environment is a fixed minimal one (PATH, HOME, TMPDIR, PWD,
// LANG) with nothing of the worker's (no TEMPORAL_*, AWS_*, MOERL_*); the address space is
// limited (RLIMIT_AS) and core dumps are off; the process runs in its own process group and in a
// fresh scratch folder, removed when it exits; the pool bounds wall time, CPU time and output
// (process-pool.ts). With "namespaces" isolation (Linux, as root or where unprivileged user
// namespaces are allowed) it also runs in new network, PID and mount namespaces: no network at
// all (not even loopback: the new namespace's lo is down), no view of the worker's processes
// (a fresh /proc, so not /proc/<worker>/environ either), and every process it starts dies with
// it. What does not hold: the files the worker's user can read stay readable (same user, same
// file system), so this contains mistakes and stray network calls; it is not a boundary
// against code written to escape.
import { spawnSync, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { WorkerCommand } from './process-pool.js';

export type Isolation = 'namespaces' | 'none';

export interface SandboxLimits {
  /** Wall clock limit per sample. */
  timeoutMs: number;
  /** CPU seconds per sample. */
  cpuSeconds: number;
  /** Address space of the process (RLIMIT_AS). */
  memoryBytes: number;
  /** Bytes printed per sample (stdout and stderr together). */
  maxOutputBytes: number;
}

/** Defaults of a user's reward function; the math verifier uses the same. */
export const defaultSandboxLimits: SandboxLimits = {
  timeoutMs: 10_000,
  cpuSeconds: 10,
  memoryBytes: 1024 ** 3,
  maxOutputBytes: 1024 ** 2,
};

/** The namespaces every sandboxed process gets, and pid 1 of the new PID namespace dies with unshare. */
const unshareFlags = ['--net', '--pid', '--fork', '--mount-proc', '--kill-child'];

let probed: { flags: string[] } | null | undefined;

/**
 * The unshare flags that work on this machine, or null when none do (not Linux, no unshare,
 * neither root nor unprivileged user namespaces). Probed once per process.
 */
export function namespaceFlags(): string[] | null {
  if (probed !== undefined) return probed?.flags ?? null;
  probed = null;
  if (process.platform === 'linux') {
    const candidates = process.getuid?.() === 0 ? [unshareFlags] : [];
    candidates.push(['--map-root-user', ...unshareFlags]);
    for (const flags of candidates) {
      const probe = spawnSync('unshare', [...flags, '--', 'true'], { stdio: 'ignore', timeout: 10_000 });
      if (probe.status === 0) {
        probed = { flags };
        break;
      }
    }
  }
  return probed?.flags ?? null;
}

/** The isolation this machine gives sandboxed processes. */
export function availableIsolation(): Isolation {
  return namespaceFlags() ? 'namespaces' : 'none';
}

export interface SandboxCommandOptions {
  /** The program and its arguments, as run inside the sandbox. */
  program: string;
  args: string[];
  memoryBytes: number;
  isolation: Isolation;
  /** Added to the minimal environment (values from the reward's own settings, never the worker's). */
  env?: Record<string, string>;
}

/** A WorkerCommand that runs `program` under the limits and isolation asked for. */
export function sandboxCommand(options: SandboxCommandOptions): WorkerCommand {
  const scratch = mkdtempSync(join(tmpdir(), 'moerl-reward-'));
  const env = {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    HOME: scratch,
    TMPDIR: scratch,
    LANG: 'C.UTF-8',
    ...options.env,
  };
  // ulimit -v counts KiB; the shell then becomes the program, so the limits are its own.
  const limits = `ulimit -v ${Math.ceil(options.memoryBytes / 1024)} && ulimit -c 0 && exec "$@"`;
  const inner = ['/bin/sh', '-c', limits, 'sh', options.program, ...options.args];
  let command: string[] = inner;
  if (options.isolation === 'namespaces') {
    const flags = namespaceFlags();
    if (!flags) throw new Error('namespace isolation is not available on this machine');
    command = ['unshare', ...flags, '--', ...inner];
  }
  return {
    command: command[0] as string,
    args: command.slice(1),
    env,
    cwd: scratch,
    cleanup: () => rmSync(scratch, { recursive: true, force: true }),
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
