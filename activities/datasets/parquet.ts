// Parquet datasets through hyparquet, one row group at a time: the footer says where each
// group's rows start, so a pass over the file holds one group's decoded rows, and a read of
// the spec's columns decodes only those. Nothing is decoded past the dataset limits
// (limits.ts): the footer's row counts and schema depth are checked when the file is opened, a
// row group's size from its pages' headers before it is decoded (the footer's sizes are the
// writer's word; the pages' headers are what hyparquet allocates by), and its rows' nesting and
// JSON size after.
import {
  asyncBufferFromFile,
  parquetMetadataAsync,
  parquetReadObjects,
  parquetSchema,
  type AsyncBuffer,
  type FileMetaData,
} from 'hyparquet';
import { parquetHeader } from 'hyparquet/src/column.js';
import { DatasetProblem } from './errors.js';
import {
  bytesPerDecodedValue,
  maxNestingDepth,
  measureValue,
  nestingProblem,
  overLimit,
  type DatasetLimits,
} from './limits.js';
import { jsonSafe } from './rows.js';

export interface ParquetFile {
  file: AsyncBuffer;
  metadata: FileMetaData;
  /** Rows in the file. */
  rows: number;
  /** First row of each row group, and one past the last row at the end. */
  groupStarts: number[];
  /** The top-level column names. */
  columns: string[];
  limits: DatasetLimits;
}

/**
 * Opens a local Parquet file: reads its footer only. Throws DatasetProblem for a file past the
 * limits (rows, rows of a row group, schema depth), another error when it is not Parquet.
 */
export async function openParquet(path: string, limits: DatasetLimits): Promise<ParquetFile> {
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  const depth = schemaDepth(metadata);
  if (depth > maxNestingDepth)
    throw new DatasetProblem(
      `the schema nests more than ${maxNestingDepth} levels deep, past the limit of ${maxNestingDepth} for a dataset row`,
    );
  const groupStarts = [0];
  for (const [g, group] of metadata.row_groups.entries()) {
    const rows = Number(group.num_rows);
    if (!Number.isSafeInteger(rows) || rows < 0)
      throw new DatasetProblem(`row group ${g} says it has ${group.num_rows} rows`);
    if (rows > limits.maxRowGroupRows)
      throw new DatasetProblem(
        `row group ${g} has ${rows} rows, more than a row group may have: ${overLimit(limits, 'maxRowGroupRows')}; or write smaller row groups (pyarrow's row_group_size=)`,
      );
    const start = groupStarts[groupStarts.length - 1] as number;
    if (start + rows > limits.maxRows)
      throw new DatasetProblem(
        `the row groups hold more than ${limits.maxRows} rows (${metadata.row_groups.length} groups, the footer says ${metadata.num_rows} rows in all), more than a dataset may have: ${overLimit(limits, 'maxRows')}; or split the file`,
      );
    groupStarts.push(start + rows);
  }
  const rows = groupStarts[groupStarts.length - 1] as number;
  if (BigInt(rows) !== metadata.num_rows)
    throw new DatasetProblem(`the footer says ${metadata.num_rows} rows, but its row groups hold ${rows}`);
  const columns = parquetSchema(metadata).children.map((c) => c.element.name);
  return { file, metadata, rows, groupStarts, columns, limits };
}

/** Levels of the schema below its root, from the flat list (no recursion: the list is the writer's). */
function schemaDepth(metadata: FileMetaData): number {
  // The children still to come at each open level.
  const open: number[] = [];
  let deepest = 0;
  for (const element of metadata.schema) {
    while (open.length > 0 && open[open.length - 1] === 0) open.pop();
    if (open.length > 0) open[open.length - 1] = (open[open.length - 1] as number) - 1;
    const children = element.num_children ?? 0;
    if (children > 0) {
      open.push(children);
      deepest = Math.max(deepest, open.length);
    }
  }
  return deepest;
}

/**
 * The decoded size of row group `g`'s given columns, from its pages' headers: the bytes each
 * page decompresses to, and bytesPerDecodedValue for each value it holds. Throws DatasetProblem
 * past maxRowGroupBytes, or for a page header that cannot be read.
 */
