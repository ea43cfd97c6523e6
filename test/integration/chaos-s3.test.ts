// The fault suite on the S3 store (versitygw): a campaign whose workers and ranks reach the
// store through a seeded fault proxy (5xx, resets, lost answers, slow answers, cut bodies)
// completes with the uninterrupted run's checkpoint, rollouts and rewards; and a process killed
// mid-upload of a checkpoint (multipart) leaves nothing partial visible. Throughout, a plain
// S3 client lists the bucket straight from the server and checks what a reader would see.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { S3Client } from '@aws-sdk/client-s3';
import { committedCheckpoint } from '../../activities/checkpoints/commit.js';
import { openStore } from '../../activities/store/index.js';
import { sha256OfStream } from '../../activities/store/streams.js';
import { artifacts, within } from '../support/campaign-harness.js';
import { snapshot, violations, watchBucket } from '../support/bucket-watch.js';
import {
  chaosSpec,
  checkpointDigests,
  runTrial,
  startChaosStack,
  type ChaosStack,
} from '../support/chaos.js';
import { nativeTools } from '../support/native-tools.js';
import { startFaultProxy, type FaultProxy } from '../support/s3-fault-proxy.js';
import { startVersitygw, type Versitygw } from '../support/versitygw.js';
import { awsEnv, directClient, directStore, s3Location } from '../support/versitygw-access.js';

const tools = nativeTools(['moe_train', 'moe_generate']);
const seed = Number(process.env.MOERL_CHAOS_S3_SEED ?? '5');
const faultRate = 0.08;

let gw: Versitygw;
let proxy: FaultProxy;
let client: S3Client;
let dir: string;

