// A cgroup per reward worker process, so its memory and its number of processes are bounded for
// the whole tree it starts (rlimits bound each process alone, and RLIMIT_NPROC does not bind a
// jail made by root at all). The pool scores one sample at a time per process, so the cgroup's
// limits are the sample's.
//
// Where the cgroups are: MOERL_REWARD_CGROUP, a cgroup path (`/a/b`, from the hierarchy's root as
// the worker sees it) that the worker's user may write and that holds no process of its own (a
// delegated cgroup); unset, a worker run as root uses `/moerl-rewards`, and any other worker
// has none (its limits are rlimits: memory per process). Both hierarchies are used as found: the
// unified one (cgroup v2: memory.max, memory.swap.max, pids.max) or the memory and pids
// controllers of v1 (memory.limit_in_bytes, memory.memsw.limit_in_bytes where swap is
// accounted, pids.max). Each process's cgroup is `<base>/w<worker pid>-<n>`, removed once the
// process and everything it started are gone.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const mountPoint = '/sys/fs/cgroup';
export const rewardCgroupEnv = 'MOERL_REWARD_CGROUP';
const rootDefault = '/moerl-rewards';

/** The limits a worker process's cgroup holds for its whole tree. */
export interface CgroupLimits {
  memoryBytes: number;
  pids: number;
}

/** The cgroup of one worker process. */
export interface ProcessCgroup {
  /** The `cgroup.procs` files the process must write its pid to before it starts anything. */
  procsFiles: string[];
  /** Whether the kernel has killed a process of the tree for passing the memory limit. */
  outOfMemory(): boolean;
  /** Kills what is left in it, then removes it (retrying while the killed are exiting). */
  remove(): void;
}

/** Where the per-process cgroups are made: one directory per controller hierarchy in use. */
interface CgroupBase {
  version: 1 | 2;
  /** v2: [the base]; v1: [memory's base, pids' base]. */
  dirs: string[];
}

export type CgroupSupport =
  { kind: 'cgroups'; base: CgroupBase } | { kind: 'none' } | { kind: 'broken'; why: string };

const resolved = new Map<string, CgroupSupport>();

/**
 * Whether per-process cgroups are used, found once per setting: `none` (a worker that is not
 * root, with no MOERL_REWARD_CGROUP), or `broken` with why when they are wanted (asked for, or
 * the worker is root) and cannot be made: the sandbox then refuses to start.
 */
export function cgroupSupport(env: NodeJS.ProcessEnv = process.env): CgroupSupport {
  const asked = env[rewardCgroupEnv];
  const root = process.getuid?.() === 0;
  const key = `${asked ?? ''}|${root}`;
  let found = resolved.get(key);
  if (!found) {
    found = asked || root ? probe(asked || rootDefault, asked ? rewardCgroupEnv : 'root') : { kind: 'none' };
    resolved.set(key, found);
  }
  return found;
}

function probe(path: string, source: string): CgroupSupport {
  const named =
    source === 'root'
      ? `${path} (a worker run as root needs one; ${rewardCgroupEnv} names another)`
      : `${rewardCgroupEnv}=${path}`;
  if (!/^(\/[A-Za-z0-9_.@:-]+)+$/.test(path) || path.split('/').some((part) => part === '.' || part === '..'))
    return {
      kind: 'broken',
      why: `${named} must be a cgroup path such as /moerl-rewards (no "." or ".." parts)`,
    };
  let base: CgroupBase;
  if (existsSync(join(mountPoint, 'cgroup.controllers')))
    base = { version: 2, dirs: [join(mountPoint, path)] };
  else if (
    existsSync(join(mountPoint, 'memory', 'cgroup.procs')) &&
    existsSync(join(mountPoint, 'pids', 'cgroup.procs'))
  )
    base = { version: 1, dirs: [join(mountPoint, 'memory', path), join(mountPoint, 'pids', path)] };
  else
    return {
      kind: 'broken',
      why: `${named}: no cgroup hierarchy with the memory and pids controllers at ${mountPoint}`,
    };
  try {
    for (const dir of base.dirs) mkdirSync(dir, { recursive: true });
    if (base.version === 2) enableControllers(base.dirs[0]!);
    removeLeftovers(base);
    // A cgroup made, limited, and removed: what every worker process's needs.
    const check = makeCgroup(base, `probe-${process.pid}`, { memoryBytes: 64 * 1024 ** 2, pids: 8 });
    check.remove();
  } catch (err) {
    return { kind: 'broken', why: `${named} cannot be used: ${(err as Error).message}` };
  }
  return { kind: 'cgroups', base };
}

