// The worker's bounded checkpoint cache: `<cacheDir>/checkpoints/<manifestSha256>`, complete
// verified copies of checkpoints' weights (installCheckpoint: what moe_generate reads, not the
// AdamW moments nor a Hugging Face directory), evicted least recently used first once over a
// count or byte bound, never while in use. Room is made before a download, counting the
// downloads in flight, so the cache stays within its byte bound (the volume under it is sized to
// match); a checkpoint larger than the bound fails at once. In use = acquired and not yet
// released, counted in memory per process and announced in a lease file per process (with the
// process's start time, so a recycled pid is not mistaken for the holder), so worker processes of
// one host (one pid namespace) sharing a cache directory never evict each other's. Last use is
// the entry directory's mtime, so a restarted worker keeps the LRU order.
import { randomUUID } from 'node:crypto';
import { readdir, readFile, rename, rm, stat, utimes } from 'node:fs/promises';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { processStartTime } from '../launch/local-pid.js';
import { writeFileAtomically } from '../store/local-file.js';
import type { ObjectStore } from '../store/types.js';
import type { CheckpointRef } from '../types.js';
import {
  checkpointBytes,
  installCheckpoint,
  isInstalled,
  partialDirMarker,
  readRefManifest,
} from './fetch.js';
import { badInput, isSha256 } from './manifest.js';

export interface CacheLimits {
  /** Complete checkpoints kept (those in use count too). */
  maxCheckpoints: number;
  /** Bytes of complete checkpoints kept; Infinity: no byte bound. */
  maxBytes: number;
}

/**
 * The share of the cache volume checkpoints may fill when only its size is given: the rest is
 * for what lives beside them (rollout chunks before upload, job directories).
 */
export const checkpointShareOfVolume = 0.8;

/** `text` in bytes: a byte count, or with K/M/G/T (powers of 1024; `Gi`, `GB`, `GiB` alike). */
function parseBytes(name: string, text: string): number {
  const m = /^(\d+(?:\.\d+)?)([KMGT]?)(?:i?B|i)?$/.exec(text);
  if (!m)
    throw new Error(`${name}=${JSON.stringify(text)} is not a size (bytes, or e.g. 500M, 50G, 20Gi, 2T)`);
  return Math.floor(Number(m[1]) * 1024 ** ' KMGT'.indexOf(m[2] || ' '));
}

/**
 * MOERL_CACHE_MAX_CHECKPOINTS (default 4) and MOERL_CACHE_MAX_BYTES; without the latter,
 * checkpointShareOfVolume of MOERL_CACHE_VOLUME_SIZE (the cache volume's size: k8s/ sets it
 * from the volume's sizeLimit, so the two are one number), else no byte bound.
 */
export function cacheLimitsFromEnv(env: NodeJS.ProcessEnv = process.env): CacheLimits {
  const count = env.MOERL_CACHE_MAX_CHECKPOINTS?.trim() || '4';
  if (!/^\d+$/.test(count))
    throw new Error(
      `MOERL_CACHE_MAX_CHECKPOINTS=${JSON.stringify(count)} is not a whole number of checkpoints`,
    );
  const bytes = env.MOERL_CACHE_MAX_BYTES?.trim();
  if (bytes) return { maxCheckpoints: Number(count), maxBytes: parseBytes('MOERL_CACHE_MAX_BYTES', bytes) };
  const volume = env.MOERL_CACHE_VOLUME_SIZE?.trim();
  if (volume)
    return {
      maxCheckpoints: Number(count),
      maxBytes: Math.floor(parseBytes('MOERL_CACHE_VOLUME_SIZE', volume) * checkpointShareOfVolume),
    };
  return { maxCheckpoints: Number(count), maxBytes: Infinity };
}

/** A checkpoint directory held for use: valid until release() (call it once; more are ignored). */
export interface CheckpointLease {
  dir: string;
  release(): void;
}

/** A partial or evicting directory unchanged this long belongs to a process that died. */
const staleDebrisMs = 15 * 60_000;
const leasesDirName = '.leases';
const evictingMarker = '.evicting-';

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** What a lease file says: the entries its process holds, and when that process started. */
interface LeaseFile {
  startTime: string | null;
  held: string[];
}

