// Committed checkpoints from the store into local directories, every file verified on the way:
// the policy's weights (the cache, export), whole (fetchCheckpoint), or only the files one
// trainer rank reads.
import { randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as keys from '../layout.js';
import { StoreNotFoundError } from '../store/errors.js';
import { writeFileAtomically } from '../store/local-file.js';
import { hasContent, rememberContent } from '../store/verified-file.js';
import type { ObjectStore } from '../store/types.js';
import type { CheckpointManifest, CheckpointRef } from '../types.js';
import {
  badInput,
  huggingFaceFiles,
  isSha256,
  optimizerFileName,
  parseManifest,
  sha256Hex,
  sha256OfStream,
  weightFiles,
} from './manifest.js';

type ManifestFile = CheckpointManifest['files'][number];

/** The manifest a ref names, checked to be the one that was committed. */
export async function readRefManifest(
  store: ObjectStore,
  ref: CheckpointRef,
): Promise<{ text: string; manifest: CheckpointManifest }> {
  if (!isSha256(ref.manifestSha256))
    throw badInput(
      `checkpoint ref ${ref.key}: manifestSha256 ${JSON.stringify(ref.manifestSha256)} is not a sha256`,
    );
  const manifestKey = `${ref.key}/${keys.manifestName}`;
  const text = await store.get(manifestKey).then(
    (b) => b.toString('utf8'),
    (err: unknown) => {
      if (!(err instanceof StoreNotFoundError)) throw err;
      throw badInput(
        `checkpoint ${ref.key} has no manifest in ${store.describe()}: it was never committed, or retention removed it`,
      );
    },
  );
  if (sha256Hex(text) !== ref.manifestSha256)
    throw badInput(
      `${manifestKey} changed after it was committed (sha256 ${sha256Hex(text)}, expected ${ref.manifestSha256})`,
    );
  return { text, manifest: parseManifest(text, manifestKey) };
}

/** The BadInput failure of a checkpoint file the store does not have (other errors pass through). */
export function missingCheckpointFile(store: ObjectStore, ref: CheckpointRef, file: ManifestFile) {
  return (err: unknown): never => {
    if (!(err instanceof StoreNotFoundError)) throw err;
    throw badInput(
      `checkpoint file ${ref.key}/${file.name} is missing: the manifest lists it (${file.bytes} bytes), ${store.describe()} has no such object`,
    );
  };
}

/** Throws BadInput when `got` is not the manifest's size and sha256 of `file`. */
export function checkCheckpointFile(
  ref: CheckpointRef,
  file: ManifestFile,
  got: { sha256: string; bytes: number },
) {
  if (got.sha256 !== file.sha256 || got.bytes !== file.bytes)
    throw badInput(
      `checkpoint file ${ref.key}/${file.name} is corrupt: ${got.bytes} bytes, sha256 ${got.sha256}; the manifest says ${file.bytes} bytes, sha256 ${file.sha256}`,
    );
}

/** Downloads one checkpoint file to `local` and checks its size and sha256 against the manifest. */
async function downloadVerified(store: ObjectStore, ref: CheckpointRef, file: ManifestFile, local: string) {
  await store.getFile(`${ref.key}/${file.name}`, local).catch(missingCheckpointFile(store, ref, file));
  checkCheckpointFile(ref, file, await sha256OfStream(createReadStream(local)));
}

/** Name part of a cache directory being filled (`<sha>.partial-<pid>-<random>`). */
export const partialDirMarker = '.partial-';

/**
 * What a local copy of a checkpoint holds: `weights`, the policy (weightFiles: what rollouts and
 * exports read), or `all` of its files.
 */
export type CheckpointPart = 'weights' | 'all';

function partFiles(read: { manifest: CheckpointManifest }, ref: CheckpointRef, part: CheckpointPart) {
  return part === 'all' ? read.manifest.files : weightFiles(read.manifest, `${ref.key}/${keys.manifestName}`);
}

/** Bytes a local copy of `part` of a checkpoint takes: those files and the manifest. */
export function checkpointBytes(
  read: { text: string; manifest: CheckpointManifest },
  ref: CheckpointRef,
  part: CheckpointPart,
): number {
  return partFiles(read, ref, part).reduce((sum, f) => sum + f.bytes, Buffer.byteLength(read.text));
}

/**
 * True when `dir` is a complete copy of `part` of checkpoint `ref`: its manifest.json is the
 * ref's (by sha256), written last, and every file of the part has the manifest's size and
 * sha256 (store/verified-file.ts: the size at every use, the hash once per process). A copy
 * written over in the cache, by anyone who can write there, is not one.
 */
export async function isInstalled(dir: string, ref: CheckpointRef, part: CheckpointPart): Promise<boolean> {
  const text = await readFile(join(dir, keys.manifestName), 'utf8').catch(() => null);
  if (text === null || sha256Hex(text) !== ref.manifestSha256) return false;
  let files: ManifestFile[];
  try {
    files = partFiles({ manifest: parseManifest(text, join(dir, keys.manifestName)) }, ref, part);
  } catch {
    return false;
  }
  for (const file of files)
    if (!(await hasContent(join(dir, file.name), file.bytes, file.sha256))) return false;
  return true;
}

/**
 * Makes `dir` a complete, verified copy of `part` of the checkpoint unless it already is one:
 * the files go into a sibling directory that is renamed into place, with the manifest, when all
 * of them verify. `read` is the ref's manifest when the caller has read it already; an aborted
 * `signal` stops between files.
 */
export async function installCheckpoint(
  store: ObjectStore,
  ref: CheckpointRef,
  dir: string,
  opts: {
    part: CheckpointPart;
    read?: { text: string; manifest: CheckpointManifest };
    signal?: AbortSignal;
  },
): Promise<void> {
  if (await isInstalled(dir, ref, opts.part)) return;
  const read = opts.read ?? (await readRefManifest(store, ref));
  const partial = () => `${dir}${partialDirMarker}${process.pid}-${randomUUID().slice(0, 8)}`;
  // A copy that is not whole (a file changed or cut short) is moved out of the way, then removed.
  if (await stat(dir).catch(() => null)) {
    const aside = partial();
    await rename(dir, aside).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
    await rm(aside, { recursive: true, force: true });
  }
  const tmp = partial();
  await mkdir(tmp, { recursive: true });
  try {
    const files = partFiles(read, ref, opts.part);
    for (const file of files) {
      opts.signal?.throwIfAborted();
      await downloadVerified(store, ref, file, join(tmp, file.name));
    }
    await writeFile(join(tmp, keys.manifestName), read.text);
    const mine = await rename(tmp, dir).then(
      () => true,
      async (err: NodeJS.ErrnoException) => {
        // Another process cached the same checkpoint first: use theirs.
        if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
        await rm(tmp, { recursive: true, force: true });
        return false;
      },
    );
    // Verified while downloaded: their first use in this process need not hash them again.
    if (mine) for (const file of files) await rememberContent(join(dir, file.name), file.sha256);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

/**
 * Makes a committed checkpoint available, every file, as a local directory the native tools can
 * read, in `<cacheDir>/checkpoints/<manifestSha256>`, never evicted. Superseded by
 * acquireCheckpoint (cache.ts), which bounds the cache; kept until every caller has moved to it.
 */
export async function fetchCheckpoint(
  store: ObjectStore,
  ref: CheckpointRef,
  cacheDir: string,
): Promise<string> {
  if (!isSha256(ref.manifestSha256))
    throw badInput(
      `checkpoint ref ${ref.key}: manifestSha256 ${JSON.stringify(ref.manifestSha256)} is not a sha256`,
    );
  const dir = join(cacheDir, 'checkpoints', ref.manifestSha256);
  await installCheckpoint(store, ref, dir, { part: 'all' });
  return dir;
}

/**
 * The files trainer rank `rank` of `worldSize` reads: dense, and the expert files holding its
 * experts; for training (`part` absent) also their optimizer files, where the manifest lists
 * them (none: fresh moments, or a version 1 checkpoint holding them inside the weights files).
 */
export function rankFiles(
  manifest: CheckpointManifest,
  where: string,
  rank: number,
  worldSize: number,
  part?: 'weights',
): string[] {
  if (!Number.isSafeInteger(worldSize) || worldSize < 1)
    throw badInput(`world size ${worldSize} is not a positive integer`);
  if (!Number.isSafeInteger(rank) || rank < 0 || rank >= worldSize)
    throw badInput(`rank ${rank} is not in [0, ${worldSize})`);
  const experts = (manifest.config as { num_experts?: unknown } | undefined)?.num_experts;
  const saved = manifest.world_size;
  if (typeof experts !== 'number' || !Number.isSafeInteger(experts) || experts < 1)
    throw badInput(`${where}: config.num_experts ${JSON.stringify(experts)} is not a positive integer`);
  if (!Number.isSafeInteger(saved) || saved < 1 || experts % saved !== 0)
    throw badInput(`${where}: world_size ${JSON.stringify(saved)} does not divide num_experts ${experts}`);
  if (experts % worldSize !== 0)
    throw badInput(`${where}: ${experts} experts cannot be split evenly over ${worldSize} ranks`);
  // Saved rank s holds experts [s·E/saved, (s+1)·E/saved); rank r needs [r·E/R, (r+1)·E/R).
  const perSaved = experts / saved;
  const first = (rank * experts) / worldSize;
  const last = ((rank + 1) * experts) / worldSize - 1;
  const names = ['dense.safetensors'];
  for (let s = Math.floor(first / perSaved); s <= Math.floor(last / perSaved); s++)
    names.push(`experts-rank${s}.safetensors`);
  const moments = manifest.files.some((f) => f.name === optimizerFileName('dense.safetensors'));
  return part === 'weights' || !moments ? names : [...names, ...names.map(optimizerFileName)];
}

/**
 * Fetches what trainer rank `rank` of `worldSize` needs of a committed checkpoint into `dir`
 * (a pod's own filesystem): rankFiles (with `part: 'weights'` the weights alone, for the KL
 * reference), each checked against the manifest (files already there and matching are kept),
 * then manifest.json last, so the directory never looks complete before it is.
 */
export async function fetchCheckpointForRank(
  store: ObjectStore,
  ref: CheckpointRef,
  dir: string,
  opts: { rank: number; worldSize: number; part?: 'weights' },
): Promise<void> {
  const { text, manifest } = await readRefManifest(store, ref);
  const where = `${ref.key}/${keys.manifestName}`;
  const files = rankFiles(manifest, where, opts.rank, opts.worldSize, opts.part).map((name) => {
    const file = manifest.files.find((f) => f.name === name);
    if (!file)
      throw badInput(`${where} does not list ${name}, which rank ${opts.rank} of ${opts.worldSize} reads`);
    return file;
  });
  await mkdir(dir, { recursive: true });
  // A manifest left from an earlier fetch must not vouch for files about to be replaced.
  await rm(join(dir, keys.manifestName), { force: true });
  for (const file of files) {
    const local = join(dir, file.name);
    if (!(await hasContent(local, file.bytes, file.sha256))) await downloadVerified(store, ref, file, local);
  }
  await writeFileAtomically(join(dir, keys.manifestName), Buffer.from(text));
}

/**
 * Fetches the Hugging Face directory a committed checkpoint holds (its manifest's
 * `huggingFace.files`, each checked against the manifest) into `dir`, for the PyTorch trainer.
 * A checkpoint without one (the native trainer's) is bad input.
 */
export async function fetchHuggingFaceForRank(
  store: ObjectStore,
  ref: CheckpointRef,
  dir: string,
): Promise<void> {
  const { manifest } = await readRefManifest(store, ref);
  const files = huggingFaceFiles(manifest, `${ref.key}/${keys.manifestName}`);
  if (!files)
    throw badInput(
      `checkpoint ${ref.key} holds no Hugging Face directory: the native trainer wrote it, and the PyTorch trainer (engine.trainer pytorch) continues only from checkpoints of its own campaign's import or updates`,
    );
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  for (const file of files) await downloadVerified(store, ref, file, join(dir, file.name));
}
