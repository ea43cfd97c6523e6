// Each reader of a checkpoint fetches only the part it needs: a rollout worker's cache (and an
// export) the weights, not the AdamW moments nor a Hugging Face directory, and its byte bound
// counts only them; a trainer rank the weights and moments of its experts; the KL reference its
// weights. A checkpoint of manifest version 1 (moments inside the weights files, as a campaign
// in flight across the upgrade has committed) is fetched as before.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { MockActivityEnvironment } from '@temporalio/testing';
import {
  CheckpointCache,
  commitCheckpoint,
  fetchCheckpointForRank,
  rankFiles,
  sha256Hex,
  stageCheckpoint,
  withHuggingFaceFiles,
} from '../../activities/checkpoints.js';
import { createActivities } from '../../activities/index.js';
import type { ActivityDeps } from '../../activities/index.js';
import type { Launcher, TrainJobSpec } from '../../activities/launch/types.js';
import { FsStore, openStore } from '../../activities/store/index.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CheckpointRef, UpdateInput } from '../../activities/types.js';
import { testSpec } from '../support/campaign-harness.js';
import { writeLocalCheckpoint } from '../support/checkpoint-fixtures.js';

/** A checkpoint moe_train wrote before the optimizer files (native/tests/golden/checkpoint-v1). */
const version1Checkpoint = fileURLToPath(
  new URL('../../../native/tests/golden/checkpoint-v1', import.meta.url),
);

const roots: string[] = [];
function freshRoot(): string {
  const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-parts-'));
  roots.push(root);
  return root;
}
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

const commitOpts = { meanReward: null, keepLast: 10, keepBest: false, keepIteration: 0, now: new Date() };

/** `dir` staged and committed as iteration `iteration` of campaign c1. */
async function commit(store: ObjectStore, dir: string, iteration = 3): Promise<CheckpointRef> {
  return (await commitCheckpoint(store, await stageCheckpoint(store, dir, 'c1', iteration), commitOpts))
    .checkpoint;
}

/** `store`, recording the keys and bytes its downloads fetch. */
function counting(store: ObjectStore) {
  const counted = Object.create(store) as ObjectStore & { keys: string[]; bytes: number };
  counted.keys = [];
  counted.bytes = 0;
  counted.getFile = async (key, path) => {
    await store.getFile(key, path);
    counted.keys.push(key.slice(key.lastIndexOf('/') + 1));
    counted.bytes += statSync(path).size;
  };
  return counted;
}

const weights = (...ranks: number[]) => [
  'dense.safetensors',
  ...ranks.map((r) => `experts-rank${r}.safetensors`),
];
const moments = (...ranks: number[]) => weights(...ranks).map((n) => `optimizer-${n}`);

