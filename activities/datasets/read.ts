// A rollout shard's own rows, by index: the workflow holds only the dataset's position and hash,
// each shard draws its row indices (sampling.ts: shardPrompts) and reads them here. Parquet is
// decoded once per worker into a row cache read by offset (row-cache.ts); JSONL is scanned
// once, stopping at the last row wanted unless the hash must be checked (docs/benchmarks.md
// has the scan's cost, and why no line-offset index). Bytes that are not the campaign's
// (another sha256) are refused, and so is a file past the dataset limits (limits.ts).
import type { DatasetFormat } from '../../workflows/spec-dataset.js';
import { DatasetChangedError, DatasetError, DatasetProblem } from './errors.js';
import { defaultMaxLineBytes, jsonlLines, parseJsonlLine } from './jsonl.js';
import { datasetLimitsFromEnv, type DatasetLimits } from './limits.js';
import { openParquet } from './parquet.js';
import { parquetRowCache, readCachedRecords } from './row-cache.js';
import { toDatasetRow, topLevelColumns, type DatasetColumns, type DatasetRow } from './rows.js';
import { byteStream, describeInput, hashingStream, localCopy, type DatasetInput } from './source.js';

export interface ReadRowsOptions {
  format: DatasetFormat;
  columns: DatasetColumns;
  /** Where a store object is copied for reading Parquet (see localCopy). */
  cacheDir: string;
  /**
   * The content hash the campaign started with. Parquet: checked when the file is copied (or,
   * for a local path, read). JSONL: the whole file is read to check it, not only up to the
   * last row wanted.
   */
  expectedSha256?: string;
  maxLineBytes?: number;
  /** Read each row's reference completion too (task.dataset.responseKey), required. */
  responseKey?: string;
  /** What the file may cost (default: this worker's, datasetLimitsFromEnv). */
  limits?: DatasetLimits;
}

/** The rows at `indices` (any order, repeats allowed), in that order. */
export async function readDatasetRows(
  input: DatasetInput,
  indices: readonly number[],
  opts: ReadRowsOptions,
): Promise<DatasetRow[]> {
  for (const i of indices)
    if (!Number.isSafeInteger(i) || i < 0)
      throw new RangeError(`a row index is a non-negative integer, got ${i}`);
  const wanted = [...new Set(indices)].sort((a, b) => a - b);
  const found = new Map<number, DatasetRow>();
  const source = describeInput(input);
  const problems: string[] = [];
  const keep = (row: number, record: unknown, where: string) => {
    const got = toDatasetRow(record, row, opts.columns, opts.responseKey);
    if (got.problems) problems.push(...got.problems.map((p) => `${where}: ${p}`));
    else found.set(row, got.row);
  };
  if (opts.format === 'jsonl') await scanJsonl(input, wanted, opts, keep, problems);
  else {
    const local = await localCopy(input, opts.cacheDir, opts.expectedSha256);
    let records;
    try {
      const pq = await openParquet(local.path, opts.limits ?? datasetLimitsFromEnv());
      const columns = [
        ...topLevelColumns(opts.columns),
        ...(opts.responseKey ? [opts.responseKey.split('.')[0] as string] : []),
      ].filter((c, i, all) => pq.columns.includes(c) && all.indexOf(c) === i);
      const cache = await parquetRowCache(pq, local.sha256, columns, opts.cacheDir);
      records = await readCachedRecords(
        cache,
        wanted.filter((i) => i < pq.rows),
      );
    } catch (err) {
      if (err instanceof DatasetProblem) throw new DatasetError(source, [err.message]);
      throw err;
    }
    for (const [row, record] of records) keep(row, record, `row ${row}`);
  }
  if (problems.length > 0) throw new DatasetError(source, problems);
  const missing = wanted.filter((i) => !found.has(i));
  if (missing.length > 0)
    throw new DatasetError(source, [
      `rows ${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ` and ${missing.length - 5} more` : ''} are past the end of the file`,
    ]);
  return indices.map((i) => found.get(i) as DatasetRow);
}

async function scanJsonl(
  input: DatasetInput,
  wanted: readonly number[],
  opts: ReadRowsOptions,
  keep: (row: number, record: unknown, where: string) => void,
  problems: string[],
): Promise<void> {
  const maxLineBytes = opts.maxLineBytes ?? defaultMaxLineBytes;
  const hasher = hashingStream();
  const stream = byteStream(input);
  const bytes = stream.pipe(hasher);
  const last = wanted[wanted.length - 1] ?? -1;
  let next = 0;
  for await (const line of jsonlLines(bytes, maxLineBytes)) {
    if (line.row === wanted[next]) {
      next++;
      const parsed = parseJsonlLine(line, maxLineBytes);
      const where = `row ${line.row} (line ${line.row + 1})`;
      if ('problem' in parsed) problems.push(`${where}: ${parsed.problem}`);
      else keep(line.row, parsed.record, where);
    }
    if (line.row >= last && opts.expectedSha256 === undefined) break;
  }
  stream.destroy();
  if (opts.expectedSha256 !== undefined) {
    const { sha256 } = hasher.digest();
    if (sha256 !== opts.expectedSha256)
      throw new DatasetChangedError(describeInput(input), opts.expectedSha256, sha256);
  }
}
