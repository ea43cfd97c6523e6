// Dataset validation on local files: verl-schema Parquet and JSONL validate with their identity
// (sha256 of the bytes, size, rows); every malformed case is named with its row and field —
// a missing prompt, wrong types, an empty file, a data_source without a reward function, a
// prompt over the context length, a reference completion missing where an SFT warm start needs
// one — all at once, capped with "and N more"; mapped column names.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parquetWriteFile } from 'hyparquet-writer/src/node.js';
import {
  DatasetError,
  validateDataset,
  verlColumns,
  type ValidateOptions,
} from '../../activities/datasets/index.js';
import {
  arithmeticRow,
  writeArithmeticDataset,
  writeJsonl,
  writeVerlParquet,
} from '../support/dataset-fixtures.js';

let dir: string;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'moerl-datasets-'));
  await writeArithmeticDataset(dir, 50, 7);
});
after(() => rmSync(dir, { recursive: true, force: true }));

const options = (format: 'parquet' | 'jsonl', more: Partial<ValidateOptions> = {}): ValidateOptions => ({
  format,
  columns: verlColumns,
  cacheDir: join(dir, 'cache'),
  ...more,
});

async function problemsOf(path: string, opts: ValidateOptions): Promise<string[]> {
  try {
    await validateDataset({ path }, opts);
  } catch (err) {
    assert.ok(err instanceof DatasetError, String(err));
    assert.equal(err.nonRetryable, true);
    assert.ok(err.message.startsWith(`dataset ${path} is invalid:`), err.message);
    return [...err.problems];
  }
  assert.fail('the dataset was accepted');
}

function jsonlFile(name: string, lines: string[]): string {
  const path = join(dir, name);
  writeFileSync(path, lines.map((l) => l + '\n').join(''));
  return path;
}

const good = (i: number) => JSON.stringify(arithmeticRow(i));

describe('datasets: valid files', () => {
  for (const format of ['parquet', 'jsonl'] as const)
    it(`a verl-schema ${format} file validates with its identity`, async () => {
      const path = join(dir, `train.${format}`);
      const bytes = readFileSync(path);
      const identity = await validateDataset({ path }, options(format));
      assert.deepEqual(identity, {
        sha256: createHash('sha256').update(bytes).digest('hex'),
        bytes: bytes.length,
        rows: 50,
      });
    });

  it('a final line without a newline and CRLF line ends are rows like the others', async () => {
    const path = join(dir, 'crlf.jsonl');
    writeFileSync(path, `${good(0)}\r\n${good(1)}\r\n${good(2)}`);
    assert.equal((await validateDataset({ path }, options('jsonl'))).rows, 3);
  });

  it('mapped column names: a string prompt, a dotted data source, another answer column', async () => {
    const path = jsonlFile('mapped.jsonl', [
      JSON.stringify({ question: 'What is 2+2?', answer: '4', meta: { source: 'gsm8k' } }),
      JSON.stringify({ question: 'What is 3+3?', answer: '6', meta: { source: 'gsm8k' } }),
    ]);
    const columns = {
      ...verlColumns,
      promptKey: 'question',
      groundTruthKey: 'answer',
      dataSourceKey: 'meta.source',
    };
    assert.equal((await validateDataset({ path }, options('jsonl', { columns }))).rows, 2);
    const wrong = await problemsOf(path, options('jsonl'));
    assert.deepEqual(wrong, [
      'row 0 (line 1): prompt: missing',
      'row 0 (line 1): data_source: missing',
      'row 1 (line 2): prompt: missing',
      'row 1 (line 2): data_source: missing',
    ]);
  });
});

