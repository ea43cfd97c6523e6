// A worker's decoded copy of a Parquet dataset, so that shards read their rows by offset.
// A shard's rows are spread over the whole file, so reading them from the Parquet file decodes
// every row group (31 s for a million rows, docs/benchmarks.md); decoded once per worker into
// JSON lines plus an offset index (8 bytes a row), each later read costs one positioned read
// a row. Named by the dataset's sha256 and the columns read; the index is written last, so a
// copy without its index is never used.
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, open, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { once } from 'node:events';
import { join } from 'node:path';
import { openParquet, readParquetRows, rowGroupRanges } from './parquet.js';

export interface RowCache {
  /** The decoded rows, one JSON object a line. */
  path: string;
  /** Byte offset of each row's line, and the file's length at the end (rows + 1 entries). */
  offsets: Float64Array;
}

export async function parquetRowCache(
  parquetPath: string,
  sha256: string,
  columns: readonly string[],
  cacheDir: string,
): Promise<RowCache> {
  const name = `${sha256}-${createHash('sha256').update(columns.join('\0')).digest('hex').slice(0, 16)}`;
  const path = join(cacheDir, `${name}.rows.jsonl`);
  const indexPath = join(cacheDir, `${name}.rows.idx`);
  const index = await readFile(indexPath).catch(() => null);
  if (index !== null && index.length % 8 === 0)
    return { path, offsets: new Float64Array(index.buffer, index.byteOffset, index.length / 8).slice() };

  await mkdir(cacheDir, { recursive: true });
  const pq = await openParquet(parquetPath);
  const temp = `${path}.${process.pid}-${Math.random().toString(36).slice(2)}.tmp`;
  const offsets = new Float64Array(pq.rows + 1);
  try {
    const out = createWriteStream(temp);
    let at = 0;
    for (const [start, end] of rowGroupRanges(pq)) {
      const records = await readParquetRows(pq, start, end, [...columns]);
      for (const [i, record] of records.entries()) {
        const line = JSON.stringify(record) + '\n';
        if (!out.write(line)) await once(out, 'drain');
        at += Buffer.byteLength(line);
        offsets[start + i + 1] = at;
      }
    }
    out.end();
    await once(out, 'finish');
    await rename(temp, path);
    await writeFile(`${indexPath}.tmp`, Buffer.from(offsets.buffer));
    await rename(`${indexPath}.tmp`, indexPath);
  } finally {
    await rm(temp, { force: true });
  }
  return { path, offsets };
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