/** `text` as a lease file; one of an earlier version is a bare list of entries. */
function parseLease(text: string): LeaseFile {
  const value = JSON.parse(text) as unknown;
  const lease = Array.isArray(value) ? { startTime: null, held: value } : (value as Partial<LeaseFile>);
  return {
    startTime: typeof lease.startTime === 'string' ? lease.startTime : null,
    held: (Array.isArray(lease.held) ? lease.held : []).filter((s): s is string => typeof s === 'string'),
  };
}

/** The lease's process still runs: the pid is alive and, where both are known, started when the lease says. */
function holderAlive(pid: number, lease: LeaseFile): boolean {
  if (!isAlive(pid)) return false;
  const now = lease.startTime === null ? null : processStartTime(pid);
  return now === null || now === lease.startTime;
}

/** `p`, unless `signal` aborts first: then its reason. */
function unlessAborted<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason ?? new Error('aborted'));
    if (signal.aborted) return onAbort();
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/** `p`'s value, or `fallback` when what it reads is gone (removed meanwhile, or never there). */
async function unlessMissing<T>(p: Promise<T>, fallback: T): Promise<T> {
  try {
    return await p;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return fallback;
    throw err;
  }
}

/** Create one per worker process (and cache directory); share it between activities. */
export class CheckpointCache {
  readonly root: string;
  private readonly refs = new Map<string, number>();
  private readonly fills = new Map<string, Promise<void>>();
  private readonly removals = new Map<string, Promise<void>>();
  private readonly sizes = new Map<string, number>();
  /** Bytes of the downloads in flight, by entry: room is kept for them. */
  private readonly incoming = new Map<string, number>();
  private readonly startTime = processStartTime(process.pid);
  private readonly token = randomUUID().slice(0, 8);
  private readonly leaseFile: string;
  private leaseWrites: Promise<void> = Promise.resolve();
  private evictions: Promise<void> = Promise.resolve();
  private background: Promise<void> = Promise.resolve();
  private lastTouchMs = 0;

  constructor(
    cacheDir: string,
    readonly limits: CacheLimits = cacheLimitsFromEnv(),
    /** Failures of eviction, and of the bookkeeping after a release, are reported here. */
    private readonly onError: (err: unknown) => void = (err) =>
      console.warn(
        `checkpoint cache ${join(cacheDir, 'checkpoints')}: ${(err as Error).message ?? String(err)}`,
      ),
  ) {
    this.root = join(cacheDir, 'checkpoints');
    this.leaseFile = join(this.root, leasesDirName, `${process.pid}-${this.token}.json`);
  }

  /**
   * Downloads the checkpoint's weights unless cached (one download for concurrent acquires of
   * it) and holds them. An aborted `signal` ends the wait (the download, shared, may go on to the cache).
   */
  async acquire(
    store: ObjectStore,
    ref: CheckpointRef,
    opts: { signal?: AbortSignal } = {},
  ): Promise<CheckpointLease> {
    if (!isSha256(ref.manifestSha256))
      throw badInput(
        `checkpoint ref ${ref.key}: manifestSha256 ${JSON.stringify(ref.manifestSha256)} is not a sha256`,
      );
    const sha = ref.manifestSha256;
    const dir = join(this.root, sha);
    // Counted before any await: from here on no eviction in this process picks it.
    this.refs.set(sha, (this.refs.get(sha) ?? 0) + 1);
    let released = false;
    const release = (used = true) => {
      if (released) return;
      released = true;
      this.drop(sha, used ? dir : null);
    };
    try {
      await this.writeLeases();
      await this.removals.get(sha);
      let fill = this.fills.get(sha);
      if (!fill) {
        fill = this.fill(store, ref, sha, dir).finally(() => this.fills.delete(sha));
        this.fills.set(sha, fill);
      }
      await unlessAborted(fill, opts.signal);
      await this.touch(dir);
    } catch (err) {
      release(false);
      throw err;
    }
    await this.evict().catch(this.onError);
    return { dir, release: () => release() };
  }