describe('datasets: malformed rows, all named at once', () => {
  it('missing prompt, wrong types, bad messages, not JSON, an empty line', async () => {
    const noPrompt = arithmeticRow(1) as Partial<ReturnType<typeof arithmeticRow>>;
    delete noPrompt.prompt;
    const path = jsonlFile('bad.jsonl', [
      good(0),
      JSON.stringify(noPrompt),
      JSON.stringify({ ...arithmeticRow(2), prompt: 5 }),
      JSON.stringify({ ...arithmeticRow(3), data_source: 7, ability: ['x'] }),
      JSON.stringify({ ...arithmeticRow(4), prompt: [{ role: 'user', content: 12 }] }),
      JSON.stringify({ ...arithmeticRow(5), prompt: [] }),
      '{"prompt": "unterminated',
      '',
      '[1, 2]',
      JSON.stringify({ ...arithmeticRow(9), extra_info: 'x' }),
    ]);
    const problems = await problemsOf(path, options('jsonl'));
    assert.equal(problems.length, 10, problems.join('\n'));
    assert.equal(problems[0], 'row 1 (line 2): prompt: missing');
    assert.match(problems[1] as string, /^row 2 \(line 3\): prompt: number 5, expected chat messages/);
    assert.match(
      problems[2] as string,
      /^row 3 \(line 4\): data_source: number 7, expected a non-empty string$/,
    );
    assert.match(problems[3] as string, /^row 3 \(line 4\): ability: an array of 1, expected a string$/);
    assert.match(
      problems[4] as string,
      /^row 4 \(line 5\): prompt: message 0: content is number 12, expected a string$/,
    );
    assert.match(problems[5] as string, /^row 5 \(line 6\): prompt: an empty array/);
    assert.match(problems[6] as string, /^row 6 \(line 7\): not JSON: /);
    assert.match(problems[7] as string, /^row 7 \(line 8\): an empty line/);
    assert.match(problems[8] as string, /^row 8 \(line 9\): an array of 2, expected an object$/);
    assert.match(problems[9] as string, /^row 9 \(line 10\): extra_info: string "x", expected an object$/);
  });

  it('a mapped column is named with its spec key', async () => {
    const path = jsonlFile('mapped-bad.jsonl', [JSON.stringify({ q: 3, data_source: 'a' })]);
    const problems = await problemsOf(
      path,
      options('jsonl', { columns: { ...verlColumns, promptKey: 'q' } }),
    );
    assert.match(problems[0] as string, /^row 0 \(line 1\): q \(task\.dataset\.promptKey\): number 3/);
  });

  it('problems are capped, the rest counted', async () => {
    const path = jsonlFile(
      'many-bad.jsonl',
      Array.from({ length: 100 }, () => '{}'),
    );
    const problems = await problemsOf(path, options('jsonl', { maxProblems: 20 }));
    assert.equal(problems.length, 21);
    assert.equal(problems[20], 'and 180 more problems');
  });

  it('an empty file has no rows, in either format', async () => {
    for (const format of ['jsonl', 'parquet'] as const) {
      const path = join(dir, `empty.${format}`);
      writeFileSync(path, '');
      assert.deepEqual(await problemsOf(path, options(format)), ['the file has no rows']);
    }
    const path = join(dir, 'no-rows.parquet');
    writeVerlParquet(path, []);
    assert.deepEqual(await problemsOf(path, options('parquet')), ['the file has no rows']);
  });

  it('a data_source without a reward function, once per source with its rows', async () => {
    const path = join(dir, 'train.jsonl');
    const rewards = { mapped: ['arith'], hasDefault: false, field: 'rewards.bySource' };
    const problems = await problemsOf(path, options('jsonl', { rewards }));
    assert.deepEqual(problems, [
      'data_source "arith/hard" (row 0 (line 1), row 5 (line 6), row 10 (line 11) and 7 more) has no reward function: rewards.bySource names "arith" and has no default',
    ]);
    await validateDataset({ path }, options('jsonl', { rewards: { ...rewards, hasDefault: true } }));
    await validateDataset(
      { path },
      options('jsonl', { rewards: { ...rewards, mapped: ['arith', 'arith/hard'] } }),
    );
  });

  it('a prompt over the context length, counted by the given tokenizer', async () => {
    const rows = [
      arithmeticRow(0),
      { ...arithmeticRow(1), prompt: [{ role: 'user', content: 'x'.repeat(400) }] },
    ];
    const path = join(dir, 'long.parquet');
    writeVerlParquet(path, rows);
    const seen: number[] = [];
    const promptLimit = {
      countTokens: async (prompt: { content: string }[]) => {
        seen.push(prompt.length);
        return prompt.reduce((n, m) => n + Math.ceil(m.content.length / 4), 0);
      },
      maxTokens: 64,
      why: 'model.contextLength 80 − maxNewTokens 16',
    };
    const problems = await problemsOf(path, options('parquet', { promptLimit }));
    assert.deepEqual(problems, [
      'row 1: prompt: 100 tokens, over the 64 the model has room for (model.contextLength 80 − maxNewTokens 16)',
    ]);
    assert.deepEqual(seen, [2, 1], 'the callback sees the chat messages');
  });

  it('parquet: null fields, a missing column, bytes that are not Parquet', async () => {
    const nulls = join(dir, 'nulls.parquet');
    writeVerlParquet(nulls, [
      arithmeticRow(0),
      { ...arithmeticRow(1), prompt: null } as never,
      { ...arithmeticRow(2), data_source: null } as never,
    ]);
    assert.deepEqual(await problemsOf(nulls, options('parquet')), [
      'row 1: prompt: missing',
      'row 2: data_source: missing',
    ]);

    const other = join(dir, 'other.parquet');
    parquetWriteFile({
      filename: other,
      columnData: [
        { name: 'question', data: ['What is 2+2?', 'What is 3+3?'], type: 'STRING' },
        { name: 'data_source', data: ['a', 'a'], type: 'STRING' },
      ],
    });
    const [missing] = await problemsOf(other, options('parquet'));
    assert.match(missing as string, /^no column "prompt" \(the file's columns: question, data_source\)/);
    const identity = await validateDataset(
      { path: other },
      options('parquet', { columns: { ...verlColumns, promptKey: 'question' } }),
    );
    assert.equal(identity.rows, 2);

    const notParquet = join(dir, 'text.parquet');
    writeFileSync(notParquet, 'hello, not parquet\n');
    const [bad] = await problemsOf(notParquet, options('parquet'));
    assert.match(bad as string, /^not a Parquet file: /);
  });

  it('a line past maxLineBytes is a problem, not a memory spike', async () => {
    const path = join(dir, 'long-line.jsonl');
    await writeJsonl(path, [
      arithmeticRow(0),
      { ...arithmeticRow(1), pad: 'y'.repeat(5000) },
      arithmeticRow(2),
    ]);
    assert.deepEqual(await problemsOf(path, options('jsonl', { maxLineBytes: 4096 })), [
      'row 1 (line 2): longer than 4096 bytes',
    ]);
  });
  it("an SFT warm start needs every row's reference completion at responseKey", async () => {
    const rows = [
      arithmeticRow(0),
      { ...arithmeticRow(1), extra_info: { split: 'train', index: 1 } },
      { ...arithmeticRow(2), extra_info: { split: 'train', index: 2, answer: 7 } },
    ];
    const jsonl = join(dir, 'answers.jsonl');
    await writeJsonl(jsonl, rows);
    const parquet = join(dir, 'answers.parquet');
    writeVerlParquet(parquet, rows.slice(0, 2) as never);
    const sft = { responseKey: 'extra_info.answer' };
    assert.deepEqual(await problemsOf(jsonl, options('jsonl', sft)), [
      'row 1 (line 2): extra_info.answer (task.dataset.responseKey): missing, expected the reference completion: a non-empty string, or the turns after the prompt',
      'row 2 (line 3): extra_info.answer (task.dataset.responseKey): number 7, expected the reference completion: a non-empty string, or the turns after the prompt',
    ]);
    assert.deepEqual(await problemsOf(parquet, options('parquet', sft)), [
      'row 1: extra_info.answer (task.dataset.responseKey): missing, expected the reference completion: a non-empty string, or the turns after the prompt',
    ]);
    // Without a warm start nothing asks for it.
    assert.equal((await validateDataset({ path: jsonl }, options('jsonl'))).rows, 3);
    // A multi-turn demonstration: the assistant's turns and the tool turns between them.
    const turns = (demo: unknown) => ({ ...arithmeticRow(0), demo });
    const demos = join(dir, 'demos.jsonl');
    await writeJsonl(demos, [
      turns([
        { role: 'assistant', content: '<tool_call>{}</tool_call>', tool_calls: [] },
        { role: 'tool', content: '5' },
        { role: 'assistant', content: '5' },
      ]),
      turns([]),
      turns([{ role: 'user', content: 'hi' }]),
      turns([
        { role: 'tool', content: '5' },
        { role: 'assistant', content: '5' },
      ]),
      turns([
        { role: 'assistant', content: 'a' },
        { role: 'tool', content: '5' },
      ]),
      turns([{ role: 'assistant', content: 5 }]),
    ]);
    assert.deepEqual(await problemsOf(demos, options('jsonl', { responseKey: 'demo' })), [
      'row 1 (line 2): demo (task.dataset.responseKey): an empty array, expected the turns after the prompt',
      'row 2 (line 3): demo (task.dataset.responseKey): message 0: role is string "user", expected assistant or tool (the turns after the prompt)',
      'row 3 (line 4): demo (task.dataset.responseKey): message 0 is a tool message, expected the assistant turn first',
      "row 4 (line 5): demo (task.dataset.responseKey): message 1 is a tool message, expected the demonstration to end with the assistant's turn",
      'row 5 (line 6): demo (task.dataset.responseKey): message 0: content is number 5, expected a string',
    ]);
    const [noColumn] = await problemsOf(
      join(dir, 'train.parquet'),
      options('parquet', { responseKey: 'solution' }),
    );
    assert.match(
      noColumn as string,
      /^no column "solution" .*map the names with task\.dataset\.responseKey$/,
    );
  });
});
