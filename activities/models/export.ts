// A committed checkpoint of a campaign as a Hugging Face model directory: the checkpoint's weights
// (not its AdamW moments) and the model files the campaign started from (campaigns/<id>/model/:
// config.json, tokenizer, generation config) are downloaded and verified into a temporary folder,
// `moe_hf export` writes the directory, and it is published manifest-last: config.json is the
// last file a reader can see, so a directory or prefix with a config.json is a whole export. A
// local directory is written beside its target and renamed into place; an object store target
// (S3) gets every other file first, then config.json. Used by `moerl export`; no heartbeats, and
// an aborted signal stops between files and kills the native tool.
import { randomUUID } from 'node:crypto';
import { mkdir, mkdtemp, readdir, rename, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { badInput, weightFiles } from '../checkpoints/manifest.js';
import { committedCheckpoint } from '../checkpoints/commit.js';
import { installCheckpoint } from '../checkpoints/fetch.js';
import * as keys from '../layout.js';
import { nativeBinDir, nativeToolPath, runTool, toolFailure } from '../native.js';
import { StoreNotFoundError } from '../store/errors.js';
import type { ObjectStore } from '../store/types.js';
import type { CheckpointRef } from '../types.js';

/** The file whose presence makes an export whole: written last. */
export const exportManifestName = 'config.json';

/** Where an export goes: a local directory, or the root of an object store (an S3 prefix). */
export type ExportTarget = { kind: 'dir'; path: string } | { kind: 'store'; store: ObjectStore };

export interface ExportOptions {
  /** The campaign's store: its checkpoints and model files. */
  store: ObjectStore;
  campaignId: string;
  /** A committed checkpoint's iteration; default the one LATEST names. */
  iteration?: number;
  target: ExportTarget;
  /** Largest safetensors shard (moe_hf --max-shard-bytes); default moe_hf's 5e9. */
  maxShardBytes?: number;
  /** Replace what the target holds (an earlier export); without it the target must be empty. */
  replace?: boolean;
  /** Where the temporary folder goes (the checkpoint's weights are downloaded there); default the OS's. */
  workDir?: string;
  /** Folder of the native tools; default nativeBinDir(). */
  binDir?: string;
  /** Stops the export between files and kills moe_hf; nothing is published after it aborts. */
  signal?: AbortSignal;
  /** One line per step (download, export, publish), for a progress display. */
  onStep?: (line: string) => void;
}

export interface ExportResult {
  campaignId: string;
  iteration: number;
  checkpoint: CheckpointRef;
  /** The target: a local path, or the store's describe(). */
  out: string;
  /** Every file of the export, config.json last (the order they were published in). */
  files: { name: string; bytes: number }[];
  seconds: number;
}

/** Exports one committed checkpoint of a campaign; see the file comment. */
export async function exportCheckpoint(opts: ExportOptions): Promise<ExportResult> {
  const started = Date.now();
  const { store, campaignId, signal } = opts;
  const found = await findCheckpoint(store, campaignId, opts.iteration);
  const modelFiles = await listModelFiles(store, campaignId);
  const out = await checkTarget(opts.target, opts.replace === true);
  const moeHf = nativeToolPath('moe_hf', opts.binDir ?? nativeBinDir());

  const work = await mkdtemp(join(opts.workDir ?? tmpdir(), 'moerl-export-'));
  // A local target's files are written beside it, so that publishing is one rename.
  const staging = opts.target.kind === 'dir' ? siblingPath(out, 'partial') : join(work, 'hf-model');
  try {
    const modelDir = join(work, 'model');
    await mkdir(modelDir);
    for (const name of modelFiles) {
      signal?.throwIfAborted();
      await store.getFile(`${keys.modelPrefix(campaignId)}/${name}`, join(modelDir, name));
    }
    const checkpointDir = join(work, 'checkpoint');
    const bytes = weightFiles(found.manifest, found.ref.key).reduce((n, f) => n + f.bytes, 0);
    opts.onStep?.(
      `downloading the weights of checkpoint ${found.ref.key} (${bytes} bytes) from ${store.describe()}`,
    );
    await installCheckpoint(store, found.ref, checkpointDir, {
      part: 'weights',
      ...(signal ? { signal } : {}),
    });

    opts.onStep?.(`moe_hf export of iteration ${found.ref.iteration}`);
    signal?.throwIfAborted();
    const args = ['export', '--checkpoint', checkpointDir, '--config', join(modelDir, 'config.json')];
    args.push('--out', staging);
    if (opts.maxShardBytes !== undefined) args.push('--max-shard-bytes', String(opts.maxShardBytes));
    const run = await runTool(moeHf, args, signal ? { signal } : {});
    signal?.throwIfAborted();
    if (run.code !== 0) throw toolFailure(`moe_hf export of ${found.ref.key}`, run);

    const files = await exportedFiles(staging);
    opts.onStep?.(`publishing ${files.length} files to ${out}, ${exportManifestName} last`);
    if (opts.target.kind === 'dir') await publishDir(staging, out);
    else await publishToStore(opts.target.store, staging, files, signal);
    return {
      campaignId,
      iteration: found.ref.iteration,
      checkpoint: found.ref,
      out,
      files,
      seconds: (Date.now() - started) / 1000,
    };
  } finally {
    await rm(work, { recursive: true, force: true });
    if (opts.target.kind === 'dir') await rm(staging, { recursive: true, force: true });
  }
}

/** The committed checkpoint to export: `iteration`'s, or LATEST's. */
async function findCheckpoint(store: ObjectStore, campaignId: string, iteration: number | undefined) {
  let it = iteration;
  if (it === undefined) {
    const latest = await store.get(keys.latestKey(campaignId)).catch(async (err: unknown) => {
      if (!(err instanceof StoreNotFoundError)) throw err;
      await checkCampaignExists(store, campaignId);
      throw badInput(
        `campaign ${campaignId} has no committed checkpoint yet (no ${keys.latestKey(campaignId)} in ${store.describe()})`,
      );
    });
    let named: unknown;
    try {
      named = (JSON.parse(latest.toString('utf8')) as Partial<CheckpointRef>).iteration;
    } catch {
      named = undefined;
    }
    if (!Number.isSafeInteger(named))
      throw badInput(`${keys.latestKey(campaignId)} in ${store.describe()} does not name a checkpoint`);
    it = named as number;
  }
  const found = await committedCheckpoint(store, campaignId, it);
  if (found) return found;
  await checkCampaignExists(store, campaignId);
  const committed = await committedIterations(store, campaignId);
  throw badInput(
    `campaign ${campaignId} has no committed checkpoint of iteration ${it} in ${store.describe()} (committed and kept: ${committed.join(', ') || 'none'})`,
  );
}

/** The first key under `prefix`, or null when there is none. */
async function firstKey(store: ObjectStore, prefix: string): Promise<string | null> {
  for await (const obj of store.list(prefix)) return obj.key;
  return null;
}

async function checkCampaignExists(store: ObjectStore, campaignId: string): Promise<void> {
  if ((await firstKey(store, `${keys.campaignPrefix(campaignId)}/`)) === null)
    throw badInput(`campaign ${campaignId} has nothing in ${store.describe()}: no such campaign there`);
}

/** Iterations with a manifest.json, in order. */
async function committedIterations(store: ObjectStore, campaignId: string): Promise<number[]> {
  const out: number[] = [];
  for await (const obj of store.list(`${keys.checkpointsPrefix(campaignId)}/`)) {
    const it = keys.checkpointIterationOf(obj.key);
    if (it !== null && obj.key === `${keys.checkpointKey(campaignId, it)}/${keys.manifestName}`) out.push(it);
  }
  return out.sort((a, b) => a - b);
}

/** The Hugging Face files kept for the campaign (names of hfModelFiles); config.json must be one. */
async function listModelFiles(store: ObjectStore, campaignId: string): Promise<string[]> {
  const prefix = `${keys.modelPrefix(campaignId)}/`;
  const known = new Set<string>(keys.hfModelFiles);
  const names: string[] = [];
  for await (const obj of store.list(prefix)) {
    const name = obj.key.slice(prefix.length);
    if (known.has(name)) names.push(name);
  }
  if (!names.includes('config.json'))
    throw badInput(
      `campaign ${campaignId} did not start from a Hugging Face model: ${store.describe()} has no ${prefix}config.json`,
    );
  return names;
}

/** Checks that the target can take an export; returns how it is named in messages. */
async function checkTarget(target: ExportTarget, replace: boolean): Promise<string> {
  if (target.kind === 'store') {
    const where = target.store.describe();
    const held = replace ? null : await firstKey(target.store, '');
    if (held !== null)
      throw badInput(`export target ${where} is not empty (it holds ${held}): choose an empty one`);
    return where;
  }
  const path = resolve(target.path);
  const info = await stat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null;
    throw err;
  });
  if (info && !info.isDirectory()) throw badInput(`export target ${path} exists and is not a directory`);
  if (info && !replace && (await readdir(path)).length > 0)
    throw badInput(`export target ${path} is not empty: choose a new or empty directory`);
  await mkdir(dirname(path), { recursive: true });
  return path;
}

