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
import { writeVerlParquet, type VerlRow } from '../verl-parquet.js';

const questions = [
  (a: number, b: number) => `What is ${a} + ${b}?`,
  (a: number, b: number) => `Add ${a} and ${b}.`,
  (a: number, b: number) => `How much is ${a} plus ${b}?`,
];

export function arithmeticRows(split: 'train' | 'validation'): VerlRow[] {
  const rows: VerlRow[] = [];
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
          extra_info: { split, index: rows.length, answer: `${a} + ${b} = \\boxed{${a + b}}` },
        });
    }
  return rows;
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
    writeVerlParquet(join(dir, `${split}.parquet`), rows);
    console.log(`wrote ${join(dir, `${split}.parquet`)} (${rows.length} rows)`);
  }
}
