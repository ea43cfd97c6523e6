// manifest.json: parsing and checking it, hashing, and the errors every checkpoint module shares.
import { createHash } from 'node:crypto';
import { ApplicationFailure } from '@temporalio/common';
import * as keys from '../layout.js';
import { badInputErrorType } from '../types.js';
import type { CheckpointManifest, StagedCheckpoint } from '../types.js';

export const sha256Hex = (data: Buffer | string) => createHash('sha256').update(data).digest('hex');

export { sha256OfStream } from '../store/streams.js';

export const badInput = (message: string) =>
  ApplicationFailure.create({ type: badInputErrorType, nonRetryable: true, message });

/** A checkpoint directory already committed with other files: retrying cannot reconcile them. */
export const checkpointConflictErrorType = 'CheckpointConflict';

const sha256Pattern = /^[0-9a-f]{64}$/;
// File names become store keys and local paths: one plain segment, never hidden or `..`.
const fileNamePattern = /^[A-Za-z0-9_-][A-Za-z0-9._-]*$/;

export const isSha256 = (s: unknown): boolean => typeof s === 'string' && sha256Pattern.test(s);

/** Parses and checks a manifest; `where` names it in errors (a key or a path). */
export function parseManifest(text: string, where: string): CheckpointManifest {
  let m: CheckpointManifest;
  try {
    m = JSON.parse(text) as CheckpointManifest;
  } catch (err) {
    throw badInput(`${where} is not valid JSON: ${(err as Error).message}`);
  }
  if (m === null || typeof m !== 'object' || m.format !== 'moerl-checkpoint' || !Array.isArray(m.files))
    throw badInput(`${where} is not a moerl checkpoint manifest (format "${String(m?.format)}")`);
  if (m.files.length === 0) throw badInput(`${where} lists no files`);
  const names = new Set<string>();
  m.files.forEach((f, i) => {
    const at = `${where} files[${i}]`;
    if (f === null || typeof f !== 'object') throw badInput(`${at} is not an object`);
    if (typeof f.name !== 'string' || !fileNamePattern.test(f.name) || f.name === keys.manifestName)
      throw badInput(`${at}: name ${JSON.stringify(f.name)} is not a plain file name`);
    if (names.has(f.name)) throw badInput(`${at}: ${f.name} is listed twice`);
    names.add(f.name);
    if (!Number.isSafeInteger(f.bytes) || f.bytes < 0)
      throw badInput(`${at} (${f.name}): bytes ${JSON.stringify(f.bytes)} is not a byte count`);
    if (!isSha256(f.sha256))
      throw badInput(`${at} (${f.name}): sha256 ${JSON.stringify(f.sha256)} is not 64 lowercase hex digits`);
  });
  if (m.huggingFace !== undefined) huggingFaceFiles(m, where);
  return m;
}

/** The policy's weights: what moe_generate, moe_hf and the KL reference read. */
const weightFilePattern = /^(dense|experts-rank\d+)\.safetensors$/;
/**
 * Files of a moerl checkpoint proper: the weights and, in files of their own since manifest
 * version 2, the AdamW moments (`optimizer-<weights file>`), which only the next update reads.
 */
const moerlFilePattern = /^(optimizer-)?(dense|experts-rank\d+)\.safetensors$/;

/** The optimizer file of weights file `name` (docs/native-model.md, "Checkpoints"). */
export const optimizerFileName = (name: string) => `optimizer-${name}`;

/**
 * The files a reader of the policy fetches (a rollout, an export): the moerl weights files, not
 * the AdamW moments nor a Hugging Face directory. A checkpoint of manifest version 1 keeps its
 * moments inside these files, so its readers fetch them too.
 */
export function weightFiles(m: CheckpointManifest, where: string): CheckpointManifest['files'] {
  const files = m.files.filter((f) => weightFilePattern.test(f.name));
  if (!files.some((f) => f.name === 'dense.safetensors'))
    throw badInput(`${where} lists no dense.safetensors, so it holds no moerl policy`);
  return files;
}

/**
 * The files of the Hugging Face directory a checkpoint holds beside its moerl files (manifest
 * field `huggingFace.files`: the PyTorch trainer's policy, docs/engines.md), or null when it holds
 * none (the native trainer's checkpoints).
 */
export function huggingFaceFiles(m: CheckpointManifest, where: string): CheckpointManifest['files'] | null {
  if (m.huggingFace === undefined) return null;
  const names = (m.huggingFace as { files?: unknown } | null)?.files;
  if (!Array.isArray(names) || names.length === 0)
    throw badInput(`${where}: huggingFace.files must be a non-empty list of file names`);
  return names.map((name) => {
    const file = m.files.find((f) => f.name === name);
    if (typeof name !== 'string' || !file || moerlFilePattern.test(name))
      throw badInput(
        `${where}: huggingFace.files names ${JSON.stringify(name)}, not a listed file of the Hugging Face directory`,
      );
    return file;
  });
}

/**
 * `m` with the Hugging Face directory's files added (`where` names the directory in errors): each
 * must be a plain file name that is not one of the moerl checkpoint's own, and config.json must
 * be there.
 */
export function withHuggingFaceFiles(
  m: CheckpointManifest,
  files: CheckpointManifest['files'],
  where: string,
): CheckpointManifest {
  for (const f of files)
    if (!fileNamePattern.test(f.name) || f.name === keys.manifestName || moerlFilePattern.test(f.name))
      throw badInput(`${where}/${f.name}: a file of this name cannot join a moerl checkpoint`);
  if (!files.some((f) => f.name === 'config.json'))
    throw badInput(`${where} has no config.json, so it is not a Hugging Face model directory`);
  const sorted = [...files].sort((a, b) => (a.name < b.name ? -1 : 1));
  return { ...m, files: [...m.files, ...sorted], huggingFace: { files: sorted.map((f) => f.name) } };
}

/**
 * The staged checkpoint for a manifest the trainer produced (e.g. the text rank 0 uploads when
 * the ranks store their own files): checked, keyed by campaign and iteration. The manifest must
 * never be stored as the checkpoint's manifest.json itself — that is the commit's job.
 */
export function stagedCheckpointFromManifest(
  campaignId: string,
  iteration: number,
  manifestText: string,
  where = `the staged manifest of iteration ${iteration}`,
): StagedCheckpoint {
  if (!Number.isSafeInteger(iteration) || iteration < 0)
    throw badInput(`${where}: iteration ${iteration} is not a non-negative integer`);
  const manifest = parseManifest(manifestText, where);
  return { campaignId, iteration, key: keys.checkpointKey(campaignId, iteration), manifest };
}

/** The files two manifests disagree on ('' when none): name, and size and sha256 on each side. */
export function fileDifferences(committed: CheckpointManifest, staged: CheckpointManifest): string {
  const byName = (m: CheckpointManifest) => new Map(m.files.map((f) => [f.name, f]));
  const a = byName(committed);
  const b = byName(staged);
  const show = (f: { bytes: number; sha256: string } | undefined) =>
    f ? `${f.bytes} bytes, sha256 ${f.sha256.slice(0, 12)}…` : 'absent';
  const diffs: string[] = [];
  for (const name of [...new Set([...a.keys(), ...b.keys()])].sort()) {
    const x = a.get(name);
    const y = b.get(name);
    if (x?.bytes !== y?.bytes || x?.sha256 !== y?.sha256)
      diffs.push(`${name}: committed ${show(x)}, new ${show(y)}`);
  }
  return diffs.join('; ');
}
