// The spec rejects shapes whose rollout fan-out could pass Temporal's limit of pending
// activities per workflow execution (with staleness k, 1 + k iterations' shards can be in flight).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  SpecError,
  maxPendingActivities,
  maxRolloutShards,
  parseCampaignSpec,
  temporalPendingActivityLimit,
} from '../../workflows/spec.js';
import { validSpecDoc } from '../support/spec-docs.js';

function shape(rolloutShards: number, staleness: number) {
  return {
    ...validSpecDoc(),
    promptsPerIteration: 4096,
    rolloutShards,
    staleness,
    retention: { keepLast: 1 + Math.max(1, staleness), keepBest: true },
  };
}

function problems(doc: unknown): string[] {
  try {
    parseCampaignSpec(doc);
  } catch (err) {
    assert.ok(err instanceof SpecError, `expected SpecError, got ${String(err)}`);
    return err.problems;
  }
  return [];
}

describe('spec: pending activity limit', () => {
  it('counts 1 + k iterations of shards with staleness k', () => {
    assert.equal(maxPendingActivities(32, 1), 66);
    assert.equal(maxPendingActivities(32, 0), 34);
    assert.equal(maxPendingActivities(32, 8), 290);
    assert.equal(maxRolloutShards(1), 999);
    assert.equal(maxRolloutShards(0), 1998);
    assert.equal(maxRolloutShards(8), 222);
    for (const staleness of [0, 1, 4, 8]) {
      assert.ok(maxPendingActivities(maxRolloutShards(staleness), staleness) <= temporalPendingActivityLimit);
      assert.ok(
        maxPendingActivities(maxRolloutShards(staleness) + 1, staleness) > temporalPendingActivityLimit,
      );
    }
  });

  it('accepts the largest shapes that fit and the 48-node shape', () => {
    assert.deepEqual(problems(shape(999, 1)), []);
    assert.deepEqual(problems(shape(1998, 0)), []);
    assert.deepEqual(problems({ ...shape(32, 1), epWorldSize: 8 }), []);
  });

  it('rejects one shard more, naming the field, the count and the largest allowed', () => {
    const stale = problems(shape(1000, 1));
    assert.equal(stale.length, 1, stale.join('\n'));
    assert.match(stale[0]!, /^rolloutShards: got 1000; /);
    assert.match(stale[0]!, /staleness 1 can keep 2002 activities pending/);
    assert.match(stale[0]!, /limit of 2000/);
    assert.match(stale[0]!, /at most 999 shards/);

    const fresh = problems(shape(1999, 0));
    assert.equal(fresh.length, 1, fresh.join('\n'));
    assert.match(fresh[0]!, /staleness 0 can keep 2001 activities pending.*at most 1998 shards/);

    assert.deepEqual(problems(shape(222, 8)), []);
    const deep = problems(shape(223, 8));
    assert.equal(deep.length, 1, deep.join('\n'));
    assert.match(deep[0]!, /staleness 8 can keep 2009 activities pending.*at most 222 shards/);
  });
});
