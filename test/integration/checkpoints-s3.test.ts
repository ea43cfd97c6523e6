// The checkpoint commit suite (test/support/checkpoint-commit-suite.ts) on the s3 store,
// against a real versitygw started here; each store gets its own prefix of one bucket.
import { after, before } from 'node:test';
import { S3Store } from '../../activities/store/index.js';
import { checkpointCommitSuite } from '../support/checkpoint-commit-suite.js';
import { startVersitygw, type Versitygw } from '../support/versitygw.js';

let gw: Versitygw;
let bucket: string;
let stores = 0;

before(async () => {
  gw = await startVersitygw();
  bucket = await gw.createBucket();
});
after(async () => {
  await gw?.stop();
});

checkpointCommitSuite(
  's3 (versitygw)',
  async () =>
    new S3Store(
      {
        bucket,
        prefix: `ckpt-${++stores}`,
        region: gw.region,
        endpoint: gw.endpoint,
        forcePathStyle: true,
      },
      { credentials: { accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey } },
    ),
  // versitygw's conditional write is not atomic under concurrency (docs/store.md).
  { atomicCreate: false },
);
