// The s3 ObjectStore against a real S3-compatible server (versitygw, started here): the shared
// contract suite, plus what only S3 has — multipart uploads and their abort, credentials,
// an unreachable or silent endpoint, and prefixes sharing one bucket.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { ListMultipartUploadsCommand, S3Client } from '@aws-sdk/client-s3';
import {
  openStore,
  S3Store,
  StoreAuthError,
  StoreError,
  StoreUnavailableError,
  type S3StoreOptions,
} from '../../activities/store/index.js';
import { freePort } from '../../cli/dev-server.js';
import { contractListPageSize, contractPartSize, keys, storeContract } from '../support/store-contract.js';
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

function location(prefix: string, endpoint = gw.endpoint) {
  return { kind: 's3' as const, bucket, prefix, region: gw.region, endpoint, forcePathStyle: true };
}

function testOptions(overrides: S3StoreOptions = {}): S3StoreOptions {
  return {
    credentials: { accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey },
    partSize: contractPartSize,
    listPageSize: contractListPageSize,
    maxAttempts: 2,
    connectTimeoutMs: 1_000,
    idleTimeoutMs: 2_000,
    ...overrides,
  };
}

// Each contract test gets its own prefix in the shared bucket: an empty store.
storeContract(
  's3 (versitygw)',
  async () => openStore(location(`contract-${++stores}`), { s3: testOptions() }),
  {
    concurrentCreateUnchecked:
      "versitygw's posix backend checks If-None-Match and writes in two steps: two of eight concurrent creators both won once",
  },
);

