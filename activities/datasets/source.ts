// Where a dataset's bytes come from: a local file (the CLI checking a file before it is put in
// the store, tests, benchmarks) or an object in a store (what workers read). JSONL is streamed
// from either; Parquet needs random access (footer first, then the row groups), so a store
// object is first copied to a local file, streamed to disk and hashed (the store has no ranged
// reads), and kept in the worker's cache under its content hash.
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { DatasetRef } from '../../workflows/spec-dataset.js';
import type { ObjectStore } from '../store/index.js';
import { hashingStream, sha256OfStream } from '../store/streams.js';
import type { StoreLocation } from '../types.js';
import { DatasetChangedError } from './errors.js';
import { hasContent, rememberContent } from '../store/verified-file.js';

export type DatasetInput = { path: string } | { store: ObjectStore; key: string };

/** A name for messages: the path, or the store and key. */
export function describeInput(input: DatasetInput): string {
  return 'path' in input ? input.path : `${input.key} in ${input.store.describe()}`;
}

/** The dataset's bytes as a stream. */
export function byteStream(input: DatasetInput): Readable {
  return 'path' in input ? createReadStream(input.path) : input.store.getStream(input.key);
}

/** A dataset's identity: what the workflow holds to know it reads the same rows every time. */
export interface DatasetIdentity {
  /** sha256 of the file's bytes, hex. */
  sha256: string;
  bytes: number;
  rows: number;
}

export { hashingStream };

/** sha256 and size of the dataset's bytes, streamed. */
export async function hashDataset(input: DatasetInput): Promise<{ sha256: string; bytes: number }> {
  return sha256OfStream(byteStream(input));
}

/**
 * A local file with the dataset's bytes, and their hash: the file itself for a path; for a
 * store object a copy in `cacheDir`, named by its sha256. The copy is reused while the object
 * keeps the entity tag it had when copied (S3) and the copy still has the object's size and
 * hash (store/verified-file.ts); a store without entity tags (fs) is read again.
 * With `expectedSha256`, bytes that hash otherwise are a DatasetChangedError (and not kept).
 */
export async function localCopy(
  input: DatasetInput,
  cacheDir: string,
  expectedSha256?: string,
): Promise<{ path: string; sha256: string; bytes: number }> {
  const check = (got: { sha256: string }) => {
    if (expectedSha256 !== undefined && got.sha256 !== expectedSha256)
      throw new DatasetChangedError(describeInput(input), expectedSha256, got.sha256);
  };
  if ('path' in input) {
    const got = await hashDataset(input);
    check(got);
    return { path: input.path, ...got };
  }
  await mkdir(cacheDir, { recursive: true });
  const head = await input.store.head(input.key);
  const origin = head?.etag === undefined ? undefined : `${input.store.describe()} ${input.key} ${head.etag}`;
  if (expectedSha256 !== undefined && origin !== undefined && head !== null) {
    const cached = join(cacheDir, `${expectedSha256}.dataset`);
    const seen = await readFile(`${cached}.origin`, 'utf8').catch(() => null);
    if (seen === origin && (await hasContent(cached, head.bytes, expectedSha256)))
      return { path: cached, sha256: expectedSha256, bytes: head.bytes };
  }
  const temp = join(
    cacheDir,
    `.download-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}`,
  );
  const hasher = hashingStream();
  try {
    await pipeline(byteStream(input), hasher, createWriteStream(temp));
    const got = hasher.digest();
    check(got);
    // Named by content: a concurrent download of the same bytes renames onto the same name.
    const path = join(cacheDir, `${got.sha256}.dataset`);
    await rename(temp, path);
    await rememberContent(path, got.sha256);
    if (origin !== undefined) await writeFile(`${path}.origin`, origin);
    return { path, ...got };
  } finally {
    await rm(temp, { force: true });
  }
}

/**
 * The store a dataset reference points into, and the key there: the campaign's own store, or
 * an S3 bucket reached with the campaign store's S3 settings (region, endpoint) when it has
 * them, AWS's defaults otherwise.
 */
export function datasetLocation(
  ref: DatasetRef,
  campaignStore: StoreLocation,
): { location: StoreLocation; key: string } {
  if (ref.kind === 'store') return { location: campaignStore, key: ref.key };
  const s3 = campaignStore.kind === 's3' ? campaignStore : undefined;
  return {
    location: {
      kind: 's3',
      bucket: ref.bucket,
      prefix: '',
      region: s3?.region ?? 'us-east-1',
      ...(s3?.endpoint ? { endpoint: s3.endpoint } : {}),
      forcePathStyle: s3?.forcePathStyle ?? false,
    },
    key: ref.key,
  };
}