/** v2: the memory and pids controllers must be on for the base's children. */
function enableControllers(dir: string): void {
  const on = readFileSync(join(dir, 'cgroup.subtree_control'), 'utf8').split(/\s+/);
  const missing = ['memory', 'pids'].filter((c) => !on.includes(c));
  if (missing.length === 0) return;
  try {
    writeFileSync(join(dir, 'cgroup.subtree_control'), missing.map((c) => `+${c}`).join(' '));
  } catch (err) {
    throw new Error(
      `cannot enable ${missing.join(' and ')} for its children (${(err as Error).message}): it must hold no process and its parent must delegate them`,
      { cause: err },
    );
  }
}

/** Cgroups of worker processes that are gone (a worker killed before it removed them). */
function removeLeftovers(base: CgroupBase): void {
  for (const dir of base.dirs)
    for (const name of readdirSync(dir)) {
      const pid = /^w(\d+)-\d+$/.exec(name)?.[1];
      if (pid && !existsSync(`/proc/${pid}`)) killAndRemove(join(dir, name), base.version);
    }
}

let made = 0;

/** A fresh cgroup under the base for one worker process, with the limits set. */
export function processCgroup(
  support: Extract<CgroupSupport, { kind: 'cgroups' }>,
  limits: CgroupLimits,
): ProcessCgroup {
  return makeCgroup(support.base, `w${process.pid}-${++made}`, limits);
}

function makeCgroup(base: CgroupBase, name: string, limits: CgroupLimits): ProcessCgroup {
  const dirs = base.dirs.map((dir) => join(dir, name));
  for (const dir of dirs) mkdirSync(dir);
  const cgroup: ProcessCgroup = {
    procsFiles: dirs.map((dir) => join(dir, 'cgroup.procs')),
    outOfMemory: () => oomKills(dirs[0]!, base.version) > 0,
    remove: () => {
      for (const dir of dirs) killAndRemove(dir, base.version);
    },
  };
  try {
    if (base.version === 2) {
      const [dir] = dirs as [string];
      writeFileSync(join(dir, 'memory.max'), String(limits.memoryBytes));
      writeFileSync(join(dir, 'memory.swap.max'), '0');
      writeFileSync(join(dir, 'pids.max'), String(limits.pids));
    } else {
      const [memory, pids] = dirs as [string, string];
      writeFileSync(join(memory, 'memory.limit_in_bytes'), String(limits.memoryBytes));
      // Swap counts against the limit too, where the kernel accounts it.
      if (existsSync(join(memory, 'memory.memsw.limit_in_bytes')))
        writeFileSync(join(memory, 'memory.memsw.limit_in_bytes'), String(limits.memoryBytes));
      writeFileSync(join(pids, 'pids.max'), String(limits.pids));
    }
  } catch (err) {
    cgroup.remove();
    throw err;
  }
  return cgroup;
}

function oomKills(memoryDir: string, version: 1 | 2): number {
  const file = join(memoryDir, version === 2 ? 'memory.events' : 'memory.oom_control');
  try {
    return Number(/^oom_kill (\d+)$/m.exec(readFileSync(file, 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

const removeRetryMs = 100;
const removeTries = 50;

function killAndRemove(dir: string, version: 1 | 2, tries = removeTries): void {
  if (!existsSync(dir)) return;
  try {
    if (version === 2 && existsSync(join(dir, 'cgroup.kill'))) writeFileSync(join(dir, 'cgroup.kill'), '1');
    else
      for (const pid of readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean))
        try {
          process.kill(Number(pid), 'SIGKILL');
        } catch {
          // already gone
        }
    rmdirSync(dir);
  } catch {
    // Busy while the killed processes exit: try again shortly, without holding the worker up.
    if (tries > 1) setTimeout(() => killAndRemove(dir, version, tries - 1), removeRetryMs).unref();
  }
}
