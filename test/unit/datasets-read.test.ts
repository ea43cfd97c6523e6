// Shards reading their own rows by index: Parquet (through the worker's row cache) across row
// groups and JSONL by a scan give the same rows, in the order asked, from a local file and from
// an fs store (Parquet copied once into the worker's cache, named by its hash); a file whose
// bytes changed under the campaign is refused; indices past the end are named.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  DatasetChangedError,
  DatasetError,
  drawPrompts,
  hashDataset,
  readDatasetRows,
  startPosition,
  verlColumns,
  type ReadRowsOptions,
} from '../../activities/datasets/index.js';
import { FsStore } from '../../activities/store/index.js';
import { arithmeticRow, writeArithmeticDataset } from '../support/dataset-fixtures.js';

let dir: string;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'moerl-datasets-read-'));
  await writeArithmeticDataset(join(dir, 'data'), 50, 7);
});
after(() => rmSync(dir, { recursive: true, force: true }));

const opts = (format: 'parquet' | 'jsonl', more: Partial<ReadRowsOptions> = {}): ReadRowsOptions => ({
  format,
  columns: verlColumns,
  cacheDir: join(dir, 'cache'),
  ...more,
});

function expected(i: number) {
  const r = arithmeticRow(i);
  return {
    row: i,
    dataSource: r.data_source,
    prompt: r.prompt,
    ability: r.ability,
    groundTruth: r.reward_model.ground_truth,
    extraInfo: r.extra_info,
  };
}

describe('datasets: rows by index', () => {
  const indices = [49, 0, 6, 7, 13, 14, 7, 30];

  for (const format of ['parquet', 'jsonl'] as const) {
    it(`${format}: the rows asked for, in that order, repeats included, across row groups`, async () => {
      const rows = await readDatasetRows(
        { path: join(dir, 'data', `train.${format}`) },
        indices,
        opts(format),
      );
      assert.deepEqual(
        rows.map((r) => ({ ...r, prompt: r.prompt.map((m) => ({ role: m.role, content: m.content })) })),
        indices.map(expected),
      );
    });

    it(`${format}: from an fs store, checked against the campaign's hash`, async () => {
      const store = new FsStore(dir);
      const input = { store, key: `data/train.${format}` };
      const { sha256 } = await hashDataset(input);
      const rows = await readDatasetRows(input, [3, 1], opts(format, { expectedSha256: sha256 }));
      assert.deepEqual(
        rows.map((r) => r.row),
        [3, 1],
      );
      if (format === 'parquet') {
        assert.ok(
          readdirSync(join(dir, 'cache')).includes(`${sha256}.dataset`),
          'copied once, named by its hash',
        );
        const files = readdirSync(join(dir, 'cache'));
        assert.ok(
          files.some((f) => f.startsWith(sha256) && f.endsWith('.rows.idx')),
          'decoded once into the row cache',
        );
        assert.deepEqual(
          files.filter((f) => f.startsWith('.') || f.endsWith('.tmp')),
          [],
          'no temporaries left',
        );
      }
    });

    it(`${format}: bytes that changed under the campaign are refused`, async () => {
      const changed = join(dir, `changed.${format}`);
      writeFileSync(changed, '');
      await writeArithmeticDataset(join(dir, 'other'), 51, 7);
      const store = new FsStore(join(dir, 'other'));
      const { sha256 } = await hashDataset({ path: join(dir, 'data', `train.${format}`) });
      for (const input of [
        { path: join(dir, 'other', `train.${format}`) },
        { store, key: `train.${format}` },
      ])
        await assert.rejects(
          readDatasetRows(input, [0], opts(format, { expectedSha256: sha256 })),
          (err: unknown) => {
            assert.ok(err instanceof DatasetChangedError, String(err));
            assert.equal(err.expectedSha256, sha256);
            assert.match(err.message, /changed under the campaign/);
            return true;
          },
        );
    });

    it(`${format}: rows past the end are named`, async () => {
      await assert.rejects(
        readDatasetRows({ path: join(dir, 'data', `train.${format}`) }, [2, 50, 60], opts(format)),
        (err: unknown) =>
          err instanceof DatasetError && /rows 50, 60 are past the end of the file/.test(err.message),
      );
    });
  }

  it("a shard's drawn rows read the same from either format", async () => {
    const { prompts } = drawPrompts({ seed: 4, rows: 50 }, startPosition, 60);
    const indices = prompts.map((p) => p.row);
    const [pq, jl] = await Promise.all(
      (['parquet', 'jsonl'] as const).map((f) =>
        readDatasetRows({ path: join(dir, 'data', `train.${f}`) }, indices, opts(f)),
      ),
    );
    assert.deepEqual(
      pq?.map((r) => [r.row, r.groundTruth]),
      jl?.map((r) => [r.row, r.groundTruth]),
    );
  });
});
