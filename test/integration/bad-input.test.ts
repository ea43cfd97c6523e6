// Bad input, end to end: real campaigns with the shipped activities (native moe_generate and
// moe_train on 2 EP ranks, fs and S3 stores) meet a corrupted or missing checkpoint file, a
// malformed rollout line, an unknown task, a trainer rank exiting 2, an unreachable store,
// rejected S3 credentials and a missing bucket. Each time the campaign pauses itself with the failure recorded
// (stage, type, retryability, a message naming what is wrong), nothing of the failed iteration
// is committed, `moerl status` / `moerl history` show the reason, and where the cause can be
// fixed a `resume` finishes the campaign.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { WorkflowHandle } from '@temporalio/client';
import { createActivities } from '../../activities/index.js';
import { workerActivityDeps, type ActivityDeps } from '../../activities/deps.js';
import * as keys from '../../activities/layout.js';
import { openStore, type ObjectStore, type S3StoreOptions } from '../../activities/store/index.js';
import type { CampaignActivities, CheckpointRef, StoreLocation } from '../../activities/types.js';
import type { CampaignHistory } from '../../cli/history.js';
import { main } from '../../cli/main.js';
import type { campaign } from '../../workflows/campaign.js';
import type { CampaignSpec, CampaignSpecInput } from '../../workflows/spec.js';
import type { CampaignState, StageFailure, StageName } from '../../workflows/types.js';
import { startCampaign, tinyRealSpec, waitForState, withWorkers } from '../support/campaign-harness.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';
import { startVersitygw, type Versitygw } from '../support/versitygw.js';

