// What a hostile dataset may cost a worker (activities/datasets/limits.ts): rows nested past the
// depth limit are problems, not stack overflows in the readers after them; a file or a Parquet
// row group with more rows, or a row group decoding to more bytes, than the limits allow is
// refused before its rows are decoded (or, for rows a dictionary repeats, once decoded); the
// limits are the workers' settings. The worker's caches are used only when they hold what was put
// there: a row cache or a dataset copy rewritten behind the worker's back is decoded or copied
// again, never read as the dataset.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { parquetWriteFile } from 'hyparquet-writer/src/node.js';
import {
  DatasetError,
  datasetLimitsFromEnv,
  defaultDatasetLimits,
  hashDataset,
  maxNestingDepth,
  readDatasetRows,
  validateDataset,
  verlColumns,
  type DatasetLimits,
  type ValidateOptions,
} from '../../activities/datasets/index.js';
import { FsStore } from '../../activities/store/index.js';
import type { ObjectInfo } from '../../activities/store/types.js';
import { arithmeticRow, writeArithmeticDataset, writeJsonl } from '../support/dataset-fixtures.js';

let dir: string;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'moerl-datasets-limits-'));
  await writeArithmeticDataset(dir, 50, 7);
});
after(() => rmSync(dir, { recursive: true, force: true }));

const options = (format: 'parquet' | 'jsonl', limits?: Partial<DatasetLimits>): ValidateOptions => ({
  format,
  columns: verlColumns,
  cacheDir: join(dir, 'cache'),
  ...(limits ? { limits: { ...defaultDatasetLimits, ...limits } } : {}),
});

async function problemsOf(path: string, opts: ValidateOptions): Promise<string[]> {
  try {
    await validateDataset({ path }, opts);
  } catch (err) {
    assert.ok(err instanceof DatasetError, String(err));
    return [...err.problems];
  }
  assert.fail('the dataset was accepted');
}

/** A value nested `levels` deep in arrays. */
function nested(levels: number): unknown {
  let v: unknown = 1;
  for (let i = 0; i < levels; i++) v = [v];
  return v;
}

describe('datasets: nesting', () => {
  it('a JSONL row nested past the limit is a problem of its row; one at the limit is a row', async () => {
    const path = join(dir, 'deep.jsonl');
    // The row object is level 1: extra_info at maxNestingDepth - 1 more levels is at the limit.
    await writeJsonl(path, [
      { ...arithmeticRow(0), extra_info: { deep: nested(maxNestingDepth - 2) } },
      { ...arithmeticRow(1), extra_info: { deep: nested(maxNestingDepth) } },
      arithmeticRow(2),
    ]);
    assert.deepEqual(await problemsOf(path, options('jsonl')), [
      `row 1 (line 2): nested more than ${maxNestingDepth} levels deep (arrays and objects), past the limit of ${maxNestingDepth} for a dataset row`,
    ]);
    // A million levels (a few MB of brackets) is one problem too, found without recursion.
    const bomb = join(dir, 'bomb.jsonl');
    writeFileSync(bomb, `${'['.repeat(1_000_000)}${']'.repeat(1_000_000)}\n`);
    const [problem] = await problemsOf(bomb, options('jsonl'));
    assert.match(problem as string, /^row 0 \(line 1\): (not JSON: .*|nested more than 100 levels deep)/);
  });
});