describe('chaos: S3 faults', { skip: tools.skip, timeout: 300_000 }, () => {
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-chaos-s3-'));
    gw = await startVersitygw();
    proxy = await startFaultProxy(gw.endpoint, seed, { rate: 0 });
    client = directClient(gw);
  });
  after(async () => {
    client?.destroy();
    await within('the fault proxy to stop', 30_000, proxy?.stop() ?? Promise.resolve());
    await within('versitygw to stop', 30_000, gw?.stop() ?? Promise.resolve());
    rmSync(dir, { recursive: true, force: true });
  });

  test('a campaign through the fault proxy completes with the uninterrupted run’s results, nothing partial visible', async () => {
    const bucket = await gw.createBucket();
    const stack: ChaosStack = await startChaosStack(join(dir, 'stack'), awsEnv(gw));
    try {
      const fs = openStore(chaosSpec('x', dir).store);
      const reference = await runTrial(stack, chaosSpec('s3-reference', dir), [], 120_000);
      const iterations = reference.state.committedIteration;

      await proxy.setProfile({ rate: faultRate });
      const watch = watchBucket(client, bucket);
      const spec = chaosSpec('s3-faults', dir, s3Location(gw, bucket, proxy.endpoint));
      const outcome = await runTrial(stack, spec, [], 200_000);
      await proxy.setProfile({ rate: 0 });
      const seen = await watch.stop();
      const stats = await proxy.stats();
      console.log(
        `chaos s3 seed ${seed}: ${outcome.wallMs} ms, ${stats.requests} requests, faults ${JSON.stringify(stats.faults)}, ` +
          `lost ${JSON.stringify(outcome.lost)}, ${seen.listings} listings`,
      );
      assert.deepEqual(seen.violations, [], 'no listing showed anything partial');
      assert.ok(Object.values(stats.faults).reduce((a, b) => a + b) > 0, 'faults were injected');
      assert.deepEqual(stack.unexpectedExits, []);

      const s3 = directStore(gw, bucket);
      assert.deepEqual(
        await checkpointDigests(s3, outcome.campaignId, iterations),
        await checkpointDigests(fs, reference.campaignId, iterations),
        'the final checkpoint equals the uninterrupted run’s, file by file',
      );
      const [want, got] = [
        await artifacts(fs, reference.campaignId),
        await artifacts(s3, outcome.campaignId),
      ];
      assert.equal(got.size, want.size, 'nothing lost: as many rollout and rewards files');
      for (const [key, text] of want) assert.equal(got.get(key), text, key);
    } finally {
      await stack.stop();
    }
  });

  test('a process killed mid-upload of a checkpoint (multipart): no partial checkpoint is ever visible', async () => {
    const bucket = await gw.createBucket();
    // A real checkpoint whose expert file (≈ 24 MiB) goes up in 5 MiB parts.
    const local = join(dir, 'big');
    await tools.run(
      tools.bin('moe_train'),
      ['init', '--out', local, '--dim', '256', '--layers', '2', '--experts', '8', '--expert-dim', '512'],
      { env: tools.env },
    );
    const manifest = JSON.parse(readFileSync(join(local, 'manifest.json'), 'utf8')) as {
      files: { name: string; bytes: number }[];
    };
    const whole = new Map(manifest.files.map((f) => [f.name, statSync(join(local, f.name)).size]));
    assert.ok(
      Math.max(...whole.values()) > 10 * 1024 * 1024,
      `a file of several parts (${JSON.stringify([...whole])})`,
    );

    const child = fileURLToPath(new URL('../support/checkpoint-upload-child.js', import.meta.url));
    const upload = () =>
      spawn(process.execPath, [child, proxy.endpoint, bucket, local, 'mp', '1'], {
        env: { ...process.env, ...awsEnv(gw) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
    const s3 = directStore(gw, bucket);
    const steps: string[] = [];
    // Every wait names its step: under load this test once hung past its file's limit saying
    // nothing after "after the retry".
    const step = async (what: string) => {
      const snap = await within(`the bucket's listing ${what}`, 60_000, snapshot(client, bucket));
      steps.push(`${what}: ${snap.objects.size} objects, ${snap.openUploads} open uploads`);
      assert.deepEqual(
        await within(`the reader's view ${what}`, 60_000, violations(client, bucket, snap, whole)),
        [],
        what,
      );
      return snap;
    };
    const exitOf = (child: ReturnType<typeof upload>, what: string) =>
      within(what, 180_000, new Promise((resolve) => child.once('exit', resolve)));

    await step('before');
    // Parts answer slowly, so the kill lands while some are in flight and others are done.
    await proxy.setProfile({ rate: 0, partDelayMs: 700 });
    const watch = watchBucket(client, bucket, whole);
    const partsBefore = (await proxy.stats()).partsForwarded;
    const first = upload();
    const firstExit = exitOf(first, 'the killed upload to exit');
    for (let i = 0; i < 600 && (await proxy.stats()).partsForwarded < partsBefore + 3; i++)
      await new Promise((resolve) => setTimeout(resolve, 50));
    first.kill('SIGKILL');
    await firstExit;
    const killed = await step('after the kill mid-upload');
    assert.ok(![...killed.objects.keys()].some((k) => k.endsWith('manifest.json')), 'no manifest');
    assert.ok(killed.openUploads >= 1, 'the killed upload was under way (its parts are not visible)');
    assert.equal(
      await within('the checkpoint read after the kill', 120_000, committedCheckpoint(s3, 'mp', 1)),
      null,
      'nothing reads it as a checkpoint',
    );

    // The retry (a new attempt of the activity) finishes the upload and commits.
    await proxy.setProfile({ partDelayMs: 0 });
    const second = upload();
    let out = '';
    second.stdout.on('data', (d: Buffer) => (out += d.toString()));
    second.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const code = await exitOf(second, 'the retried upload to exit');
    assert.equal(code, 0, `the retried upload succeeds: ${out}`);
    const seen = await within('the bucket watch to stop', 60_000, watch.stop());
    const done = await step('after the retry');
    console.log(`multipart kill: ${steps.join('; ')}; ${seen.listings} listings in between`);
    assert.deepEqual(seen.violations, [], 'no listing in between showed anything partial');
    assert.equal(done.openUploads, 0, 'the retry aborted the killed upload, whose parts took space unseen');
    const committed = await within(
      'the committed checkpoint read',
      120_000,
      committedCheckpoint(s3, 'mp', 1),
    );
    assert.ok(committed, 'committed');
    for (const f of manifest.files) {
      const key = `campaigns/mp/checkpoints/000001/${f.name}`;
      assert.equal(done.objects.get(key), whole.get(f.name));
      const { sha256 } = await within(`reading back ${key}`, 120_000, sha256OfStream(s3.getStream(key)));
      assert.equal(
        sha256,
        createHash('sha256')
          .update(readFileSync(join(local, f.name)))
          .digest('hex'),
      );
    }
  });
});
