// Parquet datasets through hyparquet, one row group at a time: the footer says where each
// group's rows start, so a pass over the file holds one group's decoded rows, and a read of
// the spec's columns decodes only those.
import {
  asyncBufferFromFile,
  parquetMetadataAsync,
  parquetReadObjects,
  parquetSchema,
  type AsyncBuffer,
  type FileMetaData,
} from 'hyparquet';
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
}

/** Opens a local Parquet file: reads its footer only. Throws when it is not Parquet. */
export async function openParquet(path: string): Promise<ParquetFile> {
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  const groupStarts = [0];
  for (const group of metadata.row_groups)
    groupStarts.push((groupStarts[groupStarts.length - 1] as number) + Number(group.num_rows));
  const columns = parquetSchema(metadata).children.map((c) => c.element.name);
  return { file, metadata, rows: groupStarts[groupStarts.length - 1] as number, groupStarts, columns };
}

/** Decoded rows [rowStart, rowEnd) of the file's given columns, JSON-safe. */
export async function readParquetRows(
  pq: ParquetFile,
  rowStart: number,
  rowEnd: number,
  columns: string[],
): Promise<Record<string, unknown>[]> {
  const rows = await parquetReadObjects({ file: pq.file, metadata: pq.metadata, rowStart, rowEnd, columns });
  return rows.map((r) => jsonSafe(r) as Record<string, unknown>);
}

/** The row groups in order, as [rowStart, rowEnd) ranges. */
export function rowGroupRanges(pq: ParquetFile): [number, number][] {
  return pq.groupStarts.slice(0, -1).map((start, g) => [start, pq.groupStarts[g + 1] as number]);
}