  /** Makes room for a checkpoint not cached yet, then downloads it. */
  private async fill(store: ObjectStore, ref: CheckpointRef, sha: string, dir: string): Promise<void> {
    if (await isInstalled(dir, ref, 'weights')) return;
    const read = await readRefManifest(store, ref);
    const bytes = checkpointBytes(read, ref, 'weights');
    const bound = this.limits.maxBytes;
    if (bytes > bound)
      throw ApplicationFailure.create({
        type: 'CheckpointCacheTooSmall',
        nonRetryable: true,
        message: `the weights of checkpoint ${ref.key} take ${bytes} bytes, more than this worker's checkpoint cache holds (MOERL_CACHE_MAX_BYTES=${bound}); give the worker a larger cache volume and bound together (k8s/README.md, "Cache sizing"), then resume`,
      });
    this.incoming.set(sha, bytes);
    try {
      const after = await this.evict();
      if (after.bytes > bound)
        throw ApplicationFailure.create({
          type: 'CheckpointCacheFull',
          message: `the weights of checkpoint ${ref.key} (${bytes} bytes) do not fit in this worker's checkpoint cache now: ${after.bytes} of MOERL_CACHE_MAX_BYTES=${bound} bytes would be in use, the rest held by running activities; a retry waits for them`,
        });
      await installCheckpoint(store, ref, dir, { part: 'weights', read });
      this.sizes.set(sha, bytes);
    } finally {
      this.incoming.delete(sha);
    }
  }

  /** Resolves when the work started by releases (touch, lease file, eviction) has finished. */
  settled(): Promise<void> {
    return this.background;
  }

  /** Ends one hold; `dir` (a used entry) is touched first, while still held, so no eviction removes it under the touch. */
  private drop(sha: string, dir: string | null): void {
    this.background = this.background
      .then(() => (dir ? this.touch(dir) : undefined))
      .catch(this.onError)
      .then(() => {
        const n = (this.refs.get(sha) ?? 1) - 1;
        if (n > 0) this.refs.set(sha, n);
        else this.refs.delete(sha);
        return this.writeLeases();
      })
      .then(() => this.evict())
      .then(() => undefined)
      .catch(this.onError);
  }

  private inUse(sha: string): boolean {
    return (this.refs.get(sha) ?? 0) > 0 || this.fills.has(sha);
  }

  /** Marks last use; strictly increasing within the process so quick uses keep their order. */
  private touch(dir: string): Promise<void> {
    this.lastTouchMs = Math.max(Date.now(), this.lastTouchMs + 1);
    const t = new Date(this.lastTouchMs);
    return utimes(dir, t, t);
  }

  /** Rewrites this process's lease file with the entries it holds now (writes run in order). */
  private writeLeases(): Promise<void> {
    const write = this.leaseWrites.then(async () => {
      if (this.refs.size === 0) await rm(this.leaseFile, { force: true });
      else {
        const lease: LeaseFile = { startTime: this.startTime, held: [...this.refs.keys()] };
        await writeFileAtomically(this.leaseFile, Buffer.from(JSON.stringify(lease)));
      }
    });
    this.leaseWrites = write.catch(() => undefined);
    return write;
  }

  /** Entries other live processes hold; lease files of dead processes are removed. */
  private async heldElsewhere(): Promise<Set<string>> {
    const dir = join(this.root, leasesDirName);
    const held = new Set<string>();
    const names = await unlessMissing(readdir(dir), [] as string[]);
    for (const name of names) {
      const m = /^(\d+)-([0-9a-f]+)\.json$/.exec(name);
      if (!m || m[2] === this.token) continue;
      // Our own pid with another token: an earlier incarnation of this worker, now dead.
      const pid = Number(m[1]);
      if (pid === process.pid || !isAlive(pid)) {
        await rm(join(dir, name), { force: true });
        continue;
      }
      const text = await unlessMissing(readFile(join(dir, name), 'utf8'), null);
      if (text === null) continue;
      let lease: LeaseFile;
      try {
        lease = parseLease(text);
      } catch {
        // Written whole by rename, so unreadable means damaged: that process holds nothing we can see.
        continue;
      }
      // The pid now names another process (the holder died, its pid was given again).
      if (!holderAlive(pid, lease)) {
        await rm(join(dir, name), { force: true });
        continue;
      }
      for (const sha of lease.held) held.add(sha);
    }
    return held;
  }

