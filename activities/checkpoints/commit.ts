// Staging and committing checkpoints in the store, and retention. The commit point is the
// checkpoint's manifest.json, created only if absent and never rewritten or removed while
// LATEST can name it, so a commit can be retried from any step and returns the same ref.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import * as keys from '../layout.js';
import { StoreNotFoundError } from '../store/errors.js';
import { hashingStream } from '../store/streams.js';
import type { ObjectStore } from '../store/types.js';
import type { CheckpointManifest, CheckpointRef, StagedCheckpoint } from '../types.js';
import {
  badInput,
  checkpointConflictErrorType,
  fileDifferences,
  parseManifest,
  sha256Hex,
  sha256OfStream,
} from './manifest.js';
import { checkCheckpointFile, missingCheckpointFile, readRefManifest } from './fetch.js';

export interface CommitOptions {
  /** The mean reward the checkpoint was scored with; recorded in its manifest. */
  meanReward: number | null;
  keepLast: number;
  keepBest: boolean;
  /** The campaign's first checkpoint (the KL reference): always kept. */
  keepIteration: number;
  /** Checkpoints that in-flight or carried rollout phases sample from: always kept. Default []. */
  protectIterations?: number[];
  now: Date;
}

const manifestKeyOf = (key: string) => `${key}/${keys.manifestName}`;

async function getTextOrNull(store: ObjectStore, key: string): Promise<string | null> {
  try {
    return (await store.get(key)).toString('utf8');
  } catch (err) {
    if (err instanceof StoreNotFoundError) return null;
    throw err;
  }
}

/** A committed manifest's text, checked to belong to this campaign and iteration. */
function parseCommitted(text: string, campaignId: string, iteration: number): CheckpointManifest {
  const where = manifestKeyOf(keys.checkpointKey(campaignId, iteration));
  const m = parseManifest(text, where);
  if (m.moerl?.campaignId !== campaignId || m.moerl.iteration !== iteration)
    throw badInput(
      m.moerl
        ? `${where} was committed for campaign ${m.moerl.campaignId} iteration ${m.moerl.iteration}, not campaign ${campaignId} iteration ${iteration}`
        : `${where} has no moerl section: it was not written by a checkpoint commit`,
    );
  return m;
}

function refOf(campaignId: string, iteration: number, text: string, m: CheckpointManifest): CheckpointRef {
  const key = keys.checkpointKey(campaignId, iteration);
  return {
    campaignId,
    iteration,
    key,
    manifestSha256: sha256Hex(text),
    meanReward: m.moerl?.meanReward ?? null,
  };
}

/**
 * The manifest already committed for a staged checkpoint, or null when there is none. One with
 * other files means a re-run produced other bytes: that never mixes with what is committed.
 */
async function readCommitted(store: ObjectStore, staged: StagedCheckpoint) {
  const text = await getTextOrNull(store, manifestKeyOf(staged.key));
  if (text === null) return null;
  const manifest = parseCommitted(text, staged.campaignId, staged.iteration);
  const diff = fileDifferences(manifest, staged.manifest);
  if (diff)
    throw ApplicationFailure.create({
      type: checkpointConflictErrorType,
      nonRetryable: true,
      message: `${staged.key} is already committed with other files (${diff}): iteration ${staged.iteration} was run again and produced different bytes; the committed checkpoint is kept as it is`,
    });
  return { text, manifest };
}

/**
 * A committed checkpoint of a campaign, or null when iteration `iteration` has none: its
 * manifest, checked (this campaign and iteration, every file present with its size).
 */
export async function committedCheckpoint(
  store: ObjectStore,
  campaignId: string,
  iteration: number,
): Promise<{ ref: CheckpointRef; manifest: CheckpointManifest } | null> {
  const key = keys.checkpointKey(campaignId, iteration);
  const text = await getTextOrNull(store, manifestKeyOf(key));
  if (text === null) return null;
  const manifest = parseCommitted(text, campaignId, iteration);
  for (const file of manifest.files) {
    const info = await store.head(`${key}/${file.name}`);
    if (info?.bytes !== file.bytes)
      throw badInput(
        `committed checkpoint file ${key}/${file.name} ${info ? `has ${info.bytes} bytes` : 'is missing'}; its manifest says ${file.bytes} bytes`,
      );
  }
  return { ref: refOf(campaignId, iteration, text, manifest), manifest };
}

/**
 * Uploads a local checkpoint directory's files (not its manifest) under the checkpoint's key.
 * A checkpoint committed already is never overwritten: with the same files nothing is uploaded,
 * with other files it fails (CheckpointConflict, not retryable).
 */
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
  const staged = { campaignId, iteration, key, manifest };
  if (await readCommitted(store, staged)) return staged;
  for (const file of manifest.files) await store.putFile(`${key}/${file.name}`, join(localDir, file.name));
  return staged;
}

/**
 * Stages a committed checkpoint (another campaign's: a fork) under the checkpoint key of
 * `campaignId` and `iteration` by copying it object by object within the store, streamed, so
 * no local disk holds it (a worker's cache volume is smaller than a checkpoint may be). The
 * commit checks every copied file against the manifest. As stageCheckpoint, a checkpoint
 * committed already is never overwritten.
 */
export async function stageCopiedCheckpoint(
  store: ObjectStore,
  source: CheckpointRef,
  campaignId: string,
  iteration: number,
): Promise<StagedCheckpoint> {
  const { manifest } = await readRefManifest(store, source);
  const key = keys.checkpointKey(campaignId, iteration);
  const staged = { campaignId, iteration, key, manifest };
  if (await readCommitted(store, staged)) return staged;
  const copied: string[] = [];
  try {
    for (const file of manifest.files) {
      // hashed on the way through, so a damaged source fails here, before anything is staged
      const target = `${key}/${file.name}`;
      const through = hashingStream();
      const from = store.getStream(`${source.key}/${file.name}`);
      from.on('error', (err) => through.destroy(err));
      copied.push(target);
      await store.put(target, from.pipe(through)).catch(missingCheckpointFile(store, source, file));
      checkCheckpointFile(source, file, through.digest());
    }
  } catch (err) {
    // nothing half-copied stays under the fork's key
    await Promise.all(copied.map((k) => store.delete(k).catch(() => undefined)));
    throw err;
  }
  return staged;
}

