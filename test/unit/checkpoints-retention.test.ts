// Retention never removes a checkpoint an in-flight or carried rollout phase samples from:
// the commit keeps `protectIterations`, and the activity passes CheckpointInput's on.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { MockActivityEnvironment } from '@temporalio/testing';
import { commitCheckpoint, fetchCheckpoint, stageCheckpoint } from '../../activities/checkpoints.js';
import type { ActivityDeps } from '../../activities/index.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { FsStore } from '../../activities/store/index.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CheckpointInput, CheckpointOutput, CheckpointRef } from '../../activities/types.js';
import { testSpec } from '../support/campaign-harness.js';
import { writeLocalCheckpoint } from '../support/checkpoint-fixtures.js';

const roots: string[] = [];
function freshRoot(): string {
  const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-retention-'));
  roots.push(root);
  return root;
}
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

const id = 'c1';

async function stage(store: ObjectStore, root: string, iteration: number) {
  const dir = join(root, `local-${iteration}`);
  writeLocalCheckpoint(dir, { worldSize: 1 });
  return stageCheckpoint(store, dir, id, iteration);
}

async function committed(store: ObjectStore): Promise<number[]> {
  const out = new Set<number>();
  for await (const o of store.list(`${keys.checkpointsPrefix(id)}/`))
    if (o.key.endsWith('/manifest.json')) out.add(keys.checkpointIterationOf(o.key)!);
  return [...out].sort((a, b) => a - b);
}

describe('retention and rollouts still sampling', () => {
  test('retention never removes a checkpoint an in-flight rollout samples from (keepLast 1, staleness 1)', async () => {
    const root = freshRoot();
    const store = new FsStore(join(root, 'store'));
    const refs: CheckpointRef[] = [];
    const base = { meanReward: null, keepLast: 1, keepBest: false, keepIteration: 0, now: new Date() };
    refs[0] = (await commitCheckpoint(store, await stage(store, root, 0), base)).checkpoint;
    for (let i = 1; i <= 4; i++) {
      // Staleness 1: while update i ran, rollout i+1 sampled from checkpoint i-1, and may still.
      const out = await commitCheckpoint(store, await stage(store, root, i), {
        ...base,
        protectIterations: [i - 1],
      });
      refs[i] = out.checkpoint;
      assert.deepEqual(await committed(store), [...new Set([0, i - 1, i])], `after commit ${i}`);
      await assert.doesNotReject(
        fetchCheckpoint(store, refs[i - 1]!, freshRoot()),
        `checkpoint ${i - 1} readable`,
      );
      assert.deepEqual(out.removed, i >= 3 ? [keys.checkpointKey(id, i - 2)] : []);
    }
  });

  test('retention without protectIterations (older workflow code) keeps only the last, the best and the reference', async () => {
    const root = freshRoot();
    const store = new FsStore(join(root, 'store'));
    const base = { meanReward: null, keepLast: 1, keepBest: false, keepIteration: 0, now: new Date() };
    for (let i = 0; i <= 3; i++) await commitCheckpoint(store, await stage(store, root, i), base);
    assert.deepEqual(await committed(store), [0, 3]);
  });

  test('retention never removes a checkpoint an in-flight rollout samples from: the commitCheckpoint activity passes protectIterations on', async () => {
    const root = freshRoot();
    const store = new FsStore(join(root, 'store'));
    const deps = { openStore: () => store } as unknown as ActivityDeps;
    const activities = createActivities(deps);
    const spec = testSpec({ retention: { keepLast: 1, keepBest: false }, store: { kind: 'fs', path: root } });
    const env = new MockActivityEnvironment();
    const commit = async (i: number, protect?: number[]) => {
      const input: CheckpointInput = {
        campaignId: id,
        spec,
        staged: await stage(store, root, i),
        meanReward: null,
        referenceIteration: 0,
        ...(protect ? { protectIterations: protect } : {}),
      };
      return (await env.run(activities.commitCheckpoint, input)) as CheckpointOutput;
    };
    await commit(0);
    await commit(1);
    await commit(2, [1]);
    assert.deepEqual(await committed(store), [0, 1, 2]);
    const out = await commit(3);
    assert.deepEqual(
      out.removed,
      [keys.checkpointKey(id, 1), keys.checkpointKey(id, 2)],
      'absent: nothing protected',
    );
    assert.deepEqual(await committed(store), [0, 3]);
  });
});
