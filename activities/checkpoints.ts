// Checkpoints between the native trainer's local directories and the object store:
// staging (upload every file but the manifest), committing (verify, manifest last, LATEST,
// retention, debris removal) and fetching into a local cache keyed by the manifest's sha256.
import { createHash, randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { ApplicationFailure } from '@temporalio/common';
import * as keys from './layout.js';
import { StoreNotFoundError } from './store/errors.js';
import type { ObjectStore } from './store/types.js';
import { badInputErrorType } from './types.js';
import type { CheckpointManifest, CheckpointRef, StagedCheckpoint } from './types.js';

export const sha256Hex = (data: Buffer | string) => createHash('sha256').update(data).digest('hex');

export async function sha256OfStream(stream: Readable): Promise<{ sha256: string; bytes: number }> {
  const hash = createHash('sha256');
  let bytes = 0;
  for await (const chunk of stream) {
    hash.update(chunk as Buffer);
    bytes += (chunk as Buffer).length;
  }
  return { sha256: hash.digest('hex'), bytes };
}

const badInput = (message: string) =>
  ApplicationFailure.create({ type: badInputErrorType, nonRetryable: true, message });

function parseManifest(text: string, where: string): CheckpointManifest {
  let m: CheckpointManifest;
  try {
    m = JSON.parse(text) as CheckpointManifest;
  } catch (err) {
    throw badInput(`${where} is not valid JSON: ${(err as Error).message}`);
  }
  if (m.format !== 'moerl-checkpoint' || !Array.isArray(m.files) || m.files.length === 0)
    throw badInput(`${where} is not a moerl checkpoint manifest (format "${String(m.format)}")`);
  return m;
}

/** Uploads a local checkpoint directory's files (not its manifest) under the checkpoint's key. */
export async function stageCheckpoint(
  store: ObjectStore,
  localDir: string,
  campaignId: string,
  iteration: number,
): Promise<StagedCheckpoint> {
  const manifest = parseManifest(
    await readFile(join(localDir, keys.manifestName), 'utf8'),
    `${localDir}/${keys.manifestName}`,
  );
  const key = keys.checkpointKey(campaignId, iteration);
  for (const file of manifest.files) await store.putFile(`${key}/${file.name}`, join(localDir, file.name));
  return { campaignId, iteration, key, manifest };
}

/**
 * Commits a staged checkpoint: every file is read back and checked against the manifest, then
 * the manifest is written (the commit point), then LATEST. Files under the key that the manifest
 * does not name, and checkpoint directories left without a manifest by earlier attempts, are
 * removed; so are committed checkpoints that retention no longer keeps.
 */
export async function commitCheckpoint(
  store: ObjectStore,
  staged: StagedCheckpoint,
  opts: { meanReward: number | null; keepLast: number; keepBest: boolean; keepIteration: number; now: Date },
): Promise<{ checkpoint: CheckpointRef; removed: string[] }> {
  const { key, campaignId, iteration } = staged;
  for (const file of staged.manifest.files) {
    const fileKey = `${key}/${file.name}`;
    const got = await sha256OfStream(store.getStream(fileKey));
    if (got.sha256 !== file.sha256 || got.bytes !== file.bytes)
      throw ApplicationFailure.create({
        type: 'StagedCheckpointCorrupt',
        message: `staged ${fileKey} has ${got.bytes} bytes, sha256 ${got.sha256}; the update wrote ${file.bytes} bytes, sha256 ${file.sha256}`,
      });
  }
  const named = new Set(staged.manifest.files.map((f) => `${key}/${f.name}`));
  for await (const obj of store.list(`${key}/`)) if (!named.has(obj.key)) await store.delete(obj.key);

  const manifest: CheckpointManifest = {
    ...staged.manifest,
    moerl: { campaignId, iteration, meanReward: opts.meanReward, committedAt: opts.now.toISOString() },
  };
  const text = JSON.stringify(manifest);
  await store.put(`${key}/${keys.manifestName}`, text, { contentType: 'application/json' });
  const checkpoint: CheckpointRef = {
    campaignId,
    iteration,
    key,
    manifestSha256: sha256Hex(text),
    meanReward: opts.meanReward,
  };
  await store.put(keys.latestKey(campaignId), JSON.stringify(checkpoint), {
    contentType: 'application/json',
  });
  const removed = await applyRetention(store, campaignId, iteration, opts);
  return { checkpoint, removed };
}

/** Committed checkpoints of a campaign (those with a manifest), and directories without one. */
async function scanCheckpoints(store: ObjectStore, campaignId: string) {
  const dirs = new Map<number, boolean>();
  for await (const obj of store.list(`${keys.checkpointsPrefix(campaignId)}/`)) {
    const it = keys.checkpointIterationOf(obj.key);
    if (it === null) continue;
    dirs.set(it, (dirs.get(it) ?? false) || obj.key.endsWith(`/${keys.manifestName}`));
  }
  return dirs;
}

async function applyRetention(
  store: ObjectStore,
  campaignId: string,
  latest: number,
  opts: { keepLast: number; keepBest: boolean; keepIteration: number },
): Promise<string[]> {
  const dirs = await scanCheckpoints(store, campaignId);
  const committed = [...dirs].filter(([, has]) => has).map(([it]) => it);
  const keep = new Set<number>([latest, opts.keepIteration]);
  committed
    .filter((it) => it <= latest)
    .sort((a, b) => b - a)
    .slice(0, opts.keepLast)
    .forEach((it) => keep.add(it));
  if (opts.keepBest) {
    let best: { it: number; reward: number } | null = null;
    for (const it of committed) {
      const m = parseManifest(
        (await store.get(`${keys.checkpointKey(campaignId, it)}/${keys.manifestName}`)).toString('utf8'),
        `checkpoint ${it}`,
      );
      const reward = m.moerl?.meanReward;
      if (typeof reward === 'number' && (best === null || reward > best.reward)) best = { it, reward };
    }
    if (best) keep.add(best.it);
  }
  const removed: string[] = [];
  for (const [it, hasManifest] of dirs) {
    // A directory without a manifest is debris of an attempt that never committed.
    if (keep.has(it) && hasManifest) continue;
    if (it === latest) continue;
    const key = keys.checkpointKey(campaignId, it);
    // Manifest first: a checkpoint stops existing before its files go.
    await store.delete(`${key}/${keys.manifestName}`);
    await store.deletePrefix(`${key}/`);
    if (hasManifest) removed.push(key);
  }
  return removed;
}

/**
 * Makes a committed checkpoint available as a local directory the native tools can read.
 * The cache is keyed by the manifest's sha256, so a directory there is complete and verified.
 */
export async function fetchCheckpoint(
  store: ObjectStore,
  ref: CheckpointRef,
  cacheDir: string,
): Promise<string> {
  const dir = join(cacheDir, 'checkpoints', ref.manifestSha256);
  if (await stat(join(dir, keys.manifestName)).catch(() => null)) return dir;
  const manifestKey = `${ref.key}/${keys.manifestName}`;
  const text = (await store.get(manifestKey)).toString('utf8');
  if (sha256Hex(text) !== ref.manifestSha256)
    throw badInput(
      `${manifestKey} changed after it was committed (sha256 ${sha256Hex(text)}, expected ${ref.manifestSha256})`,
    );
  const manifest = parseManifest(text, manifestKey);
  const tmp = `${dir}.partial-${process.pid}-${randomUUID().slice(0, 8)}`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp, { recursive: true });
  try {
    for (const file of manifest.files) {
      const local = join(tmp, file.name);
      await store.getFile(`${ref.key}/${file.name}`, local).catch((err: unknown) => {
        if (!(err instanceof StoreNotFoundError)) throw err;
        throw badInput(
          `checkpoint file ${ref.key}/${file.name} is missing: the manifest lists it (${file.bytes} bytes), ${store.describe()} has no such object`,
        );
      });
      const got = await sha256OfStream(createReadStream(local));
      if (got.sha256 !== file.sha256 || got.bytes !== file.bytes)
        throw badInput(
          `checkpoint file ${ref.key}/${file.name} is corrupt: ${got.bytes} bytes, sha256 ${got.sha256}; the manifest says ${file.bytes} bytes, sha256 ${file.sha256}`,
        );
    }
    await writeFile(join(tmp, keys.manifestName), text);
    await rename(tmp, dir).catch(async (err: NodeJS.ErrnoException) => {
      // Another activity in this process cached the same checkpoint first: use theirs.
      if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
      await rm(tmp, { recursive: true, force: true });
    });
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
  return dir;
}