describe('checkpoint parts: each reader fetches what it needs', () => {
  test("a rollout worker's cache holds the weights only, and its bound counts only them", async () => {
    const root = freshRoot();
    const local = join(root, 'saved');
    // A PyTorch trainer's checkpoint after optimizer steps: moerl weights 3 x 4 KiB, their
    // moments 3 x 8 KiB, and a Hugging Face directory beside them.
    const manifest = writeLocalCheckpoint(local, { worldSize: 2, bytes: 4096, optimizer: true });
    const hf = ['config.json', 'model.safetensors'].map((name) => {
      const data = Buffer.alloc(name === 'config.json' ? 100 : 12288, 1);
      writeFileSync(join(local, name), data);
      return { name, bytes: data.length, sha256: sha256Hex(data) };
    });
    writeFileSync(join(local, 'manifest.json'), JSON.stringify(withHuggingFaceFiles(manifest, hf, local)));
    const store = new FsStore(join(root, 'store'));
    const ref = await commit(store, local);
    const manifestBytes = (await store.get(`${ref.key}/manifest.json`)).length;

    // Room for the weights and the manifest, not for the whole checkpoint (49 KiB more).
    const cache = new CheckpointCache(join(root, 'cache'), {
      maxCheckpoints: 4,
      maxBytes: 3 * 4096 + manifestBytes + 1024,
    });
    const counted = counting(store);
    const lease = await cache.acquire(counted, ref);
    assert.deepEqual(counted.keys.sort(), weights(0, 1));
    assert.equal(counted.bytes, 3 * 4096);
    assert.deepEqual(readdirSync(lease.dir).sort(), [...weights(0, 1), 'manifest.json'].sort());
    assert.equal(sha256Hex((await store.get(`${ref.key}/manifest.json`)).toString()), ref.manifestSha256);
    lease.release();
    await cache.settled();
  });

  test('a trainer rank fetches the weights and moments of its experts; the reference its weights', async () => {
    const root = freshRoot();
    const store = new FsStore(join(root, 'store'));
    const local = join(root, 'saved');
    const manifest = writeLocalCheckpoint(local, { worldSize: 4, experts: 8, optimizer: true });
    const ref = await commit(store, local);
    // 8 experts saved by 4 ranks, running on 2: rank 1 owns experts 4..7, saved files 2 and 3.
    assert.deepEqual(rankFiles(manifest, 'm', 1, 2), [...weights(2, 3), ...moments(2, 3)]);
    assert.deepEqual(rankFiles(manifest, 'm', 1, 2, 'weights'), weights(2, 3));

    const training = counting(store);
    const dir = join(root, 'rank1-policy');
    await fetchCheckpointForRank(training, ref, dir, { rank: 1, worldSize: 2 });
    assert.deepEqual(readdirSync(dir).sort(), [...weights(2, 3), ...moments(2, 3), 'manifest.json'].sort());
    const reference = counting(store);
    const refDir = join(root, 'rank1-reference');
    await fetchCheckpointForRank(reference, ref, refDir, { rank: 1, worldSize: 2, part: 'weights' });
    assert.deepEqual(readdirSync(refDir).sort(), [...weights(2, 3), 'manifest.json'].sort());
    assert.equal(training.bytes, 3 * reference.bytes, 'the moments are twice the weights');
  });

  test('a version 1 checkpoint (moments inside the weights files) is fetched as before', async () => {
    const root = freshRoot();
    const store = new FsStore(join(root, 'store'));
    const ref = await commit(store, version1Checkpoint);
    const cache = new CheckpointCache(join(root, 'cache'), { maxCheckpoints: 4, maxBytes: Infinity });
    const lease = await cache.acquire(store, ref);
    assert.deepEqual(readdirSync(lease.dir).sort(), [...weights(0, 1), 'manifest.json'].sort());
    lease.release();
    await cache.settled();
    for (const part of [undefined, 'weights' as const]) {
      const dir = join(root, `rank0-${part ?? 'training'}`);
      await fetchCheckpointForRank(store, ref, dir, { rank: 0, worldSize: 2, ...(part ? { part } : {}) });
      assert.deepEqual(readdirSync(dir).sort(), [...weights(0), 'manifest.json'].sort());
    }
  });

  test("an update's job fetches the policy to train on and only the reference's weights", async () => {
    const root = freshRoot();
    const spec = testSpec({
      store: { kind: 'fs', path: join(root, 'store') },
      hyperparameters: { klCoef: 0.01 },
    });
    const jobs: TrainJobSpec[] = [];
    const launcher: Launcher = {
      launch(job: TrainJobSpec) {
        jobs.push(job);
        return Promise.reject(new Error('launched no job: the test reads its description only'));
      },
    };
    const deps = {
      openStore: (location: Parameters<typeof openStore>[0]) => openStore(location),
      launcherFor: () => launcher,
      shutdown: new AbortController().signal,
      workerId: 'host/1/abc',
    } as unknown as ActivityDeps;
    const ref = (iteration: number): CheckpointRef => ({
      campaignId: 'c1',
      iteration,
      key: `campaigns/c1/checkpoints/${iteration}`,
      manifestSha256: 'a'.repeat(64),
      meanReward: null,
    });
    const input: UpdateInput = {
      campaignId: 'c1',
      iteration: 4,
      spec,
      policy: ref(3),
      reference: ref(0),
      chunksPerShard: [1, 1],
      hyperparameters: spec.hyperparameters,
    };
    const env = new MockActivityEnvironment({ heartbeatTimeoutMs: 1000 });
    await assert.rejects(env.run(createActivities(deps).updatePolicy, input), /launched no job/);
    assert.deepEqual(
      jobs[0]?.job.checkpoints.map((c) => [c.dir, c.part ?? 'training']),
      [
        ['policy', 'training'],
        ['reference', 'weights'],
      ],
    );
  });
});
