// A worker's decoded copy of a Parquet dataset, so that shards read their rows by offset.
// A shard's rows are spread over the whole file, so reading them from the Parquet file decodes
// every row group (31 s for a million rows, docs/benchmarks.md); decoded once per worker into
// JSON lines plus an offset index (8 bytes a row), each later read costs one positioned read
// a row. Named by the dataset's sha256 and the columns read. A manifest written last gives the
// rows, the two files' sizes and sha256s: a copy without it, or whose files are not those
// (store/verified-file.ts: sizes at every use, hashes once per process), is decoded again.
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, open, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { once } from 'node:events';
import { join } from 'node:path';
import { DatasetProblem } from './errors.js';
import { readParquetGroup, rowGroupCount, type ParquetFile } from './parquet.js';
import { hasContent, rememberContent } from '../store/verified-file.js';

export interface RowCache {
  /** The decoded rows, one JSON object a line. */
  path: string;
  /** Byte offset of each row's line, and the file's length at the end (rows + 1 entries). */
  offsets: Float64Array;
}

interface Manifest {
  rows: number;
  bytes: number;
  sha256: string;
  indexSha256: string;
}

/** The cached rows of the open Parquet file `pq` (bytes of sha256 `sha256`) in `columns`. */
export async function parquetRowCache(
  pq: ParquetFile,
  sha256: string,
  columns: readonly string[],
  cacheDir: string,
): Promise<RowCache> {
  const name = `${sha256}-${createHash('sha256').update(columns.join('\0')).digest('hex').slice(0, 16)}`;
  const path = join(cacheDir, `${name}.rows.jsonl`);
  const indexPath = join(cacheDir, `${name}.rows.idx`);
  const manifestPath = join(cacheDir, `${name}.rows.json`);
  const found = await cachedOffsets(pq.rows, path, indexPath, manifestPath);
  if (found) return { path, offsets: found };

  await mkdir(cacheDir, { recursive: true });
  await rm(manifestPath, { force: true });
  const suffix = `${process.pid}-${Math.random().toString(36).slice(2)}.tmp`;
  const temp = `${path}.${suffix}`;
  const indexTemp = `${indexPath}.${suffix}`;
  const offsets = new Float64Array(pq.rows + 1);
  try {
    const out = createWriteStream(temp);
    const hash = createHash('sha256');
    let at = 0;
    for (let g = 0; g < rowGroupCount(pq); g++) {
      const start = pq.groupStarts[g] as number;
      for (const [i, got] of (await readParquetGroup(pq, g, [...columns])).entries()) {
        if ('problem' in got) throw new DatasetProblem(`row ${start + i}: ${got.problem}`);
        const line = JSON.stringify(got.record) + '\n';
        hash.update(line);
        if (!out.write(line)) await once(out, 'drain');
        at += Buffer.byteLength(line);
        offsets[start + i + 1] = at;
      }
    }
    out.end();
    await once(out, 'finish');
    const index = Buffer.from(offsets.buffer);
    await writeFile(indexTemp, index);
    await rename(temp, path);
    await rename(indexTemp, indexPath);
    const manifest: Manifest = {
      rows: pq.rows,
      bytes: at,
      sha256: hash.digest('hex'),
      indexSha256: createHash('sha256').update(index).digest('hex'),
    };
    await rememberContent(path, manifest.sha256);
    await rememberContent(indexPath, manifest.indexSha256);
    await writeFile(`${manifestPath}.${suffix}`, JSON.stringify(manifest));
    await rename(`${manifestPath}.${suffix}`, manifestPath);
  } finally {
    await rm(temp, { force: true });
    await rm(indexTemp, { force: true });
  }
  return { path, offsets };
}

/** The offsets of a complete cached copy of `rows` rows whose files are the manifest's, or null. */
async function cachedOffsets(
  rows: number,
  path: string,
  indexPath: string,
  manifestPath: string,
): Promise<Float64Array | null> {
  let manifest: Manifest;
  try {
    manifest = JSON.parse(await readFile(manifestPath, 'utf8')) as Manifest;
  } catch {
    return null;
  }
  const indexBytes = 8 * (rows + 1);
  if (
    manifest.rows !== rows ||
    !(await hasContent(indexPath, indexBytes, manifest.indexSha256)) ||
    !(await hasContent(path, manifest.bytes, manifest.sha256))
  )
    return null;
  const index = await readFile(indexPath);
  if (index.length !== indexBytes) return null;
  const offsets = new Float64Array(index.buffer, index.byteOffset, rows + 1).slice();
  return offsets[rows] === manifest.bytes ? offsets : null;
}

/** The records of the given rows (each below the row count), by positioned reads. */
export async function readCachedRecords(
  cache: RowCache,
  rows: readonly number[],
): Promise<Map<number, unknown>> {
  const records = new Map<number, unknown>();
  const file = await open(cache.path, 'r');
  try {
    for (const row of rows) {
      const start = cache.offsets[row] as number;
      const bytes = Buffer.alloc((cache.offsets[row + 1] as number) - start);
      await file.read(bytes, 0, bytes.length, start);
      records.set(row, JSON.parse(bytes.toString('utf8')) as unknown);
    }
  } finally {
    await file.close();
  }
  return records;
}