/** `<dir>/.<name>.<what>-<pid>-<random>`: a hidden sibling on the same filesystem. */
function siblingPath(path: string, what: string): string {
  return join(dirname(path), `.${basename(path)}.${what}-${process.pid}-${randomUUID().slice(0, 8)}`);
}

/** The files moe_hf wrote, config.json last. */
async function exportedFiles(dir: string): Promise<{ name: string; bytes: number }[]> {
  const names = (await readdir(dir)).sort();
  if (!names.includes(exportManifestName))
    throw new Error(`moe_hf export wrote no ${exportManifestName} in ${dir}`);
  const ordered = [...names.filter((n) => n !== exportManifestName), exportManifestName];
  return Promise.all(ordered.map(async (name) => ({ name, bytes: (await stat(join(dir, name))).size })));
}

/**
 * Renames the finished directory into place. An empty target is replaced by the rename itself;
 * one holding an earlier export is moved aside first and removed after, so a reader finds the
 * old export, nothing, or the new one, never a mix.
 */
async function publishDir(staging: string, path: string): Promise<void> {
  const existing = await readdir(path).catch(() => null);
  if (existing === null || existing.length === 0) {
    await rename(staging, path);
    return;
  }
  const old = siblingPath(path, 'replaced');
  await rename(path, old);
  try {
    await rename(staging, path);
  } catch (err) {
    await rename(old, path).catch(() => undefined);
    throw err;
  }
  await rm(old, { recursive: true, force: true });
}

/**
 * Uploads the export with config.json last. A config.json already there (an earlier export
 * being replaced) goes first, so from then on the target reads as incomplete; objects the new
 * export does not have are removed before the new config.json makes it whole.
 */
async function publishToStore(
  target: ObjectStore,
  dir: string,
  files: { name: string }[],
  signal: AbortSignal | undefined,
): Promise<void> {
  await target.delete(exportManifestName);
  const names = new Set(files.map((f) => f.name));
  for (const { name } of files) {
    if (name === exportManifestName) continue;
    signal?.throwIfAborted();
    await target.putFile(name, join(dir, name), { contentType: contentTypeOf(name) });
  }
  const stray: string[] = [];
  for await (const obj of target.list('')) if (!names.has(obj.key)) stray.push(obj.key);
  for (const key of stray) await target.delete(key);
  signal?.throwIfAborted();
  await target.putFile(exportManifestName, join(dir, exportManifestName), {
    contentType: contentTypeOf(exportManifestName),
  });
}

function contentTypeOf(name: string): string {
  if (name.endsWith('.json')) return 'application/json';
  if (name.endsWith('.jinja') || name.endsWith('.txt')) return 'text/plain; charset=utf-8';
  return 'application/octet-stream';
}