describe('datasets: row and size limits', () => {
  it('a JSONL file with more rows than the limit is refused at the first row past it', async () => {
    const problems = await problemsOf(join(dir, 'train.jsonl'), options('jsonl', { maxRows: 20 }));
    assert.equal(problems.length, 1);
    assert.match(
      problems[0] as string,
      /^more than 20 rows \(line 21 is past them\).*MOERL_DATASET_MAX_ROWS, the workers' setting/,
    );
  });

  it('a Parquet file is refused from its footer: rows in all, rows of a row group', async () => {
    const path = join(dir, 'train.parquet');
    const [rows] = await problemsOf(path, options('parquet', { maxRows: 20 }));
    assert.match(rows as string, /^the row groups hold more than 20 rows .*MOERL_DATASET_MAX_ROWS/);
    const [group] = await problemsOf(path, options('parquet', { maxRowGroupRows: 5 }));
    assert.match(group as string, /^row group 0 has 7 rows, .*MOERL_DATASET_MAX_ROW_GROUP_ROWS/);
    // At the limits, the same file is whole.
    const identity = await validateDataset({ path }, options('parquet', { maxRows: 50, maxRowGroupRows: 7 }));
    assert.equal(identity.rows, 50);
    // A shard's read is refused alike.
    await assert.rejects(
      readDatasetRows({ path }, [0], { ...options('parquet', { maxRowGroupRows: 5 }) }),
      (err: unknown) => err instanceof DatasetError && /row group 0 has 7 rows/.test(err.message),
    );
  });

  it('a small file of many rows (run-length encoded) is refused before it is decoded', async () => {
    // 200,000 rows of one value: a few kilobytes on disk, about 13 MB decoded.
    const path = join(dir, 'runs.parquet');
    const rows = 200_000;
    parquetWriteFile({
      filename: path,
      columnData: [
        { name: 'prompt', data: new Array<string>(rows).fill('What is 2+2?'), type: 'STRING' },
        { name: 'data_source', data: new Array<string>(rows).fill('a'), type: 'STRING' },
      ],
      rowGroupSize: rows,
    });
    assert.ok(readFileSync(path).length < 64 * 1024, `${readFileSync(path).length} bytes`);
    const [problem] = await problemsOf(path, options('parquet', { maxRowGroupBytes: 4 * 1024 * 1024 }));
    assert.match(
      problem as string,
      /^row group 0 decodes to by its footer \d+ bytes or more, .*MAX_ROW_GROUP_BYTES/,
    );
  });

  it('rows a dictionary repeats are counted as decoded, once decoded', async () => {
    // One 100 kB prompt in every row of 40: about 100 kB in the pages, 4 MB as rows.
    const path = join(dir, 'dictionary.parquet');
    const prompt = 'x'.repeat(100_000);
    parquetWriteFile({
      filename: path,
      columnData: [
        { name: 'prompt', data: new Array<string>(40).fill(prompt), type: 'STRING' },
        { name: 'data_source', data: new Array<string>(40).fill('a'), type: 'STRING' },
      ],
    });
    const [problem] = await problemsOf(path, options('parquet', { maxRowGroupBytes: 1024 * 1024 }));
    assert.match(
      problem as string,
      /^row group 0's rows are \d+ bytes or more as JSON, .*MAX_ROW_GROUP_BYTES/,
    );
  });

  it("the limits are the workers' settings, whole numbers, named when wrong", () => {
    assert.deepEqual(datasetLimitsFromEnv({}), defaultDatasetLimits);
    assert.deepEqual(
      datasetLimitsFromEnv({ MOERL_DATASET_MAX_ROWS: '12', MOERL_DATASET_MAX_ROW_GROUP_BYTES: ' 4096 ' }),
      { ...defaultDatasetLimits, maxRows: 12, maxRowGroupBytes: 4096 },
    );
    for (const bad of ['0', '-3', '1e6', 'lots', '99999999999999999999'])
      assert.throws(
        () => datasetLimitsFromEnv({ MOERL_DATASET_MAX_ROW_GROUP_ROWS: bad }),
        new RegExp(`^Error: MOERL_DATASET_MAX_ROW_GROUP_ROWS="${bad}" is not a positive whole number$`),
      );
  });
});

/** An fs store whose objects have entity tags, as S3's do: the worker keeps its copies of them. */
class EtagFsStore extends FsStore {
  override async head(key: string): Promise<ObjectInfo | null> {
    const info = await super.head(key);
    return info && { ...info, etag: '"fixed"' };
  }
}

describe("datasets: the worker's caches hold what was put there", () => {
  it('a row cache rewritten behind the worker (same size) is decoded again', async () => {
    const cacheDir = join(dir, 'row-cache');
    const path = join(dir, 'train.parquet');
    const read = () => readDatasetRows({ path }, [3, 40], { ...options('parquet'), cacheDir });
    const first = await read();
    const rows = readdirSync(cacheDir).find((f) => f.endsWith('.rows.jsonl'));
    assert.ok(rows, readdirSync(cacheDir).join(', '));
    const bytes = readFileSync(join(cacheDir, rows));
    await sleep(20); // past the file system's clock tick: the rewrite has a ctime of its own
    // Row 3 becomes another row of the same length.
    writeFileSync(join(cacheDir, rows), bytes.toString('utf8').replace('"3 + ', '"4 + '));
    assert.equal(readFileSync(join(cacheDir, rows)).length, bytes.length);
    assert.deepEqual(await read(), first);
    assert.deepEqual(readFileSync(join(cacheDir, rows)), bytes, 'decoded again, as it was');
  });

  it('a dataset copy rewritten in the cache is copied again from the store', async () => {
    const storeDir = join(dir, 'store');
    const store = new EtagFsStore(storeDir);
    await store.putFile('data/train.parquet', join(dir, 'train.parquet'));
    const { sha256 } = await hashDataset({ path: join(dir, 'train.parquet') });
    const cacheDir = join(dir, 'copy-cache');
    const read = () =>
      readDatasetRows({ store, key: 'data/train.parquet' }, [5], {
        ...options('parquet'),
        cacheDir,
        expectedSha256: sha256,
      });
    const first = await read();
    const copy = join(cacheDir, `${sha256}.dataset`);
    const original = readFileSync(copy);
    const changed = Buffer.from(original);
    changed[Math.floor(changed.length / 2)]! ^= 0xff;
    await sleep(20);
    writeFileSync(copy, changed);
    assert.deepEqual(await read(), first);
    assert.deepEqual(readFileSync(copy), original, 'copied again from the store');
  });
});
