// A rollout worker's rank capacity: how many moe_generate ranks it runs at once, one CPU each.
// A shard of a campaign with rolloutEpWorldSize R takes R of them for as long as its ranks run
// and waits while fewer are free, so the shards running at once × R never exceed the capacity;
// a shard with R above the whole capacity can never run on this worker and is refused.
// Each rank keeps OPENBLAS_NUM_THREADS=1: a chunk's bytes depend on the thread count
// (docs/native-model.md), and a retried shard resumes on whichever worker takes it, so threads
// chosen from one worker's size would break "same R, same bytes" across a fleet of mixed sizes.
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';

/** The worker's setting (or its flag --rollout-ranks). */
export const rolloutRanksEnv = 'MOERL_ROLLOUT_RANKS';

/**
 * The CPUs this process may use: its CPU affinity (os.availableParallelism(), which on Node 20
 * reads the affinity but not the cgroup's quota) bounded by a cgroup v2 CPU limit, rounded down.
 */
export function cpusAvailable(cpuMaxFile = '/sys/fs/cgroup/cpu.max'): number {
  const cpus = availableParallelism();
  let text: string;
  try {
    text = readFileSync(cpuMaxFile, 'utf8');
  } catch {
    return cpus; // no cgroup v2 limit to read (cgroup v1, not Linux): the affinity is all we know
  }
  const [quota, period] = text.trim().split(/\s+/).map(Number);
  if (quota === undefined || !Number.isFinite(quota) || !period) return cpus; // "max": no limit
  return Math.max(1, Math.min(cpus, Math.floor(quota / period)));
}

/** The capacity a worker is given (`what` names the setting in the error), or the CPUs it may use. */
export function rolloutRankCapacity(text: string | undefined, what: string, cpus = cpusAvailable): number {
  if (text === undefined || text === '') return cpus();
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > 4096)
    throw new Error(`${what} must be a whole number of ranks from 1 to 4096, got "${text}"`);
  return n;
}

/** The worker's rank slots, handed out first come, first served. */
export class RankSlots {
  private free: number;
  private readonly waiting: { ranks: number; grant: () => void }[] = [];

  constructor(readonly capacity: number) {
    this.free = capacity;
  }

  /** Slots taken now. */
  get inUse(): number {
    return this.capacity - this.free;
  }

  /**
   * Takes `ranks` slots (at most the capacity), waiting while fewer are free; resolves with the
   * function that gives them back, or null when `signal` aborts first. Waiters are served in
   * order, so a shard of many ranks is not starved by shards of few.
   */
  acquire(ranks: number, signal?: AbortSignal): Promise<(() => void) | null> {
    if (!Number.isInteger(ranks) || ranks < 1 || ranks > this.capacity)
      throw new RangeError(`${ranks} rank slots asked of a capacity of ${this.capacity}`);
    if (signal?.aborted) return Promise.resolve(null);
    return new Promise((resolve) => {
      const onAbort = () => {
        this.waiting.splice(this.waiting.indexOf(entry), 1);
        this.serve(); // a large waiter that leaves may unblock smaller ones behind it
        resolve(null);
      };
      const entry = {
        ranks,
        grant: () => {
          signal?.removeEventListener('abort', onAbort);
          let given = false;
          resolve(() => {
            if (given) return;
            given = true;
            this.free += ranks;
            this.serve();
          });
        },
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(entry);
      this.serve();
    });
  }

  private serve(): void {
    for (let next = this.waiting[0]; next !== undefined && next.ranks <= this.free; next = this.waiting[0]) {
      this.waiting.shift();
      this.free -= next.ranks;
      next.grant();
    }
  }
}
