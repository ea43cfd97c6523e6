// Writes prompt datasets in verl's row schema as Parquet, laid out the way pyarrow writes verl's
// own files (prompt a list of {content, role} structs; reward_model and extra_info structs), a
// row group at a time, so a file of millions of rows never sits in memory at once. Used by the
// examples' dataset scripts and by the tests' fixtures.
import { ParquetWriter } from 'hyparquet-writer';
import { fileWriter } from 'hyparquet-writer/src/node.js';

/** One row of verl's schema, with the worked answer in extra_info.answer (the SFT response). */
export interface VerlRow {
  data_source: string;
  prompt: { role: string; content: string }[];
  ability: string;
  reward_model: { style: string; ground_truth: string };
  extra_info: { split: string; index: number; answer: string };
}

const text = (name: string) => ({
  name,
  type: 'BYTE_ARRAY' as const,
  converted_type: 'UTF8' as const,
  repetition_type: 'OPTIONAL' as const,
});

// The layout pyarrow gives verl's rows (list<struct<content, role>>, structs for the rest).
const verlSchema = [
  { name: 'root', num_children: 5 },
  text('data_source'),
  { name: 'prompt', repetition_type: 'OPTIONAL' as const, converted_type: 'LIST' as const, num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED' as const, num_children: 1 },
  { name: 'element', repetition_type: 'OPTIONAL' as const, num_children: 2 },
  text('content'),
  text('role'),
  text('ability'),
  { name: 'reward_model', repetition_type: 'OPTIONAL' as const, num_children: 2 },
  text('ground_truth'),
  text('style'),
  { name: 'extra_info', repetition_type: 'OPTIONAL' as const, num_children: 3 },
  text('answer'),
  { name: 'index', type: 'INT64' as const, repetition_type: 'OPTIONAL' as const },
  text('split'),
];

const verlColumnNames = ['data_source', 'prompt', 'ability', 'reward_model', 'extra_info'] as const;

/**
 * Writes verl rows as Parquet, `rowGroupSize` rows a group, encoding one group at a time.
 * A row's field may be null (a missing value).
 */
export function writeVerlParquet(path: string, rows: Iterable<Partial<VerlRow>>, rowGroupSize = 1000): void {
  const writer = new ParquetWriter({ writer: fileWriter(path), schema: verlSchema });
  let batch: Partial<VerlRow>[] = [];
  const flush = () => {
    if (batch.length === 0) return;
    writer.write({
      columnData: verlColumnNames.map((name) => ({
        name,
        data: batch.map((r) => {
          const v = r[name] ?? null;
          return name === 'extra_info' && v !== null
            ? { ...(v as VerlRow['extra_info']), index: BigInt((v as VerlRow['extra_info']).index) }
            : v;
        }),
      })),
      rowGroupSize,
    });
    batch = [];
  };
  for (const row of rows) {
    batch.push(row);
    if (batch.length === rowGroupSize) flush();
  }
  flush();
  writer.finish();
}
