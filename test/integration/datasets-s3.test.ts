// Datasets on S3 (versitygw, started here): a verl-schema Parquet and JSONL file named by an
// s3:// reference validate with the same identity as the local file, malformed rows are named
// as they are locally, shards read their rows by index (Parquet through one cached copy per
// content hash, reused while the object's entity tag holds), and an object replaced under the
// campaign is refused by its hash.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  DatasetChangedError,
  DatasetError,
  datasetLocation,
  hashDataset,
  readDatasetRows,
  validateDataset,
  verlColumns,
} from '../../activities/datasets/index.js';
import { openStore, type ObjectStore } from '../../activities/store/index.js';
import { parseDatasetRef } from '../../workflows/spec-dataset.js';
import { arithmeticRow, writeArithmeticDataset } from '../support/dataset-fixtures.js';
import { startVersitygw, type Versitygw } from '../support/versitygw.js';

let gw: Versitygw;
let bucket: string;
let dir: string;

before(async () => {
  gw = await startVersitygw();
  bucket = await gw.createBucket();
  dir = mkdtempSync(join(tmpdir(), 'moerl-datasets-s3-'));
  await writeArithmeticDataset(join(dir, 'data'), 50, 7);
});
after(async () => {
  await gw?.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** The object an s3:// reference names, reached with a campaign store's S3 settings. */
function s3Input(uri: string): { store: ObjectStore; key: string } {
  const ref = parseDatasetRef(uri);
  assert.ok(typeof ref !== 'string', String(ref));
  const campaignStore = {
    kind: 's3' as const,
    bucket,
    prefix: 'campaigns-root',
    region: gw.region,
    endpoint: gw.endpoint,
    forcePathStyle: true,
  };
  const { location, key } = datasetLocation(ref, campaignStore);
  const store = openStore(location, {
    s3: { credentials: { accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey }, maxAttempts: 2 },
  });
  return { store, key };
}

const cacheDir = () => join(dir, 'cache');

describe('datasets on S3 (versitygw)', () => {
  for (const format of ['parquet', 'jsonl'] as const) {
    test(`${format}: validates with the local file's identity and reads rows by index`, async () => {
      const input = s3Input(`s3://${bucket}/datasets/arith/train.${format}`);
      await input.store.putFile(input.key, join(dir, 'data', `train.${format}`));
      const local = await hashDataset({ path: join(dir, 'data', `train.${format}`) });
      const identity = await validateDataset(input, { format, columns: verlColumns, cacheDir: cacheDir() });
      assert.deepEqual(identity, { ...local, rows: 50 });
      const rows = await readDatasetRows(input, [20, 3, 49], {
        format,
        columns: verlColumns,
        cacheDir: cacheDir(),
        expectedSha256: identity.sha256,
      });
      assert.deepEqual(
        rows.map((r) => [r.row, r.groundTruth]),
        [20, 3, 49].map((i) => [i, arithmeticRow(i).reward_model.ground_truth]),
      );
    });
  }

  test('a malformed row is named as it is locally', async () => {
    const input = s3Input(`s3://${bucket}/datasets/bad/train.jsonl`);
    const { prompt: _, ...noPrompt } = arithmeticRow(1);
    await input.store.put(input.key, `${JSON.stringify(arithmeticRow(0))}\n${JSON.stringify(noPrompt)}\n`);
    await assert.rejects(
      validateDataset(input, { format: 'jsonl', columns: verlColumns, cacheDir: cacheDir() }),
      (err: unknown) => {
        assert.ok(err instanceof DatasetError, String(err));
        assert.deepEqual(err.problems, ['row 1 (line 2): prompt: missing']);
        assert.match(err.message, new RegExp(`datasets/bad/train\\.jsonl in s3://${bucket}`));
        return true;
      },
    );
  });

  test('parquet: one cached copy per hash, reused while the object holds; a replaced object is refused', async () => {
    const input = s3Input(`s3://${bucket}/datasets/cached/train.parquet`);
    await input.store.putFile(input.key, join(dir, 'data', 'train.parquet'));
    const { sha256 } = await hashDataset(input);
    const opts = {
      format: 'parquet' as const,
      columns: verlColumns,
      cacheDir: cacheDir(),
      expectedSha256: sha256,
    };
    await readDatasetRows(input, [0], opts);
    const copy = join(cacheDir(), `${sha256}.dataset`);
    const first = statSync(copy);
    await readDatasetRows(input, [1], opts);
    assert.equal(statSync(copy).mtimeMs, first.mtimeMs, 'the cached copy was reused');

    await writeArithmeticDataset(join(dir, 'other'), 51, 7);
    await input.store.putFile(input.key, join(dir, 'other', 'train.parquet'));
    await assert.rejects(readDatasetRows(input, [0], opts), (err: unknown) => {
      assert.ok(err instanceof DatasetChangedError, String(err));
      assert.equal(err.expectedSha256, sha256);
      return true;
    });
    const jsonl = s3Input(`s3://${bucket}/datasets/cached/train.jsonl`);
    await jsonl.store.putFile(jsonl.key, join(dir, 'other', 'train.jsonl'));
    const { sha256: jsonlSha } = await hashDataset({ path: join(dir, 'data', 'train.jsonl') });
    await assert.rejects(
      readDatasetRows(jsonl, [0], { ...opts, format: 'jsonl', expectedSha256: jsonlSha }),
      DatasetChangedError,
    );
  });
});
