// The example's dataset: single-digit sums as chat prompts in verl's Parquet schema, the rows
// verl's data_preprocess scripts write (data_source, prompt as chat messages, ability,
// reward_model {style, ground_truth}, extra_info {split, index, answer}), with the worked answer
// in extra_info.answer for the SFT warm start. Deterministic: the same bytes on every run.
// Validation holds out every fifth (a, b) pair, so it scores sums the policy never trained on.
//   node dist/examples/hf-arith/make-dataset.js OUT_DIR
// writes OUT_DIR/train.parquet (240 rows) and OUT_DIR/validation.parquet (60 rows).
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ParquetWriter } from 'hyparquet-writer';
import { fileWriter } from 'hyparquet-writer/src/node.js';

const questions = [
  (a: number, b: number) => `What is ${a} + ${b}?`,
  (a: number, b: number) => `Add ${a} and ${b}.`,
  (a: number, b: number) => `How much is ${a} plus ${b}?`,
];

interface Row {
  data_source: string;
  prompt: { role: string; content: string }[];
  ability: string;
  reward_model: { style: string; ground_truth: string };
  extra_info: { split: string; index: bigint; answer: string };
}

export function arithmeticRows(split: 'train' | 'validation'): Row[] {
  const rows: Row[] = [];
  for (let a = 0; a < 10; a++)
    for (let b = 0; b < 10; b++) {
      if (((a * 10 + b) % 5 === 0) !== (split === 'validation')) continue;
      for (const question of questions)
        rows.push({
          data_source: 'arith/single-digit',
          prompt: [
            { role: 'system', content: 'Answer with the sum in \\boxed{}.' },
            { role: 'user', content: question(a, b) },
          ],
          ability: 'math',
          reward_model: { style: 'rule', ground_truth: String(a + b) },
          extra_info: { split, index: BigInt(rows.length), answer: `${a} + ${b} = \\boxed{${a + b}}` },
        });
    }
  return rows;
}

const text = (name: string) => ({
  name,
  type: 'BYTE_ARRAY' as const,
  converted_type: 'UTF8' as const,
  repetition_type: 'OPTIONAL' as const,
});

// The layout pyarrow gives these rows: a list of {content, role} structs, structs for the rest.
const schema = [
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

function writeParquet(path: string, rows: Row[]): void {
  const writer = new ParquetWriter({ writer: fileWriter(path), schema });
  const columns = ['data_source', 'prompt', 'ability', 'reward_model', 'extra_info'] as const;
  writer.write({ columnData: columns.map((name) => ({ name, data: rows.map((r) => r[name]) })) });
  writer.finish();
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [dir] = process.argv.slice(2);
  if (!dir) {
    console.error('usage: node dist/examples/hf-arith/make-dataset.js OUT_DIR');
    process.exit(2);
  }
  mkdirSync(dir, { recursive: true });
  for (const split of ['train', 'validation'] as const) {
    const rows = arithmeticRows(split);
    writeParquet(join(dir, `${split}.parquet`), rows);
    console.log(`wrote ${join(dir, `${split}.parquet`)} (${rows.length} rows)`);
  }
}
