// Prompt datasets in verl's row schema for tests and benchmarks: arithmetic word problems with
// `\boxed{}` answers and a worked answer in extra_info.answer (where verl's gsm8k keeps it),
// written as JSONL (streamed) and as Parquet the way pyarrow lays verl's files out (prompt a
// list of {content, role} structs, reward_model and extra_info structs), a batch of rows at a
// time so a million rows never sit in memory at once.
//   node dist/test/support/dataset-fixtures.js OUT_DIR [ROWS]
// writes OUT_DIR/{train,validation}.{parquet,jsonl} (ROWS train rows, default 64; a tenth as
// many validation rows).
import { createWriteStream } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { ParquetWriter } from 'hyparquet-writer';
import { fileWriter } from 'hyparquet-writer/src/node.js';

export interface VerlRow {
  data_source: string;
  prompt: { role: string; content: string }[];
  ability: string;
  reward_model: { style: string; ground_truth: string };
  extra_info: { split: string; index: number; answer: string };
}

/** Row `index` of a split: a + b with a, b from the index, so every row differs and is known. */
export function arithmeticRow(index: number, split = 'train'): VerlRow {
  const a = (index * 7919) % 1000;
  const b = (index * 104729 + 17) % 1000;
  return {
    data_source: index % 5 === 0 ? 'arith/hard' : 'arith',
    prompt: [
      { role: 'system', content: 'Put the final answer in \\boxed{}.' },
      {
        role: 'user',
        content: `A crate holds ${a} apples and another ${b}. How many apples are there in all?`,
      },
    ],
    ability: 'math',
    reward_model: { style: 'rule', ground_truth: String(a + b) },
    extra_info: { split, index, answer: `${a} + ${b} = ${a + b}. The answer is \\boxed{${a + b}}.` },
  };
}

export function* arithmeticRows(count: number, split = 'train'): Generator<VerlRow> {
  for (let i = 0; i < count; i++) yield arithmeticRow(i, split);
}

/** Writes records as JSONL, one a line, streamed. */
export async function writeJsonl(path: string, records: Iterable<unknown>): Promise<void> {
  const out = createWriteStream(path);
  for (const record of records) if (!out.write(JSON.stringify(record) + '\n')) await once(out, 'drain');
  out.end();
  await once(out, 'finish');
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

/** The example dataset: train and validation splits in both formats. */
export async function writeArithmeticDataset(
  dir: string,
  trainRows = 64,
  rowGroupSize = 1000,
): Promise<void> {
  await mkdir(dir, { recursive: true });
  const validationRows = Math.max(1, Math.floor(trainRows / 10));
  for (const [split, rows] of [
    ['train', trainRows],
    ['validation', validationRows],
  ] as const) {
    writeVerlParquet(join(dir, `${split}.parquet`), arithmeticRows(rows, split), rowGroupSize);
    await writeJsonl(join(dir, `${split}.jsonl`), arithmeticRows(rows, split));
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [dir, rows] = process.argv.slice(2);
  if (!dir) {
    console.error('usage: node dist/test/support/dataset-fixtures.js OUT_DIR [ROWS]');
    process.exit(2);
  }
  await writeArithmeticDataset(dir, rows ? Number(rows) : undefined);
  console.log(`wrote ${dir}/{train,validation}.{parquet,jsonl}`);
}
