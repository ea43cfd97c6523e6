// `moerl status` shows the attempt and last failure of activities the server is retrying, so a
// retry loop (a shard timing out again and again) is visible instead of a plain "running".
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { WorkflowExecutionDescription } from '@temporalio/client';
import { statusText } from '../../cli/commands/status.js';
import { initialState } from '../../workflows/state.js';
import { testSpec } from '../support/campaign-harness.js';

describe('status: running stages with their attempts (fake description)', () => {
  const spec = testSpec();
  const state = {
    ...initialState({ campaignId: 'c-1', spec, taskQueues: { control: 'c', rollout: 'r', train: 't' } }),
    activeStages: [{ iteration: 1, stage: 'rollout' as const, startedAt: new Date(0).toISOString() }],
  };
  const described = (pendingActivities: unknown[]) =>
    ({
      status: { name: 'RUNNING' },
      memo: { spec },
      raw: { pendingActivities },
    }) as unknown as WorkflowExecutionDescription;

  it('a retried shard shows its attempt and the last failure', () => {
    const text = statusText(
      state,
      described([
        {
          activityId: '3',
          activityType: { name: 'rolloutShard' },
          attempt: 8,
          lastFailure: { message: 'activity Heartbeat timeout', timeoutFailureInfo: {} },
        },
        { activityId: '4', activityType: { name: 'rolloutShard' }, attempt: 1 },
      ]),
    );
    const attempts = text.split('\n').filter((l) => l.startsWith('attempt'));
    assert.equal(attempts.length, 1, text);
    assert.match(
      attempts[0]!,
      /rolloutShard \(activity 3\) attempt 8; last failure: activity Heartbeat timeout/,
    );
  });

  it('first attempts without failures add nothing', () => {
    const text = statusText(
      state,
      described([{ activityId: '4', activityType: { name: 'rolloutShard' }, attempt: 1 }]),
    );
    assert.ok(!/^attempt/m.test(text), text);
  });
});
