// One behaviour suite for every ObjectStore backend: the fs unit test and the S3 integration
// test both run it, so the backends cannot drift apart. The stores handed in should use
// small parts (5 MiB) and small list pages (3 keys) so that the multipart and paging paths
// run on small data.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import {
  StoreError,
  StoreKeyError,
  StoreNotFoundError,
  type ObjectStore,
} from '../../activities/store/index.js';

export const contractPartSize = 5 * 1024 * 1024;
export const contractListPageSize = 3;

export interface ContractOptions {
  /**
   * Why concurrent createIfAbsent calls cannot be checked on this backend, if they cannot: the
   * test server's conditional write is not atomic (real S3's is).
   */
  concurrentCreateUnchecked?: string;
}

/** `open` returns a fresh, empty store each call. */
export function storeContract(
  backend: string,
  open: () => Promise<ObjectStore>,
  options: ContractOptions = {},
): void {
  describe(`ObjectStore contract: ${backend}`, () => {
    let scratch: string;
    before(() => {
      scratch = mkdtempSync(join(tmpdir(), 'moerl-store-contract-'));
    });
    after(() => rmSync(scratch, { recursive: true, force: true }));

    test('small objects round-trip from a string, a Buffer and a stream; put replaces', async () => {
      const store = await open();
      await store.put('campaigns/c1/spec.json', '{"name":"demo"}');
      await store.put('campaigns/c1/metrics/000001.json', Buffer.from([0, 1, 2, 255]));
      await store.put('campaigns/c1/logs/1/1/rank-0.log', Readable.from(['line 1\n', 'line 2\n']));
      await store.put('campaigns/c1/empty', '');
      assert.equal((await store.get('campaigns/c1/spec.json')).toString(), '{"name":"demo"}');
      assert.deepEqual([...(await store.get('campaigns/c1/metrics/000001.json'))], [0, 1, 2, 255]);
      assert.equal((await store.get('campaigns/c1/logs/1/1/rank-0.log')).toString(), 'line 1\nline 2\n');
      assert.equal((await store.get('campaigns/c1/empty')).length, 0);
      assert.equal((await store.head('campaigns/c1/spec.json'))?.bytes, 15);
      assert.equal((await store.head('campaigns/c1/empty'))?.bytes, 0);

      await store.put('campaigns/c1/spec.json', 'v2');
      assert.equal((await store.get('campaigns/c1/spec.json')).toString(), 'v2');
      assert.equal((await store.head('campaigns/c1/spec.json'))?.bytes, 2);
      const chunks: Buffer[] = await store.getStream('campaigns/c1/logs/1/1/rank-0.log').toArray();
      assert.equal(Buffer.concat(chunks).toString(), 'line 1\nline 2\n');
      assert.ok(!store.describe().includes('undefined'), store.describe());
    });

    test('a large object (above the part size) round-trips through files and streams', async () => {
      const store = await open();
      const data = randomBytes(12 * 1024 * 1024 + 123);
      const source = join(scratch, 'large.bin');
      writeFileSync(source, data);
      await store.putFile('campaigns/c1/checkpoints/000001/dense.safetensors', source);
      assert.equal(
        (await store.head('campaigns/c1/checkpoints/000001/dense.safetensors'))?.bytes,
        data.length,
      );

      const target = join(scratch, 'cache', 'nested', 'dense.safetensors');
      await store.getFile('campaigns/c1/checkpoints/000001/dense.safetensors', target);
      assert.equal(sha256(readFileSync(target)), sha256(data));
      const streamed = createHash('sha256');
      for await (const chunk of store.getStream('campaigns/c1/checkpoints/000001/dense.safetensors'))
        streamed.update(chunk as Buffer);
      assert.equal(streamed.digest('hex'), sha256(data));

      // A reader that stops early releases the object; the store keeps working.
      for await (const chunk of store.getStream('campaigns/c1/checkpoints/000001/dense.safetensors')) {
        assert.ok((chunk as Buffer).length > 0);
        break;
      }

      // A stream of unknown length, in odd-sized pieces, and a Buffer above the part size.
      const pieces = Array.from({ length: 13 }, (_, i) => data.subarray(i * 1_000_003, (i + 1) * 1_000_003));
      await store.put('campaigns/c1/checkpoints/000001/experts-rank0.safetensors', Readable.from(pieces));
      const joined = Buffer.concat(pieces);
      assert.equal(
        sha256(await store.get('campaigns/c1/checkpoints/000001/experts-rank0.safetensors')),
        sha256(joined),
      );
      await store.put('campaigns/c1/checkpoints/000001/experts-rank1.safetensors', data);
      assert.equal(
        sha256(await store.get('campaigns/c1/checkpoints/000001/experts-rank1.safetensors')),
        sha256(data),
      );
    });

    test('a source stream that fails writes nothing and leaves the old object', async () => {
      const store = await open();
      // A missing local file is the caller's problem: the plain ENOENT, not a store error.
      await assert.rejects(
        store.putFile('campaigns/c1/dense.safetensors', join(scratch, 'not-there')),
        (err: unknown) => !(err instanceof StoreError) && (err as { code?: string }).code === 'ENOENT',
      );
      await store.put('campaigns/c1/LATEST', 'old');
      for (const bytesBefore of [1024, 11 * 1024 * 1024]) {
        await assert.rejects(store.put('campaigns/c1/LATEST', failingStream(bytesBefore)), /source broke/);
        assert.equal((await store.get('campaigns/c1/LATEST')).toString(), 'old');
      }
      await assert.rejects(store.put('campaigns/c1/new', failingStream(1024)), /source broke/);
      assert.equal(await store.head('campaigns/c1/new'), null);
      assert.deepEqual(await keys(store, ''), ['campaigns/c1/LATEST']);
    });

    test('a missing key: get, getStream and getFile fail with StoreNotFoundError; head is null', async () => {
      const store = await open();
      await store.put('campaigns/c1/other', 'x');
      const key = 'campaigns/c1/rewards/000001/shard-0.jsonl';
      const isNotFound = (err: unknown): boolean => {
        assert.ok(err instanceof StoreNotFoundError, `expected StoreNotFoundError, got ${String(err)}`);
        assert.equal(err.key, key);
        assert.equal(err.retryable, false);
        assert.ok(err.message.includes(key) && err.message.includes(store.describe()), err.message);
        return true;
      };
      await assert.rejects(store.get(key), isNotFound);
      await assert.rejects(store.getStream(key).toArray(), isNotFound);
      await assert.rejects(store.getFile(key, join(scratch, 'missing.jsonl')), isNotFound);
      assert.equal(await store.head(key), null);
      // A "directory" of keys is not an object either.
      assert.equal(await store.head('campaigns/c1'), null);
      await assert.rejects(store.get('campaigns/c1'), StoreNotFoundError);
    });

    test('getFile never leaves a half-written local file', async () => {
      const store = await open();
      const dir = mkdtempSync(join(scratch, 'getfile-'));
      const target = join(dir, 'chunk-0.jsonl');
      writeFileSync(target, 'previous');
      await assert.rejects(store.getFile('campaigns/c1/rollouts/000001/shard-0/chunk-0.jsonl', target));
      assert.equal(readFileSync(target, 'utf8'), 'previous');
      assert.deepEqual(readdirSync(dir), ['chunk-0.jsonl']);

      await store.put('campaigns/c1/rollouts/000001/shard-0/chunk-0.jsonl', '{"sample":0}\n');
      await store.getFile('campaigns/c1/rollouts/000001/shard-0/chunk-0.jsonl', target);
      assert.equal(readFileSync(target, 'utf8'), '{"sample":0}\n');
      assert.deepEqual(readdirSync(dir), ['chunk-0.jsonl']);
    });

    test('list: every page, key order, sizes, prefixes that end mid-segment', async () => {
      const store = await open();
      const written: string[] = [];
      for (let shard = 0; shard < 2; shard++)
        for (let chunk = 0; chunk < 5; chunk++)
          written.push(`campaigns/c1/rollouts/000001/shard-${shard}/chunk-${chunk}.jsonl`);
      written.push(
        'campaigns/c1/rewards/000001/shard-0.jsonl',
        'campaigns/c1/spec.json',
        'campaigns/c2/spec.json',
      );
      written.push('campaigns/c1-other/spec.json', 'campaigns/c1/a-b', 'campaigns/c1/a/b');
      for (const [i, key] of written.entries()) await store.put(key, 'x'.repeat(i));

      const all = [];
      for await (const object of store.list('')) all.push(object);
      const sorted = [...written].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
      assert.deepEqual(
        all.map((o) => o.key),
        sorted,
      );
      for (const object of all) assert.equal(object.bytes, written.indexOf(object.key));

      assert.deepEqual(
        await keys(store, 'campaigns/c1/rollouts/000001/shard-1/'),
        sorted.filter((k) => k.includes('shard-1/')),
      );
      assert.deepEqual(
        await keys(store, 'campaigns/c1/r'),
        sorted.filter((k) => k.startsWith('campaigns/c1/r')),
      );
      assert.equal((await keys(store, 'campaigns/c1/r')).length, 11);
      assert.deepEqual(
        await keys(store, 'campaigns/c1/'),
        sorted.filter((k) => k.startsWith('campaigns/c1/')),
      );
      assert.deepEqual(
        await keys(store, 'campaigns/c1'),
        sorted.filter((k) => k.startsWith('campaigns/c1')),
      );
      assert.deepEqual(await keys(store, 'campaigns/c1/spec.json'), ['campaigns/c1/spec.json']);
      assert.deepEqual(await keys(store, 'campaigns/c3/'), []);
      assert.deepEqual(await keys(store, 'nothing-here'), []);
    });

    test('delete and deletePrefix remove exactly what they name', async () => {
      const store = await open();
      for (const key of [
        'campaigns/c1/checkpoints/000001/dense.safetensors',
        'campaigns/c1/checkpoints/000001/manifest.json',
        'campaigns/c1/checkpoints/000002/dense.safetensors',
        'campaigns/c1/checkpoints/0000010/dense.safetensors',
        'campaigns/c1/LATEST',
      ])
        await store.put(key, 'x');
      await store.delete('campaigns/c1/LATEST');
      await store.delete('campaigns/c1/LATEST'); // already gone: not an error
      await store.delete('campaigns/never/was');
      assert.equal(await store.head('campaigns/c1/LATEST'), null);

      assert.equal(await store.deletePrefix('campaigns/c1/checkpoints/000001/'), 2);
      assert.deepEqual(await keys(store, ''), [
        'campaigns/c1/checkpoints/0000010/dense.safetensors',
        'campaigns/c1/checkpoints/000002/dense.safetensors',
      ]);
      assert.equal(await store.deletePrefix('campaigns/c9/'), 0);
      await assert.rejects(
        store.deletePrefix(''),
        (err: unknown) => err instanceof StoreError && !err.retryable,
      );
      assert.equal(await store.deletePrefix('campaigns/'), 2);
      assert.deepEqual(await keys(store, ''), []);
    });

    test('createIfAbsent: creates once, then refuses and keeps the first content', async () => {
      const store = await open();
      assert.equal(await store.createIfAbsent('campaigns/c1/lock', 'first'), true);
      assert.equal(await store.createIfAbsent('campaigns/c1/lock', 'second'), false);
      assert.equal((await store.get('campaigns/c1/lock')).toString(), 'first');
    });

    const concurrent = 'createIfAbsent: exactly one of concurrent creates wins and its content stays';
    const skip = options.concurrentCreateUnchecked;
    test(concurrent, skip ? { skip } : {}, async () => {
      const store = await open();
      const contenders = Array.from({ length: 8 }, (_, i) => `contender-${i}`);
      const results = await Promise.all(
        contenders.map((body) => store.createIfAbsent('campaigns/c1/race', body)),
      );
      assert.equal(results.filter(Boolean).length, 1, `results: ${results.join(', ')}`);
      const winner = contenders[results.indexOf(true)];
      assert.equal((await store.get('campaigns/c1/race')).toString(), winner);
      assert.deepEqual(await keys(store, ''), ['campaigns/c1/race']);
    });

    test('malformed keys are refused with a StoreKeyError naming the key', async () => {
      const store = await open();
      const bad = [
        '',
        '/abs',
        'trailing/',
        'a//b',
        '../up',
        'a/../b',
        'a/./b',
        'a\\b',
        'nul\u0000x',
        'a/.moerl-x',
      ];
      const refuses = (key: string) => (err: unknown) => {
        assert.ok(err instanceof StoreKeyError, `${JSON.stringify(key)}: got ${String(err)}`);
        assert.ok(err.message.includes(JSON.stringify(key)), err.message);
        assert.equal(err.key, key);
        assert.equal(err.retryable, false);
        return true;
      };
      for (const key of bad) {
        await assert.rejects(store.put(key, 'x'), refuses(key));
        await assert.rejects(store.putFile(key, join(scratch, 'nothing')), refuses(key));
        await assert.rejects(store.get(key), refuses(key));
        assert.throws(() => store.getStream(key), refuses(key));
        await assert.rejects(store.getFile(key, join(scratch, 'nothing')), refuses(key));
        await assert.rejects(store.head(key), refuses(key));
        await assert.rejects(store.delete(key), refuses(key));
        await assert.rejects(store.createIfAbsent(key, 'x'), refuses(key));
      }
      for (const prefix of ['/abs', 'a//', '../', 'a/../b/']) {
        await assert.rejects(keys(store, prefix), refuses(prefix));
        await assert.rejects(store.deletePrefix(prefix), refuses(prefix));
      }
      assert.deepEqual(await keys(store, ''), []);
    });
  });
}

export async function keys(store: ObjectStore, prefix: string): Promise<string[]> {
  const found: string[] = [];
  for await (const object of store.list(prefix)) found.push(object.key);
  return found;
}

function failingStream(bytesBefore: number): Readable {
  return Readable.from(
    (async function* () {
      yield randomBytes(bytesBefore);
      throw new Error('source broke');
    })(),
    { objectMode: false },
  );
}

function sha256(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}
