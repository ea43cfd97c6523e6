// What `moerl status`, `history` and `watch` print to a terminal: reasons given with --reason,
// failure messages and the rank log tails inside them come from people and programs the CLI's
// user does not control, so control characters (terminal escapes, carriage returns, bells, C1
// codes) and invisible formatting characters (bidi overrides) are not printed as they are.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { WorkflowExecutionDescription } from '@temporalio/client';
import { historyText } from '../../cli/commands/history.js';
import { statusText } from '../../cli/commands/status.js';
import { outcomeLine } from '../../cli/commands/watch.js';
import type { CampaignHistory } from '../../cli/history.js';
import { progressLine, snapshotOf } from '../../cli/progress.js';
import { initialState } from '../../workflows/state.js';
import type { CampaignState } from '../../workflows/types.js';
import { testSpec } from '../support/campaign-harness.js';

/** Clears the screen, retitles the window, rings, returns the cursor, reverses text, CSI by C1. */
const hostile = 'ok\x1b[2J\x1b]0;pwned\x07\r\u202eevil\x9b31m\x00 end';
const controls = /[\p{Cc}\p{Cf}]/u;

/** Each printed line is free of control and formatting characters (line breaks apart). */
function assertPrintable(text: string, what: string) {
  for (const line of text.split('\n'))
    assert.ok(!controls.test(line), `${what} printed ${JSON.stringify(line)}`);
  assert.ok(text.includes('ok'), what);
}

const spec = testSpec();

function hostileState(): CampaignState {
  const state = initialState({
    campaignId: 'c-1',
    spec: { ...spec, name: `name ${hostile}` },
    taskQueues: { control: 'c', rollout: 'r', train: 't' },
  });
  state.status = 'paused';
  state.pauseReason = `update failed for good: rank 1 exited 1: ${hostile}`;
  state.hyperparameterChanges.push({
    iteration: 2,
    changes: { temperature: 0.8 },
    reason: hostile,
    at: new Date(0).toISOString(),
  });
  state.validations = [
    {
      iteration: 0,
      k: 1,
      prompts: 1,
      meanReward: 0,
      passAtK: 0,
      bySource: {
        [hostile]: { prompts: 1, meanReward: 0, passAtK: 0 },
        b: { prompts: 0, meanReward: 0, passAtK: 0 },
      },
    },
  ];
  state.lastFailure = {
    iteration: 1,
    stage: 'update',
    message: `rank 0 exited 1: ${hostile} | ${hostile}`,
    type: 'RankFailed',
    nonRetryable: false,
    at: new Date(0).toISOString(),
  };
  state.activeStages.push({ iteration: 1, stage: 'update', startedAt: new Date(0).toISOString() });
  return state;
}

const description = {
  status: { name: 'RUNNING' },
  memo: { spec },
  raw: {
    pendingActivities: [
      {
        activityId: '9',
        activityType: { name: 'updatePolicy' },
        attempt: 2,
        lastFailure: { message: `rank 0: ${hostile}`, applicationFailureInfo: { type: `T${hostile}` } },
      },
    ],
  },
} as unknown as WorkflowExecutionDescription;

describe('terminal output holds no control characters from reasons and failure messages', () => {
  it('moerl status', () => {
    assertPrintable(statusText(hostileState(), description), 'status');
  });

  it('moerl watch: the live line and the last line', () => {
    const state = hostileState();
    assertPrintable(progressLine(snapshotOf(state, description, spec)), 'watch (paused)');
    state.status = 'running';
    assertPrintable(progressLine(snapshotOf(state, description, spec)), 'watch (running, attempt 2)');
    assertPrintable(
      outcomeLine('c-1', { outcome: `failed: ${hostile}`, execution: 'failed', state, iterations: [] }),
      'watch (outcome)',
    );
  });

  it('moerl history', () => {
    const history: CampaignHistory = {
      campaignId: 'c-1',
      runs: ['r'],
      runSpans: [],
      iterations: [
        {
          iteration: 1,
          stages: {
            update: {
              seconds: 3,
              attempts: 2,
              activities: 1,
              failures: [`attempt 1: RankFailed: ${hostile}`],
              running: false,
            },
          },
          meanReward: 0.5,
          checkpoint: null,
          hyperparameterChanges: [],
          passRate: null,
          rewardFailures: { samples: 3, byReason: { timeout: 2, exception: 1 } },
          samples: null,
          tokens: null,
          rolloutTokensPerSecond: null,
          chunksRedone: null,
          episodes: null,
          trainMetrics: null,
          validation: {
            iteration: 1,
            k: 4,
            prompts: 3,
            meanReward: 0.25,
            passAtK: 2 / 3,
            bySource: {
              [`gsm8k${hostile}`]: { prompts: 2, meanReward: 0.375, passAtK: 1 },
              other: { prompts: 1, meanReward: 0, passAtK: 0 },
            },
          },
        },
      ],
      hyperparameterChanges: [
        { iteration: 2, changes: { temperature: 0.8 }, reason: hostile, at: new Date(0).toISOString() },
      ],
      pauses: [],
    };
    const text = historyText(history);
    assertPrintable(text, 'history');
    assert.match(
      text,
      /reward function failures:\n {2}iteration 1: 3 samples scored 0 \(timeout=2 exception=1\)/,
    );
    assert.match(
      text,
      /validation:\n {2}checkpoint 1: mean reward 0\.250, pass@4 0\.667 over 3 prompts; by data_source \(mean reward \/ pass@4\): gsm8k.* 0\.375 \/ 1\.000, other 0\.000 \/ 0\.000/,
    );
  });
});