describe('s3 store', () => {
  test('large bodies go up as multipart uploads; a failed one is aborted, no parts linger', async () => {
    const store = new S3Store(location('multipart'), testOptions());
    const data = randomBytes(12 * 1024 * 1024);
    await store.put('campaigns/c1/checkpoints/000001/dense.safetensors', data);
    const info = await store.head('campaigns/c1/checkpoints/000001/dense.safetensors');
    assert.equal(info?.bytes, data.length);
    assert.match(info?.etag ?? '', /-3$/, 'a 12 MiB object in 5 MiB parts has a 3-part etag');
    const small = await store
      .put('campaigns/c1/spec.json', '{}')
      .then(() => store.head('campaigns/c1/spec.json'));
    assert.doesNotMatch(small?.etag ?? '', /-/);

    const broken = Readable.from(
      (async function* () {
        yield data.subarray(0, 11 * 1024 * 1024);
        throw new Error('source broke');
      })(),
      { objectMode: false },
    );
    await assert.rejects(
      store.put('campaigns/c1/checkpoints/000001/experts-rank0.safetensors', broken),
      /source broke/,
    );
    const client = new S3Client({
      region: gw.region,
      endpoint: gw.endpoint,
      forcePathStyle: true,
      credentials: { accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey },
    });
    try {
      const uploads = await client.send(
        new ListMultipartUploadsCommand({ Bucket: bucket, Prefix: 'multipart/' }),
      );
      assert.deepEqual(uploads.Uploads ?? [], []);
    } finally {
      client.destroy();
    }
    assert.equal(await store.head('campaigns/c1/checkpoints/000001/experts-rank0.safetensors'), null);
  });

  test('prefixes isolate stores that share a bucket', async () => {
    const alpha = new S3Store(location('team/alpha'), testOptions());
    const alpha2 = new S3Store(location('/team/alpha2/'), testOptions());
    const root = new S3Store(location(''), testOptions());
    await alpha.put('campaigns/c1/spec.json', 'alpha');
    await alpha2.put('campaigns/c1/spec.json', 'alpha2');
    assert.equal((await alpha.get('campaigns/c1/spec.json')).toString(), 'alpha');
    assert.equal((await alpha2.get('campaigns/c1/spec.json')).toString(), 'alpha2');
    assert.deepEqual(await keys(alpha, ''), ['campaigns/c1/spec.json']);
    assert.deepEqual(await keys(root, 'team/'), [
      'team/alpha/campaigns/c1/spec.json',
      'team/alpha2/campaigns/c1/spec.json',
    ]);
    assert.equal(await alpha.deletePrefix('campaigns/'), 1);
    assert.equal((await alpha2.get('campaigns/c1/spec.json')).toString(), 'alpha2');
    assert.match(
      alpha2.describe(),
      /^s3:\/\/moerl-test-[^/]+\/team\/alpha2\/ \(region us-east-1, endpoint http:\/\/127\.0\.0\.1:\d+\)$/,
    );
  });

  test('a wrong secret is a StoreAuthError, not retried, and the secret is never in a message', async () => {
    const store = new S3Store(
      location('auth'),
      testOptions({
        credentials: { accessKeyId: gw.accessKey, secretAccessKey: 'wrong-secret-value' },
        maxAttempts: 3,
      }),
    );
    const started = Date.now();
    for (const attempt of [
      () => store.get('campaigns/c1/spec.json'),
      () => store.put('campaigns/c1/spec.json', 'x'),
      () => store.head('campaigns/c1/spec.json'),
      () => keys(store, ''),
    ]) {
      await assert.rejects(attempt, (err: unknown) => {
        assert.ok(err instanceof StoreAuthError, `expected StoreAuthError, got ${String(err)}`);
        assert.equal(err.retryable, false);
        assert.ok(err.message.includes(store.describe()), err.message);
        assert.ok(!err.message.includes('wrong-secret-value') && !err.message.includes(gw.secretKey));
        return true;
      });
    }
    assert.ok(Date.now() - started < 5_000, 'auth failures are not retried with backoff');
  });

  test('an unknown access key is a StoreAuthError too (versitygw: XAdminUserNotFound)', async () => {
    const store = new S3Store(
      location('auth'),
      testOptions({ credentials: { accessKeyId: 'unknownkey', secretAccessKey: 'whatever' } }),
    );
    await assert.rejects(store.get('campaigns/c1/spec.json'), StoreAuthError);
    await assert.rejects(store.put('campaigns/c1/spec.json', 'x'), StoreAuthError);
  });

  test('a missing bucket is a non-retryable StoreError that says so', async () => {
    const store = openStore({ ...location(''), bucket: 'no-such-bucket-here' }, { s3: testOptions() });
    await assert.rejects(
      store.put('campaigns/c1/spec.json', 'x'),
      (err: unknown) =>
        err instanceof StoreError && !err.retryable && /bucket does not exist/.test(err.message),
    );
  });

  test('an endpoint that refuses connections is a StoreUnavailableError within seconds', async () => {
    const deadPort = await freePort();
    const store = new S3Store(location('dead', `http://127.0.0.1:${deadPort}`), testOptions());
    const started = Date.now();
    for (const attempt of [
      () => store.get('campaigns/c1/spec.json'),
      () => store.head('campaigns/c1/spec.json'),
      () => store.put('campaigns/c1/spec.json', 'x'),
    ])
      await assert.rejects(attempt, (err: unknown) => {
        assert.ok(err instanceof StoreUnavailableError, `expected StoreUnavailableError, got ${String(err)}`);
        assert.equal(err.retryable, true);
        assert.match(err.message, /cannot reach the endpoint \(after 2 attempts\)/);
        return true;
      });
    assert.ok(Date.now() - started < 5_000, `took ${Date.now() - started} ms`);
  });

  test('an endpoint that accepts but never answers is a StoreUnavailableError after the idle timeout', async () => {
    const sockets = new Set<Socket>();
    const silent: Server = createServer((socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const port = (silent.address() as { port: number }).port;
    try {
      const store = new S3Store(
        location('silent', `http://127.0.0.1:${port}`),
        testOptions({ maxAttempts: 1, idleTimeoutMs: 1_000 }),
      );
      const started = Date.now();
      await assert.rejects(store.get('campaigns/c1/spec.json'), StoreUnavailableError);
      const elapsed = Date.now() - started;
      assert.ok(elapsed >= 900 && elapsed < 5_000, `took ${elapsed} ms`);
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    }
  });
});
