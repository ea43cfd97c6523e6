// The checkpoint commit is idempotent, as one suite every store backend runs (fs in
// test/unit/checkpoints-commit.test.ts, S3 in test/integration/checkpoints-s3.test.ts): killed
// at any mutating step and retried, it returns the same ref, and LATEST never names a
// checkpoint without its manifest; a committed checkpoint is never mixed with different bytes
// of a re-run. Faults come from a fake wrapper over the real store.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import {
  commitCheckpoint,
  committedCheckpoint,
  fetchCheckpoint,
  sha256Hex,
  stageCheckpoint,
} from '../../activities/checkpoints.js';
import * as keys from '../../activities/layout.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CheckpointRef, StagedCheckpoint } from '../../activities/types.js';
import { FaultyStore, writeLocalCheckpoint } from './checkpoint-fixtures.js';

/**
 * `newStore`: an empty store per call. `atomicCreate`: the backend's createIfAbsent is atomic
 * under concurrency (not versitygw's, docs/store.md), which concurrent commits rely on.
 */
export function checkpointCommitSuite(
  backend: string,
  newStore: () => Promise<ObjectStore>,
  { atomicCreate }: { atomicCreate: boolean },
): void {
  const roots: string[] = [];
  function freshRoot(): string {
    const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-commit-'));
    roots.push(root);
    return root;
  }
  after(() => {
    for (const root of roots) rmSync(root, { recursive: true, force: true });
  });

  const id = 'c1';
  let clock = Date.parse('2030-01-01T00:00:00Z');
  /** Every commit gets a later time, so a rewritten manifest would change its sha256. */
  const opts = (keepLast = 1) => ({
    meanReward: 0.5,
    keepLast,
    keepBest: false,
    keepIteration: 0,
    now: new Date((clock += 1000)),
  });

  async function stage(store: ObjectStore, root: string, iteration: number, worldSize = 2) {
    const dir = join(root, `local-${iteration}-${Math.random().toString(36).slice(2)}`);
    writeLocalCheckpoint(dir, { worldSize });
    return stageCheckpoint(store, dir, id, iteration);
  }

  /**
   * Checkpoints 0, 1, 2 committed (LATEST = 2) and 3 staged, with a stray file from an earlier
   * attempt of another world size under 3's key: committing 3 with keepLast 1 removes the stray
   * file, creates the manifest, moves LATEST and removes 1 and 2.
   */
  async function campaignBefore3(root: string) {
    const store = await newStore();
    const refs: CheckpointRef[] = [];
    for (const it of [0, 1, 2])
      refs.push((await commitCheckpoint(store, await stage(store, root, it), opts(3))).checkpoint);
    await stage(store, root, 3, 3); // the earlier attempt: three expert files
    const staged = await stage(store, root, 3, 2);
    return { store, staged, refs };
  }

  /** LATEST names a checkpoint whose manifest is the committed one and whose files verify. */
  async function assertLatestReadable(store: ObjectStore, what: string): Promise<CheckpointRef> {
    const ref = JSON.parse((await store.get(keys.latestKey(id))).toString()) as CheckpointRef;
    await assert.doesNotReject(
      fetchCheckpoint(store, ref, freshRoot()),
      `${what}: LATEST (${ref.key}) is readable`,
    );
    return ref;
  }

  const manifestOf = async (store: ObjectStore, iteration: number) =>
    (await store.head(`${keys.checkpointKey(id, iteration)}/manifest.json`))
      ? (await store.get(`${keys.checkpointKey(id, iteration)}/manifest.json`)).toString()
      : null;

  async function committedIterations(store: ObjectStore): Promise<number[]> {
    const out: number[] = [];
    for (const it of [0, 1, 2, 3]) if (await manifestOf(store, it)) out.push(it);
    return out;
  }

  async function mutatingCalls(commit: (store: FaultyStore) => Promise<unknown>, store: ObjectStore) {
    const counter = new FaultyStore(store);
    await commit(counter);
    return counter.mutations;
  }

  describe(`checkpoint commit is idempotent (${backend})`, () => {
    test('checkpoint commit is idempotent: killed at each mutating step (fake faulty store), LATEST stays readable and every retry returns the same ref', async () => {
      const probe = await campaignBefore3(freshRoot());
      const calls = await mutatingCalls((s) => commitCheckpoint(s, probe.staged, opts()), probe.store);
      assert.ok(calls.length >= 6, `a commit here makes several mutating calls: ${calls.join(', ')}`);
      for (const mode of ['before', 'after'] as const) {
        for (let n = 1; n <= calls.length; n++) {
          const what = `fault ${mode} call ${n} (${calls[n - 1]})`;
          const { store, staged } = await campaignBefore3(freshRoot());
          const faulty = new FaultyStore(store);
          faulty.failAt = n;
          faulty.mode = mode;
          await assert.rejects(commitCheckpoint(faulty, staged, opts()), /injected fault/, what);
          await assertLatestReadable(store, `${what}, after the failure`);
          const left = await manifestOf(store, 3);

          const first = await commitCheckpoint(store, staged, opts());
          const again = await commitCheckpoint(store, staged, opts());
          assert.deepEqual(
            again.checkpoint,
            first.checkpoint,
            `${what}: a second retry returns the same ref`,
          );
          if (left)
            assert.equal(
              first.checkpoint.manifestSha256,
              sha256Hex(left),
              `${what}: the manifest is never rewritten`,
            );
          assert.equal(first.checkpoint.manifestSha256, sha256Hex((await manifestOf(store, 3))!), what);
          assert.deepEqual(await assertLatestReadable(store, `${what}, after the retry`), first.checkpoint);
          assert.deepEqual(await committedIterations(store), [0, 3], `${what}: retention finished`);
          const under3: string[] = [];
          for await (const o of store.list(`${keys.checkpointKey(id, 3)}/`))
            under3.push(o.key.split('/').pop()!);
          assert.deepEqual(under3, [
            'dense.safetensors',
            'experts-rank0.safetensors',
            'experts-rank1.safetensors',
            'manifest.json',
          ]);
        }
      }
    });

    test('checkpoint commit is idempotent: committing a committed checkpoint again (fake faulty store) never touches its manifest, at any failing step', async () => {
      for (const latestOn of ['it', 'the reference'] as const) {
        const committed3 = async () => {
          const { store, staged, refs } = await campaignBefore3(freshRoot());
          const { checkpoint } = await commitCheckpoint(store, staged, opts());
          // As if the commit was cut before it moved LATEST (the reference is kept by retention).
          if (latestOn === 'the reference') await store.put(keys.latestKey(id), JSON.stringify(refs[0]));
          return { store, staged, checkpoint, text: await manifestOf(store, 3) };
        };
        const probe = await committed3();
        const calls = await mutatingCalls((s) => commitCheckpoint(s, probe.staged, opts()), probe.store);
        for (const mode of ['after', 'before'] as const) {
          for (let n = 1; n <= calls.length; n++) {
            const what = `LATEST on ${latestOn}, fault ${mode} call ${n} (${calls[n - 1]})`;
            const { store, staged, checkpoint, text } = await committed3();
            const faulty = new FaultyStore(store);
            faulty.failAt = n;
            faulty.mode = mode;
            await assert.rejects(commitCheckpoint(faulty, staged, opts()), /injected fault/, what);
            await assertLatestReadable(store, what);
            assert.equal(await manifestOf(store, 3), text, `${what}: the manifest is the first one`);
            assert.deepEqual((await commitCheckpoint(store, staged, opts())).checkpoint, checkpoint, what);
          }
        }
        const expected = latestOn === 'it' ? [] : [`put ${keys.latestKey(id)}`];
        assert.deepEqual(calls, expected, `LATEST on ${latestOn}: the repeat writes no manifest`);
      }
    });

    test(
      'checkpoint commit is idempotent: concurrent commits of one staged checkpoint return the same ref',
      { skip: !atomicCreate && 'createIfAbsent is not atomic here' },
      async () => {
        const { store, staged } = await campaignBefore3(freshRoot());
        const refs = await Promise.all([1, 2, 3, 4].map(() => commitCheckpoint(store, staged, opts())));
        for (const r of refs) assert.deepEqual(r.checkpoint, refs[0]!.checkpoint);
        await assertLatestReadable(store, 'after concurrent commits');
      },
    );

    test('checkpoint commit is idempotent: a re-run with different bytes fails with CheckpointConflict naming the key, and nothing committed changes', async () => {
      const root = freshRoot();
      const { store, staged } = await campaignBefore3(root);
      const { checkpoint } = await commitCheckpoint(store, staged, opts());
      const snapshot = async () => {
        const out: Record<string, string> = {};
        for await (const o of store.list('')) out[o.key] = sha256Hex(await store.get(o.key));
        return out;
      };
      const before = await snapshot();
      const conflict = (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.type, 'CheckpointConflict');
        assert.equal(err.nonRetryable, true);
        assert.match(
          err.message,
          new RegExp(`${keys.checkpointKey(id, 3)} is already committed with other files`),
        );
        assert.match(
          err.message,
          /dense\.safetensors: committed 4096 bytes, sha256 [0-9a-f]{12}…, new 4096 bytes/,
        );
        return true;
      };
      // The re-run's stage must not overwrite the committed files...
      await assert.rejects(stage(store, root, 3), conflict);
      // ...and a commit of other files (uploaded some other way) must not mix them in.
      const other: StagedCheckpoint = {
        ...staged,
        manifest: {
          ...staged.manifest,
          files: staged.manifest.files.map((f) => ({ ...f, sha256: sha256Hex(f.name) })),
        },
      };
      await assert.rejects(commitCheckpoint(store, other, opts()), conflict);
      assert.deepEqual(await snapshot(), before, 'no object changed');
      assert.deepEqual((await commitCheckpoint(store, staged, opts())).checkpoint, checkpoint);
    });

    test('checkpoint commit is idempotent: committedCheckpoint returns the committed ref, null before the commit, and rejects a foreign or incomplete manifest', async () => {
      const root = freshRoot();
      const { store, staged } = await campaignBefore3(root);
      assert.equal(await committedCheckpoint(store, id, 3), null, 'staged is not committed');
      assert.equal(await committedCheckpoint(store, id, 7), null, 'nothing at all');
      const { checkpoint } = await commitCheckpoint(store, staged, opts());
      const got = await committedCheckpoint(store, id, 3);
      assert.deepEqual(got?.ref, checkpoint);
      assert.deepEqual(got?.manifest.files, staged.manifest.files);
      // A stage of a committed, identical checkpoint uploads nothing.
      const counter = new FaultyStore(store);
      const dir = join(root, 'again');
      await fetchCheckpoint(store, checkpoint, dir);
      await stageCheckpoint(counter, join(dir, 'checkpoints', checkpoint.manifestSha256), id, 3);
      assert.deepEqual(counter.mutations, []);

      const key4 = keys.checkpointKey(id, 4);
      await store.put(`${key4}/manifest.json`, (await manifestOf(store, 3))!);
      await assert.rejects(committedCheckpoint(store, id, 4), {
        type: 'BadInput',
        message: `${key4}/manifest.json was committed for campaign c1 iteration 3, not campaign c1 iteration 4`,
      });
      await store.delete(`${keys.checkpointKey(id, 3)}/experts-rank1.safetensors`);
      await assert.rejects(committedCheckpoint(store, id, 3), {
        type: 'BadInput',
        message: `committed checkpoint file ${keys.checkpointKey(id, 3)}/experts-rank1.safetensors is missing; its manifest says 4096 bytes`,
      });
    });
  });
}