/**
 * Commits a staged checkpoint: every file is read back and checked against the manifest, files
 * under the key that the manifest does not name are removed, the manifest is created (the commit
 * point), then LATEST, then retention. Idempotent: when the manifest exists with the same files
 * it is left as it is (so the ref, manifestSha256 included, is the one first committed) and the
 * remaining steps run again, finishing an interrupted commit. Other files: CheckpointConflict.
 */
export async function commitCheckpoint(
  store: ObjectStore,
  staged: StagedCheckpoint,
  opts: CommitOptions,
): Promise<{ checkpoint: CheckpointRef; removed: string[] }> {
  const { key, campaignId, iteration } = staged;
  const existing = await readCommitted(store, staged);
  for (const file of staged.manifest.files) {
    const fileKey = `${key}/${file.name}`;
    const got = await sha256OfStream(store.getStream(fileKey));
    if (got.sha256 !== file.sha256 || got.bytes !== file.bytes)
      throw ApplicationFailure.create({
        type: 'StagedCheckpointCorrupt',
        message: `staged ${fileKey} has ${got.bytes} bytes, sha256 ${got.sha256}; the update wrote ${file.bytes} bytes, sha256 ${file.sha256}`,
      });
  }
  const named = new Set([...staged.manifest.files.map((f) => `${key}/${f.name}`), manifestKeyOf(key)]);
  const stray: string[] = [];
  for await (const obj of store.list(`${key}/`)) if (!named.has(obj.key)) stray.push(obj.key);
  for (const k of stray) await store.delete(k);

  let committed = existing;
  if (!committed) {
    const manifest: CheckpointManifest = {
      ...staged.manifest,
      moerl: { campaignId, iteration, meanReward: opts.meanReward, committedAt: opts.now.toISOString() },
    };
    const text = JSON.stringify(manifest);
    // Created only if absent: an attempt that lost a race (or a zombie one) keeps the winner's.
    if (await store.createIfAbsent(manifestKeyOf(key), text)) committed = { text, manifest };
    else committed = await readCommitted(store, staged);
    if (!committed) throw new Error(`${manifestKeyOf(key)} vanished while it was being committed`);
  }
  const checkpoint = refOf(campaignId, iteration, committed.text, committed.manifest);
  await advanceLatest(store, checkpoint);
  const removed = await applyRetention(store, campaignId, iteration, opts);
  return { checkpoint, removed };
}

/** Points LATEST at `ref` unless it already names it or a later checkpoint (a late retry). */
async function advanceLatest(store: ObjectStore, ref: CheckpointRef): Promise<void> {
  const key = keys.latestKey(ref.campaignId);
  const text = JSON.stringify(ref);
  const current = await getTextOrNull(store, key);
  if (current === text) return;
  let currentIteration = -1;
  try {
    const it: unknown = current === null ? -1 : (JSON.parse(current) as CheckpointRef).iteration;
    if (typeof it === 'number') currentIteration = it;
  } catch {
    // An unreadable LATEST is replaced: it is only ever written here, whole.
  }
  if (currentIteration > ref.iteration) return;
  await store.put(key, text, { contentType: 'application/json' });
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

/**
 * Removes committed checkpoints before `latest` that retention does not keep (the last
 * `keepLast`, the best by reward, the reference, the protected ones), and directories before it
 * without a manifest (debris of attempts that never committed). Iterations from `latest` on
 * are never touched: a late retry of an older commit must not remove newer work.
 */
async function applyRetention(
  store: ObjectStore,
  campaignId: string,
  latest: number,
  opts: Pick<CommitOptions, 'keepLast' | 'keepBest' | 'keepIteration' | 'protectIterations'>,
): Promise<string[]> {
  const protect = opts.protectIterations ?? [];
  for (const it of protect)
    if (!Number.isSafeInteger(it))
      throw badInput(`protectIterations: ${JSON.stringify(it)} is not an iteration`);
  const dirs = await scanCheckpoints(store, campaignId);
  const committed = [...dirs].filter(([, has]) => has).map(([it]) => it);
  const keep = new Set<number>([latest, opts.keepIteration, ...protect]);
  committed
    .filter((it) => it <= latest)
    .sort((a, b) => b - a)
    .slice(0, opts.keepLast)
    .forEach((it) => keep.add(it));
  if (opts.keepBest) {
    let best: { it: number; reward: number } | null = null;
    for (const it of committed) {
      const where = manifestKeyOf(keys.checkpointKey(campaignId, it));
      const text = await getTextOrNull(store, where);
      if (text === null) continue; // removed meanwhile by another commit's retention
      const reward = parseManifest(text, where).moerl?.meanReward;
      if (typeof reward === 'number' && (best === null || reward > best.reward)) best = { it, reward };
    }
    if (best) keep.add(best.it);
  }
  const removed: string[] = [];
  for (const [it, hasManifest] of dirs) {
    if (it >= latest || (keep.has(it) && hasManifest)) continue;
    const key = keys.checkpointKey(campaignId, it);
    // Manifest first: a checkpoint stops existing before its files go.
    await store.delete(manifestKeyOf(key));
    await store.deletePrefix(`${key}/`);
    if (hasManifest) removed.push(key);
  }
  return removed;
}