let t: TestEnvironment;
let dir: string;
before(async () => {
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-bad-input-'));
});
after(async () => {
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

type Handle = WorkflowHandle<typeof campaign>;

/** The failure as the campaign recorded it, in the test output (`# ...` lines). */
function diagnostic(f: StageFailure): void {
  process.stdout.write(
    `${f.stage} of iteration ${f.iteration}: ${f.type}${f.nonRetryable ? ' (non-retryable)' : ''}: ${f.message}\n`,
  );
}

const storeLocation = (): StoreLocation => ({ kind: 'fs', path: join(dir, 'store') });

const tinySpec = (name: string, overrides: Partial<CampaignSpecInput> = {}): CampaignSpec =>
  tinyRealSpec(name, dir, { store: storeLocation(), ...overrides });

let caches = 0;
/**
 * The worker's dependencies with a cache of its own: a checkpoint verified into another test's
 * cache would be served from there and never read from the store again.
 */
function workerDeps(overrides: Partial<ActivityDeps> = {}, env: NodeJS.ProcessEnv = {}): ActivityDeps {
  const cache = join(dir, `cache-${++caches}`);
  const deps = workerActivityDeps(new AbortController().signal, {
    ...process.env,
    MOERL_CACHE_DIR: cache,
    ...env,
  });
  return { ...deps, ...overrides };
}

/** Trainer ranks are processes of their own: they read the store's credentials from their environment. */
const rankCredentials = (gw: Versitygw) => ({
  AWS_ACCESS_KEY_ID: gw.accessKey,
  AWS_SECRET_ACCESS_KEY: gw.secretKey,
});

interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** `moerl ...` in-process against the test server. */
async function cli(...args: string[]): Promise<CliResult> {
  let stdout = '';
  let stderr = '';
  const code = await main([...args, '--address', t.address, '--namespace', t.namespace], {
    stdout: { write: (s: string) => (stdout += s) },
    stderr: { write: (s: string) => (stderr += s) },
    env: {},
  });
  return { code, stdout, stderr };
}

const readJson = async <T>(store: ObjectStore, key: string) =>
  JSON.parse((await store.get(key)).toString('utf8')) as T;

interface ExpectedFailure {
  iteration: number;
  stage: StageName;
  type: string;
  nonRetryable: boolean;
  /** Each must match the failure message. */
  message: RegExp[];
  /** Iteration LATEST and `latestCheckpoint` still name; null: the campaign has none. */
  committed: number | null;
}

/**
 * Waits for the campaign to pause itself and checks the failure it recorded, that nothing of
 * the failed iteration is in the store (no manifest, LATEST as before) and that `moerl status`
 * shows the reason. Returns the state and the status text.
 */
async function assertPausedByFailure(
  handle: Handle,
  store: ObjectStore,
  expected: ExpectedFailure,
): Promise<{ state: CampaignState; status: string; history: string }> {
  const id = handle.workflowId;
  const state = await waitForState(
    handle,
    'the campaign to pause itself',
    (s) => s.status === 'paused',
    120_000,
  );
  const f = state.lastFailure;
  assert.ok(f, 'lastFailure is recorded');
  diagnostic(f);
  assert.equal(f.iteration, expected.iteration, f.message);
  assert.equal(f.stage, expected.stage, f.message);
  assert.equal(f.type, expected.type, f.message);
  assert.equal(f.nonRetryable, expected.nonRetryable, f.message);
  for (const pattern of expected.message) assert.match(f.message, pattern);
  assert.equal(
    state.pauseReason,
    `${expected.stage} of iteration ${expected.iteration} failed: ${f.message}`,
  );
  assert.deepEqual(state.activeStages, []);

  // Nothing of the failed iteration is committed.
  const failedCheckpoint = keys.checkpointKey(id, expected.iteration);
  assert.equal(await store.head(`${failedCheckpoint}/${keys.manifestName}`), null, 'no manifest');
  if (expected.committed === null) {
    assert.equal(state.latestCheckpoint, null);
    assert.equal(state.committedIteration, -1);
    assert.equal(await store.head(keys.latestKey(id)), null, 'no LATEST');
  } else {
    assert.equal(state.committedIteration, expected.committed);
    assert.equal(state.latestCheckpoint?.iteration, expected.committed);
    assert.deepEqual(await readJson<CheckpointRef>(store, keys.latestKey(id)), state.latestCheckpoint);
  }

  // `moerl status` shows the pause and its reason.
  const r = await cli('status', id);
  assert.equal(r.code, 0, r.stderr);
  const status = r.stdout;
  const head = `${expected.stage} of iteration ${expected.iteration}`;
  assert.match(status, new RegExp(`^status +paused: ${head} failed: `, 'm'));
  assert.match(status, new RegExp(`^last failure +${head} at .*: ${expected.type}: `, 'm'));
  assert.ok(status.includes(f.message.split('\n')[0] as string), status);
  // `moerl history` lists the failure under its iteration and stage.
  const history = await assertHistoryShows(id, f);
  return { state, status, history };
}

/** `moerl history` lists the failure of the stage with its type and (first line of) message. */
async function assertHistoryShows(id: string, failure: StageFailure): Promise<string> {
  const r = await cli('history', id);
  assert.equal(r.code, 0, r.stderr);
  // One line per failed activity (a rollout has one per shard); one of them is this failure.
  const prefix = `  iteration ${failure.iteration} ${failure.stage} `;
  const message = (failure.message.split('\n')[0] as string).slice(0, 200);
  const lines = r.stdout.split('\n').filter((l) => l.startsWith(prefix));
  assert.ok(
    lines.some((l) => l.includes(`${failure.type}: `) && l.includes(message)),
    `the failure in:\n${r.stdout}`,
  );
  // Failed once, not retried: non-retryable, or (unreachable store) a single attempt allowed.
  const json = await cli('history', id, '--json');
  const history = JSON.parse(json.stdout) as CampaignHistory;
  const stage = history.iterations.find((it) => it.iteration === failure.iteration)?.stages[failure.stage];
  assert.equal(stage?.attempts, 1, json.stdout);
  return r.stdout;
}

async function resumeAndComplete(
  handle: Handle,
  iterations: number,
  store: ObjectStore = openStore(storeLocation()),
): Promise<void> {
  const r = await cli('resume', handle.workflowId);
  assert.equal(r.code, 0, r.stderr);
  const result = await handle.result();
  assert.equal(result.status, 'completed');
  assert.equal(result.committedIteration, iterations);
  const latest = await readJson<CheckpointRef>(store, keys.latestKey(handle.workflowId));
  assert.equal(latest.iteration, iterations);
}

describe('bad input: each failure pauses the campaign, commits nothing, and says what is wrong', () => {
  // Campaign A: one committed GRPO iteration that the fork cases start from.
  let source: Promise<CheckpointRef> | undefined;
  const sourceCheckpoint = () =>
    (source ??= withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(workerDeps()),
      async (queues) => {
        const handle = await startCampaign(t.client, tinySpec('fork-source'), queues);
        const result = await handle.result();
        assert.equal(result.committedIteration, 1);
        assert.ok(result.latestCheckpoint);
        return result.latestCheckpoint;
      },
    ));

  /** Forks from A's checkpoint 1 with `damage` applied to it; `repair` undoes it before the resume. */
  async function forkFromDamaged(
    name: string,
    damage: (store: ObjectStore, ref: CheckpointRef) => Promise<() => Promise<void>>,
    expect: (ref: CheckpointRef) => RegExp[],
  ) {
    const ref = await sourceCheckpoint();
    const store = openStore(storeLocation());
    const sourceLatest = (await store.get(keys.latestKey(ref.campaignId))).toString('utf8');
    const repair = await damage(store, ref);
    try {
      await withWorkers(t.nativeConnection, t.namespace, createActivities(workerDeps()), async (queues) => {
        const handle = await startCampaign(t.client, tinySpec(name, { iterations: 2 }), queues, {
          forkFrom: ref,
        });
        const { state } = await assertPausedByFailure(handle, store, {
          iteration: 1,
          stage: 'prepare',
          type: 'BadInput',
          nonRetryable: true,
          message: expect(ref),
          committed: null,
        });
        assert.equal(state.retries.prepare, 1, 'one failure');
        assert.equal(await store.head(keys.checkpointKey(handle.workflowId, 1) + '/dense.safetensors'), null);
        assert.equal((await store.get(keys.latestKey(ref.campaignId))).toString('utf8'), sourceLatest);
        await repair();
        await resumeAndComplete(handle, 2);
      });
    } finally {
      await repair();
    }
  }

  test('1. a corrupted checkpoint file: the fork fails its checksum check', async () => {
    await forkFromDamaged(
      'corrupt-checkpoint',
      async (store, ref) => {
        const key = `${ref.key}/dense.safetensors`;
        const original = await store.get(key);
        const damaged = Buffer.from(original);
        damaged.write('garbage!', Math.floor(damaged.length / 2), 'latin1');
        await store.put(key, damaged);
        return () => store.put(key, original);
      },
      (ref) => [
        new RegExp(`checkpoint file ${ref.key}/dense\\.safetensors is corrupt`),
        /sha256 [0-9a-f]{64}; the manifest says \d+ bytes, sha256 [0-9a-f]{64}/,
      ],
    );
  });

  test('2. a missing checkpoint file: the fork names the missing key', async () => {
    await forkFromDamaged(
      'missing-checkpoint-file',
      async (store, ref) => {
        const key = `${ref.key}/experts-rank1.safetensors`;
        const original = await store.get(key);
        await store.delete(key);
        return () => store.put(key, original);
      },
      (ref) => [
        new RegExp(
          `^checkpoint file ${ref.key}/experts-rank1\\.safetensors is missing: the manifest lists it \\(\\d+ bytes\\), fs:.* has no such object$`,
        ),
      ],
    );
  });

  test('3. a malformed rollout line: the reward stage names the key and line; resume regenerates the chunk', async () => {
    const store = openStore(storeLocation());
    const real = createActivities(workerDeps());
    let corrupt = true;
    let original: Buffer | undefined;
    // Test wrapper around the real rollout: once it has stored shard 0, its chunk 0 gains a broken line.
    const testCorruptingRolloutShard: CampaignActivities['rolloutShard'] = async (input) => {
      const out = await real.rolloutShard(input);
      if (corrupt && input.shard === 0) {
        const key = keys.rolloutChunkKey(input.campaignId, input.iteration, 0, 0);
        original = await store.get(key);
        await store.put(key, Buffer.concat([original, Buffer.from('{"prompt_id": 0, "text": \n')]));
      }
      return out;
    };
    await withWorkers(
      t.nativeConnection,
      t.namespace,
      { ...real, rolloutShard: testCorruptingRolloutShard },
      async (queues) => {
        const handle = await startCampaign(t.client, tinySpec('malformed-rollout'), queues);
        const chunk = keys.rolloutChunkKey(handle.workflowId, 1, 0, 0);
        // chunk 0 of shard 0 holds 2 prompts × 4 samples: the appended line is line 9.
        await assertPausedByFailure(handle, store, {
          iteration: 1,
          stage: 'reward',
          type: 'BadInput',
          nonRetryable: true,
          message: [new RegExp(`malformed rollout: ${chunk} line 9: `)],
          committed: 0,
        });
        assert.equal(await store.head(keys.rewardKey(handle.workflowId, 1, 0)), null, 'no rewards written');
        // Nothing is repaired by hand: on resume the rollout runs again, finds chunk 0 broken
        // and regenerates it (sampling is seeded, so it is the chunk that was lost).
        corrupt = false;
        await resumeAndComplete(handle, 1);
        assert.deepEqual(await store.get(chunk), original);
      },
    );
  });

  test('4. an unknown task: moe_generate exits 2, the rollout fails with its stderr; the CLI rejects the spec', async () => {
    const store = openStore(storeLocation());
    const spec = tinySpec('unknown-task');
    // Past validation, as a spec from an older or newer moerl could be.
    (spec.task as { builtin: string }).builtin = 'chess';
    await withWorkers(t.nativeConnection, t.namespace, createActivities(workerDeps()), async (queues) => {
      const handle = await startCampaign(t.client, spec, queues);
      const { state } = await assertPausedByFailure(handle, store, {
        iteration: 1,
        stage: 'rollout',
        type: 'BadInput',
        nonRetryable: true,
        message: [/^moe_generate \(rollout of iteration 1 shard [01]\) exited with code 2: /, /chess/],
        committed: 0,
      });
      assert.equal(state.retries.rollout, 2, 'each shard failed once');
      assert.equal(await store.head(keys.rolloutChunkKey(handle.workflowId, 1, 0, 0)), null);
      // The task of a running campaign cannot be changed: stop it, keeping checkpoint 0.
      await handle.cancel();
      await assert.rejects(handle.result());
    });

    const yaml = join(dir, 'chess.yaml');
    writeFileSync(
      yaml,
      [
        'name: chess',
        'task: { builtin: chess }',
        'model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 }',
        'iterations: 1',
        'promptsPerIteration: 4',
        'groupSize: 2',
        'rolloutShards: 1',
        'chunkSize: 2',
        'epWorldSize: 2',
        'seed: 1',
      ].join('\n'),
    );
    const r = await cli('start', yaml);
    assert.equal(r.code, 1, r.stderr);
    assert.equal(r.stdout, '');
    // The one thing wrong is named: the field, the value and what is allowed.
    assert.match(
      r.stderr,
      /^moerl: .*chess\.yaml is invalid:\n {2}- .*chess\.yaml:2:1: task\.builtin: got "chess"; /,
    );
    assert.match(r.stderr, /"add"\|"sort"\|"reverse"\n$/);
    assert.equal(r.stderr.split('\n').length, 3, r.stderr);
  });

  test('5. a trainer rank exits 2: the update fails naming the rank', async () => {
    const store = openStore(storeLocation());
    const real = createActivities(workerDeps());
    let truncate = true;
    let restore: (() => Promise<void>) | undefined;
    // Test wrapper around the real update: first it drops the last line of a rewards file.
    const testTruncatingUpdatePolicy: CampaignActivities['updatePolicy'] = async (input) => {
      if (truncate) {
        const key = keys.rewardKey(input.campaignId, input.iteration, 0);
        const original = await store.get(key);
        const lines = original.toString('utf8').split('\n').filter(Boolean);
        await store.put(key, lines.slice(0, -1).join('\n') + '\n');
        restore = () => store.put(key, original);
      }
      return real.updatePolicy(input);
    };
    await withWorkers(
      t.nativeConnection,
      t.namespace,
      { ...real, updatePolicy: testTruncatingUpdatePolicy },
      async (queues) => {
        const handle = await startCampaign(t.client, tinySpec('rank-exits-2'), queues);
        const { state, history } = await assertPausedByFailure(handle, store, {
          iteration: 1,
          stage: 'update',
          type: 'BadInput',
          nonRetryable: true,
          message: [/^update of iteration 1: rank [01] of 2 exited with code 2: /, /no reward for prompt/],
          committed: 0,
        });
        assert.equal(state.retries.update, 1, 'one failure');
        assert.match(history, /rank [01] of 2 exited with code 2/);
        truncate = false;
        assert.ok(restore);
        await restore();
        await resumeAndComplete(handle, 1);
      },
    );
  });

  test('6. an unreachable store: prepare runs out of attempts and the campaign pauses', async () => {
    const spec = tinySpec('unreachable-store', {
      store: {
        kind: 's3',
        bucket: 'moerl-unreachable',
        endpoint: 'http://127.0.0.1:1',
        forcePathStyle: true,
      },
      orchestration: { updateMaxAttempts: 1 },
    });
    // Fail fast: one try per request, a short connect limit; credentials so none are looked up.
    const s3: S3StoreOptions = {
      credentials: { accessKeyId: 'test-access-key', secretAccessKey: 'test-secret-key' },
      maxAttempts: 1,
      connectTimeoutMs: 1_000,
      idleTimeoutMs: 2_000,
    };
    const deps = workerDeps({ openStore: (location) => openStore(location, { s3 }) });
    await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
      const handle = await startCampaign(t.client, spec, queues);
      const state = await waitForState(
        handle,
        'the campaign to pause itself',
        (s) => s.status === 'paused',
        120_000,
      );
      const f = state.lastFailure;
      assert.ok(f);
      diagnostic(f);
      assert.equal(f.stage, 'prepare');
      assert.equal(f.iteration, 0);
      assert.equal(f.nonRetryable, false, 'retryable: the store may come back');
      assert.equal(f.type, 'StoreUnavailableError');
      assert.match(
        f.message,
        /^s3:\/\/moerl-unreachable\/ \(region us-east-1, endpoint http:\/\/127\.0\.0\.1:1\): campaigns\//,
      );
      assert.match(f.message, /cannot reach the endpoint/);
      assert.doesNotMatch(f.message, /test-secret-key/);
      assert.equal(state.latestCheckpoint, null);
      assert.equal(state.committedIteration, -1);
      const status = await cli('status', handle.workflowId);
      assert.equal(status.code, 0, status.stderr);
      assert.match(
        status.stdout,
        /^status +paused: prepare of iteration 0 failed: s3:\/\/moerl-unreachable\/.*cannot reach the endpoint/m,
      );
      assert.match(status.stdout, /^last failure +prepare of iteration 0 at .*: StoreUnavailableError: /m);
      await assertHistoryShows(handle.workflowId, f);
      await handle.terminate('test over');
    });
  });

  describe('on an S3-compatible server', () => {
    let gw: Versitygw;
    before(async () => {
      gw = await startVersitygw();
    });
    after(async () => {
      await gw?.stop();
    });
    const locationOf = (bucket: string): StoreLocation => ({
      kind: 's3',
      bucket,
      prefix: 'bad-input',
      region: gw.region,
      endpoint: gw.endpoint,
      forcePathStyle: true,
    });
    const storeName = (bucket: string) =>
      new RegExp(`^s3://${bucket}/bad-input/ \\(region ${gw.region}, endpoint ${gw.endpoint}\\): `);

    test('7. S3 credentials rejected: prepare fails at once, naming the store and never the secret', async () => {
      const bucket = await gw.createBucket();
      const location = locationOf(bucket);
      const good = { accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey };
      const wrongSecret = randomBytes(24).toString('base64url');
      let credentials = { ...good, secretAccessKey: wrongSecret };
      const deps = workerDeps(
        { openStore: (loc) => openStore(loc, { s3: { credentials: { ...credentials }, maxAttempts: 2 } }) },
        rankCredentials(gw),
      );
      const store = openStore(location, { s3: { credentials: good } });
      await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
        const handle = await startCampaign(t.client, tinySpec('s3-auth', { store: location }), queues);
        const { state, status, history } = await assertPausedByFailure(handle, store, {
          iteration: 0,
          stage: 'prepare',
          type: 'StoreAuth',
          nonRetryable: true,
          message: [storeName(bucket), /credentials missing or rejected/],
          committed: null,
        });
        for (const text of [state.lastFailure!.message, status, history]) {
          assert.ok(!text.includes(wrongSecret), 'the wrong secret is not shown');
          assert.ok(!text.includes(gw.secretKey), 'the real secret is not shown');
        }
        // With the right credentials, the same campaign goes on from where it stopped.
        credentials = good;
        await resumeAndComplete(handle, 1, store);
      });
    });

    test('8. a bucket that does not exist: prepare fails at once; created, the campaign resumes', async () => {
      const bucket = `moerl-absent-${randomBytes(3).toString('hex')}`;
      const location = locationOf(bucket);
      const s3: S3StoreOptions = {
        credentials: { accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey },
      };
      const deps = workerDeps({ openStore: (loc) => openStore(loc, { s3 }) }, rankCredentials(gw));
      const store = openStore(location, { s3 });
      await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
        const handle = await startCampaign(t.client, tinySpec('s3-no-bucket', { store: location }), queues);
        const failure = {
          iteration: 0,
          stage: 'prepare' as const,
          type: 'StoreError',
          nonRetryable: true,
          message: [storeName(bucket), /the bucket does not exist/],
        };
        const state = await waitForState(
          handle,
          'the campaign to pause itself',
          (s) => s.status === 'paused',
          120_000,
        );
        assert.ok(state.lastFailure);
        await gw.createBucket(bucket);
        await assertPausedByFailure(handle, store, { ...failure, committed: null });
        await resumeAndComplete(handle, 1, store);
      });
    });
  });
});