async function checkGroupSize(pq: ParquetFile, g: number, columns: string[]): Promise<void> {
  const group = pq.metadata.row_groups[g];
  if (!group) throw new RangeError(`no row group ${g}`);
  const limit = pq.limits.maxRowGroupBytes;
  const past = (bytes: number, counted: string) =>
    new DatasetProblem(
      `row group ${g} decodes to ${counted} ${bytes} bytes or more, more than a row group may: ${overLimit(pq.limits, 'maxRowGroupBytes')}; or write smaller row groups (pyarrow's row_group_size=)`,
    );
  const chunks = group.columns.flatMap((c) =>
    c.meta_data && columns.includes(c.meta_data.path_in_schema[0] as string) ? [c.meta_data] : [],
  );
  // The footer first: a file that says it is too large is not read further.
  let declared = 0;
  for (const meta of chunks)
    declared += Number(meta.total_uncompressed_size) + bytesPerDecodedValue * Number(meta.num_values);
  if (declared > limit) throw past(declared, 'by its footer');
  let bytes = 0;
  for (const meta of chunks) {
    const start = Number(meta.dictionary_page_offset || meta.data_page_offset);
    const end = Math.min(start + Number(meta.total_compressed_size), pq.file.byteLength);
    const chunk = new Uint8Array(await pq.file.slice(start, end));
    const reader = { view: new DataView(chunk.buffer, chunk.byteOffset, chunk.byteLength), offset: 0 };
    while (reader.offset < chunk.byteLength - 1) {
      const at = reader.offset;
      let header;
      try {
        header = parquetHeader(reader);
      } catch (err) {
        throw new DatasetProblem(
          `row group ${g}, column ${meta.path_in_schema.join('.')}: a page header at byte ${start + at} cannot be read: ${(err as Error).message}`,
        );
      }
      const values =
        header.data_page_header?.num_values ??
        header.data_page_header_v2?.num_values ??
        header.dictionary_page_header?.num_values ??
        0;
      const sizes = [header.compressed_page_size, header.uncompressed_page_size, values];
      if (sizes.some((n) => !Number.isSafeInteger(n) || n < 0))
        throw new DatasetProblem(
          `row group ${g}, column ${meta.path_in_schema.join('.')}: the page header at byte ${start + at} has a negative or impossible size`,
        );
      bytes += header.uncompressed_page_size + bytesPerDecodedValue * values;
      if (bytes > limit) throw past(bytes, 'by its pages');
      reader.offset += header.compressed_page_size;
    }
  }
}

/**
 * Rows [rowStart, rowEnd) of row group `g` in the file's given columns, decoded: each a
 * JSON-safe record, or the problem of a row nested too deep. Throws DatasetProblem for a group
 * whose size is past the limits (before decoding it, when its pages say so).
 */
export async function readParquetGroup(
  pq: ParquetFile,
  g: number,
  columns: string[],
): Promise<({ record: Record<string, unknown> } | { problem: string })[]> {
  await checkGroupSize(pq, g, columns);
  const rowStart = pq.groupStarts[g] as number;
  const rowEnd = pq.groupStarts[g + 1] as number;
  const rows = await parquetReadObjects({ file: pq.file, metadata: pq.metadata, rowStart, rowEnd, columns });
  let bytes = 0;
  const out = rows.map((r) => {
    const measured = measureValue(r);
    bytes += measured.bytes;
    const deep = nestingProblem(measured.depth);
    return deep === undefined ? { record: jsonSafe(r) as Record<string, unknown> } : { problem: deep };
  });
  // A dictionary page can repeat one long value in every row: the rows' own size counts too.
  if (bytes > pq.limits.maxRowGroupBytes)
    throw new DatasetProblem(
      `row group ${g}'s rows are ${bytes} bytes or more as JSON, more than a row group may: ${overLimit(pq.limits, 'maxRowGroupBytes')}; or write smaller row groups (pyarrow's row_group_size=)`,
    );
  return out;
}

/** The number of row groups. */
export function rowGroupCount(pq: ParquetFile): number {
  return pq.groupStarts.length - 1;
}