  private async sizeOf(sha: string, dir: string): Promise<number> {
    let bytes = this.sizes.get(sha);
    if (bytes === undefined) {
      bytes = 0;
      for (const name of await readdir(dir)) bytes += (await stat(join(dir, name))).size;
      this.sizes.set(sha, bytes); // entries never change once complete
    }
    return bytes;
  }

  /** Evicts until the entries and the downloads in flight are within the bounds (or only held ones are left). */
  private evict(): Promise<{ count: number; bytes: number }> {
    const run = this.evictions.then(() => this.evictNow());
    this.evictions = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  private async evictNow(): Promise<{ count: number; bytes: number }> {
    const names = await unlessMissing(readdir(this.root), [] as string[]);
    const entries: { sha: string; path: string; mtimeMs: number; bytes: number }[] = [];
    for (const name of names) {
      const path = join(this.root, name);
      if (isSha256(name)) {
        const st = await unlessMissing(stat(path), null);
        if (st?.isDirectory())
          entries.push({ sha: name, path, mtimeMs: st.mtimeMs, bytes: await this.sizeOf(name, path) });
      } else if (name.includes(evictingMarker)) {
        // Left by a process killed mid-eviction (the rename that made it set its ctime).
        const st = await unlessMissing(stat(path), null);
        if (st && Date.now() - st.ctimeMs > staleDebrisMs) await rm(path, { recursive: true, force: true });
      } else if (name.includes(partialDirMarker) && !this.fills.has(name.slice(0, 64))) {
        // Left by a process killed mid-download: a live one keeps writing into its directory.
        if (Date.now() - (await newestMtimeMs(path)) > staleDebrisMs)
          await rm(path, { recursive: true, force: true });
      }
    }
    const complete = new Set(entries.map((e) => e.sha));
    const coming = [...this.incoming].filter(([sha]) => !complete.has(sha));
    let count = entries.length + coming.length;
    let bytes = entries.reduce((sum, e) => sum + e.bytes, 0) + coming.reduce((sum, [, b]) => sum + b, 0);
    const over = () => count > this.limits.maxCheckpoints || bytes > this.limits.maxBytes;
    if (!over()) return { count, bytes };
    const elsewhere = await this.heldElsewhere();
    for (const e of entries.sort((a, b) => a.mtimeMs - b.mtimeMs)) {
      if (!over()) break;
      if (this.inUse(e.sha) || elsewhere.has(e.sha)) continue; // may leave the cache over its bound for now
      if (await this.remove(e.sha, e.path)) {
        count--;
        bytes -= e.bytes;
      }
    }
    return { count, bytes };
  }

  /** Removes an entry by renaming it away first: nobody sees it half deleted. */
  private async remove(sha: string, path: string): Promise<boolean> {
    const trash = `${path}${evictingMarker}${this.token}-${randomUUID().slice(0, 8)}`;
    let removed = false;
    const renamed = (async () => {
      const moved = await unlessMissing(
        rename(path, trash).then(() => true),
        false,
      );
      if (!moved) return; // evicted elsewhere first
      removed = true;
      // Another process may have taken it while we decided: give it back.
      if ((await this.heldElsewhere()).has(sha)) {
        removed = false;
        await rename(trash, path).catch((err: NodeJS.ErrnoException) => {
          // It downloaded a fresh copy meanwhile: theirs stays, ours goes.
          if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
        });
      }
    })();
    this.removals.set(sha, renamed);
    try {
      await renamed;
    } finally {
      this.removals.delete(sha);
    }
    this.sizes.delete(sha);
    await rm(trash, { recursive: true, force: true });
    return removed;
  }
}

/** Latest modification of a directory or of anything directly in it. */
async function newestMtimeMs(dir: string): Promise<number> {
  let newest = (await stat(dir).catch(() => null))?.mtimeMs ?? 0;
  for (const name of await readdir(dir).catch(() => [] as string[]))
    newest = Math.max(newest, (await stat(join(dir, name)).catch(() => null))?.mtimeMs ?? 0);
  return newest;
}

/** A checkpoint as a local directory, held until release(): see CheckpointCache. */
export function acquireCheckpoint(
  store: ObjectStore,
  ref: CheckpointRef,
  cache: CheckpointCache,
  opts: { signal?: AbortSignal } = {},
): Promise<CheckpointLease> {
  return cache.acquire(store, ref, opts);
}
