// Checkpoint tests' helpers: small checkpoint directories laid out like the native trainer's
// (dense.safetensors, experts-rank<s>.safetensors, with `optimizer` their optimizer-* files,
// manifest.json; the bytes are random, not safetensors), and a fake ObjectStore that fails a
// chosen mutating call of a real store.
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { StoreUnavailableError } from '../../activities/store/errors.js';
import type { ObjectBody, ObjectStore, PutOptions } from '../../activities/store/types.js';
import type { CheckpointManifest } from '../../activities/types.js';

/**
 * Writes a checkpoint directory of `worldSize` expert files for `experts` experts, each weights
 * file `bytes` long; with `optimizer`, a version 2 checkpoint after optimizer steps: each weights
 * file's moments in an optimizer file twice its size. Returns its manifest.
 */
export function writeLocalCheckpoint(
  dir: string,
  opts: { worldSize?: number; experts?: number; bytes?: number; optimizer?: boolean } = {},
): CheckpointManifest {
  const worldSize = opts.worldSize ?? 2;
  const weights = [
    'dense.safetensors',
    ...Array.from({ length: worldSize }, (_, s) => `experts-rank${s}.safetensors`),
  ];
  const names = opts.optimizer ? [...weights, ...weights.map((n) => `optimizer-${n}`)] : weights;
  mkdirSync(dir, { recursive: true });
  const files = names.map((name) => {
    const data = randomBytes((opts.bytes ?? 4096) * (name.startsWith('optimizer-') ? 2 : 1));
    writeFileSync(join(dir, name), data);
    return { name, bytes: data.length, sha256: createHash('sha256').update(data).digest('hex') };
  });
  const manifest: CheckpointManifest = {
    format: 'moerl-checkpoint',
    version: opts.optimizer ? 2 : 1,
    config: { num_experts: opts.experts ?? 4 * worldSize, dim: 16 },
    world_size: worldSize,
    optimizer_step: opts.optimizer ? 7 : 0,
    meta: { kind: 'test' },
    files,
  };
  writeFileSync(join(dir, 'manifest.json'), JSON.stringify(manifest) + '\n');
  return manifest;
}

/**
 * A fake store over a real one that counts mutating calls (put, putFile, delete, deletePrefix,
 * createIfAbsent) and fails call number `failAt`: 'before' it takes effect, or 'after' (the
 * change is made but the caller sees an error, like a lost response).
 */
export class FaultyStore implements ObjectStore {
  failAt: number | null = null;
  mode: 'before' | 'after' = 'before';
  /** Every mutating call so far: `<method> <key>`. */
  readonly mutations: string[] = [];

  constructor(readonly inner: ObjectStore) {}

  private async mutate<T>(what: string, key: string, op: () => Promise<T>): Promise<T> {
    this.mutations.push(`${what} ${key}`);
    const fail = this.failAt === this.mutations.length;
    const fault = () =>
      new StoreUnavailableError(
        this.describe(),
        key,
        `injected fault at mutating call ${this.mutations.length} (${what})`,
      );
    if (fail && this.mode === 'before') throw fault();
    const out = await op();
    if (fail) throw fault();
    return out;
  }

  describe() {
    return `faulty(${this.inner.describe()})`;
  }
  put(key: string, body: ObjectBody, opts?: PutOptions) {
    return this.mutate('put', key, () => this.inner.put(key, body, opts));
  }
  putFile(key: string, localPath: string, opts?: PutOptions) {
    return this.mutate('putFile', key, () => this.inner.putFile(key, localPath, opts));
  }
  delete(key: string) {
    return this.mutate('delete', key, () => this.inner.delete(key));
  }
  deletePrefix(prefix: string) {
    return this.mutate('deletePrefix', prefix, () => this.inner.deletePrefix(prefix));
  }
  createIfAbsent(key: string, body: Buffer | string) {
    return this.mutate('createIfAbsent', key, () => this.inner.createIfAbsent(key, body));
  }
  get(key: string) {
    return this.inner.get(key);
  }
  getStream(key: string): Readable {
    return this.inner.getStream(key);
  }
  getFile(key: string, localPath: string) {
    return this.inner.getFile(key, localPath);
  }
  head(key: string) {
    return this.inner.head(key);
  }
  list(prefix: string) {
    return this.inner.list(prefix);
  }
}
