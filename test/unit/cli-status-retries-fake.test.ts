// `moerl status` counts retries the server is making right now, not only those of activities
// that finished: the workflow learns an activity's attempt only when it returns, so while a lost
// worker's shards were retried (attempt 2 on the server) the retries line said "none".
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { WorkflowExecutionDescription } from '@temporalio/client';
import { retriesNow, statusText } from '../../cli/commands/status.js';
import { initialState } from '../../workflows/state.js';
import { testSpec } from '../support/campaign-harness.js';

describe('status: retries include attempts the server is retrying (fake description)', () => {
  const spec = testSpec();
  const fresh = () =>
    initialState({ campaignId: 'c-1', spec, taskQueues: { control: 'c', rollout: 'r', train: 't' } });
  const described = (pendingActivities: unknown[]) =>
    ({
      status: { name: 'RUNNING' },
      memo: { spec },
      raw: { pendingActivities },
    }) as unknown as WorkflowExecutionDescription;
  const heartbeatTimeout = { message: 'activity Heartbeat timeout', timeoutFailureInfo: {} };
  const retriesLine = (text: string) => text.split('\n').find((l) => l.startsWith('retries'));

  it('two shards of a lost worker at attempt 2, none finished yet: rollout 2', () => {
    const description = described([
      { activityId: '3', activityType: { name: 'rolloutShard' }, attempt: 2, lastFailure: heartbeatTimeout },
      { activityId: '4', activityType: { name: 'rolloutShard' }, attempt: 2, lastFailure: heartbeatTimeout },
    ]);
    assert.match(retriesLine(statusText(fresh(), description)) ?? '', /^retries\s+rollout 2$/);
  });

  it('adds to what the workflow counted, per stage', () => {
    const state = fresh();
    state.retries.rollout = 1;
    state.retries.update = 2;
    const description = described([
      { activityId: '7', activityType: { name: 'rolloutShard' }, attempt: 3, lastFailure: heartbeatTimeout },
      { activityId: '6', activityType: { name: 'updatePolicy' }, attempt: 1 },
      {
        activityId: '9',
        activityType: { name: 'commitCheckpoint' },
        attempt: 2,
        lastFailure: heartbeatTimeout,
      },
    ]);
    assert.deepEqual(retriesNow(state, description), {
      prepare: 0,
      rollout: 3,
      reward: 0,
      update: 2,
      checkpoint: 1,
      validation: 0,
    });
    assert.match(
      retriesLine(statusText(state, description)) ?? '',
      /^retries\s+rollout 3, update 2, checkpoint 1$/,
    );
    assert.equal(state.retries.rollout, 1, 'the campaign state itself is left as the workflow reported it');
  });

  it('first attempts and activities of unknown types add nothing', () => {
    const description = described([
      { activityId: '4', activityType: { name: 'rolloutShard' }, attempt: 1 },
      { activityId: '5', activityType: { name: 'somethingElse' }, attempt: 4 },
      { activityId: '6' },
    ]);
    assert.match(retriesLine(statusText(fresh(), description)) ?? '', /^retries\s+none$/);
  });
});
