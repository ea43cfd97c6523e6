// A rollout worker's rank capacity: where it comes from (the setting, the flag, the CPUs a
// cgroup allows), how rank slots are shared by shards, and a shard whose rolloutEpWorldSize
// exceeds it failing at once, not retried.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import { createActivities } from '../../activities/index.js';
import type { ActivityDeps } from '../../activities/index.js';
import { RankSlots, cpusAvailable, rolloutRankCapacity } from '../../activities/rollout-capacity.js';
import type { RolloutShardInput } from '../../activities/types.js';
import { parseWorkerArgs } from '../../workers/main.js';
import { testSpec } from '../support/campaign-harness.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-rollout-capacity-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function cpuMax(text: string): string {
  const file = join(dir, `cpu.max-${text.replace(/\W/g, '_')}`);
  writeFileSync(file, `${text}\n`);
  return file;
}

describe('rollout rank capacity', () => {
  test('default: the CPUs of the affinity, bounded by a cgroup v2 CPU limit rounded down', () => {
    const cpus = availableParallelism();
    assert.equal(cpusAvailable(join(dir, 'absent')), cpus, 'no cgroup file');
    assert.equal(cpusAvailable(cpuMax('max 100000')), cpus, 'no limit');
    assert.equal(cpusAvailable(cpuMax('150000 100000')), 1, '1.5 CPUs');
    assert.equal(cpusAvailable(cpuMax('10000 100000')), 1, '100m still runs one rank');
    assert.equal(cpusAvailable(cpuMax(`${(cpus + 8) * 100000} 100000`)), cpus, 'the affinity is smaller');
  });

  test('the setting, else the CPUs; a bad value names the setting', () => {
    assert.equal(
      rolloutRankCapacity('16', 'X', () => 2),
      16,
    );
    assert.equal(
      rolloutRankCapacity(undefined, 'X', () => 3),
      3,
    );
    assert.equal(
      rolloutRankCapacity('', 'X', () => 3),
      3,
    );
    for (const bad of ['0', '1.5', 'four', '5000'])
      assert.throws(
        () => rolloutRankCapacity(bad, 'MOERL_ROLLOUT_RANKS', () => 2),
        new RegExp(`MOERL_ROLLOUT_RANKS must be a whole number of ranks from 1 to 4096, got "${bad}"`),
      );
  });

  test('the worker takes --rollout-ranks over MOERL_ROLLOUT_RANKS', () => {
    assert.equal(parseWorkerArgs(['--rollout-ranks', '8'], { MOERL_ROLLOUT_RANKS: '4' }).rolloutRanks, 8);
    assert.equal(parseWorkerArgs([], { MOERL_ROLLOUT_RANKS: '4' }).rolloutRanks, 4);
    assert.throws(
      () => parseWorkerArgs(['--rollout-ranks', 'all'], {}),
      /--rollout-ranks \(MOERL_ROLLOUT_RANKS\)/,
    );
  });
});

describe('rank slots', () => {
  test('shards wait for their ranks in order; a release serves the next that fits', async () => {
    const slots = new RankSlots(4);
    const order: string[] = [];
    const take = (name: string, ranks: number) =>
      slots.acquire(ranks).then((release) => (order.push(name), release!));
    const a = await take('a', 2);
    const b = await take('b', 2);
    const c = take('c', 4);
    const d = take('d', 1); // fits in no free slot, and waits behind c anyway
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(order, ['a', 'b']);
    assert.equal(slots.inUse, 4);
    a();
    a(); // giving back twice gives back once
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(order, ['a', 'b'], 'c needs all 4: d does not overtake it');
    b();
    (await c)();
    (await d)();
    assert.deepEqual(order, ['a', 'b', 'c', 'd']);
    assert.equal(slots.inUse, 0);
    assert.throws(() => void slots.acquire(5), /5 rank slots asked of a capacity of 4/);
  });

  test('an aborted wait gives up its place and yields null', async () => {
    const slots = new RankSlots(2);
    const held = (await slots.acquire(2))!;
    const stop = new AbortController();
    const big = slots.acquire(2, stop.signal);
    const stopSmall = new AbortController();
    const small = slots.acquire(1, stopSmall.signal);
    stop.abort();
    assert.equal(await big, null);
    held();
    const release = await small;
    assert.ok(release, 'the waiter behind the aborted one was served');
    assert.equal(slots.inUse, 1);
    assert.equal(await slots.acquire(1, stop.signal), null, 'already aborted');
  });
});

describe('rolloutShard (fake deps)', () => {
  test('rolloutEpWorldSize above the worker capacity fails at once, not retried, naming what to change', async () => {
    const touched: string[] = [];
    const store = new Proxy({}, { get: (_, name) => (touched.push(String(name)), undefined) });
    const deps = {
      openStore: () => store,
      workerId: 'host/1/abc',
      rolloutRanks: new RankSlots(2),
    } as unknown as ActivityDeps;
    const spec = testSpec({
      rolloutEpWorldSize: 4,
      model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 },
    });
    const input: RolloutShardInput = {
      campaignId: 'c',
      iteration: 3,
      shard: 1,
      spec,
      policy: { iteration: 2, key: 'k' } as RolloutShardInput['policy'],
      promptStart: 2,
      promptCount: 2,
      hyperparameters: spec.hyperparameters,
    };
    const env = new MockActivityEnvironment();
    await assert.rejects(env.run(createActivities(deps).rolloutShard, input), (err: unknown) => {
      assert.ok(err instanceof ApplicationFailure, String(err));
      assert.equal(err.type, 'RolloutRanksExceedCapacity');
      assert.equal(err.nonRetryable, true);
      assert.match(
        err.message,
        /iteration 3 shard 1 needs rolloutEpWorldSize 4 moe_generate ranks at once, but rollout worker host\/1\/abc runs at most 2 \(MOERL_ROLLOUT_RANKS or --rollout-ranks;.*MOERL_ROLLOUT_RANKS=4/,
      );
      return true;
    });
    assert.deepEqual(touched, [], 'nothing was read from the store');
  });
});
