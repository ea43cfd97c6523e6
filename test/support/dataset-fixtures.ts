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
import { writeVerlParquet, type VerlRow } from '../../examples/verl-parquet.js';

export { writeVerlParquet, type VerlRow };

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
