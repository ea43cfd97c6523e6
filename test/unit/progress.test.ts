// The progress rendering shared by `moerl demo` and `moerl watch`, and the workflow's current
// details, on hand-built states: what each line says for stages in flight, retries, a pause.
import assert from 'node:assert/strict';
import { defaultPayloadConverter } from '@temporalio/common';
import { describe, it } from 'node:test';
import type { WorkflowExecutionDescription } from '@temporalio/client';
import {
  dynamicSamplingText,
  episodesText,
  etaSeconds,
  progressBar,
  progressLine,
  snapshotOf,
} from '../../cli/progress.js';
import { currentDetails, stageKey } from '../../workflows/summaries.js';
import type { CampaignState, IterationSummary } from '../../workflows/types.js';
import { testSpec } from '../support/campaign-harness.js';

function iteration(i: number, stageSeconds: IterationSummary['stageSeconds']): IterationSummary {
  return {
    iteration: i,
    policyIteration: i - 1,
    meanReward: 0.1 * i,
    passRate: 0.1 * i,
    samples: 8,
    tokens: 80,
    rolloutTokensPerSecond: 1234.4,
    chunksRedone: 0,
    stageSeconds,
    attempts: {},
    trainMetrics: {},
  };
}

function state(overrides: Partial<CampaignState> = {}): CampaignState {
  return {
    campaignId: 'c-1',
    name: 'c',
    status: 'running',
    pauseRequested: false,
    pauseReason: null,
    hyperparameters: testSpec().hyperparameters,
    hyperparameterChanges: [],
    nextIteration: 4,
    committedIteration: 2,
    latestCheckpoint: null,
    referenceCheckpoint: null,
    checkpoints: [],
    activeStages: [
      { iteration: 3, stage: 'update', startedAt: '2026-12-01T00:00:00.000Z' },
      { iteration: 4, stage: 'rollout', startedAt: '2026-12-01T00:00:01.000Z' },
      { iteration: 4, stage: 'rollout', startedAt: '2026-12-01T00:00:01.000Z' },
    ],
    retries: { prepare: 0, rollout: 0, reward: 0, update: 0, checkpoint: 0, validation: 0 },
    lastFailure: null,
    recentIterations: [
      iteration(1, { rollout: 2, reward: 1, update: 4, checkpoint: 1 }),
      iteration(2, { rollout: 4, reward: 1, update: 2, checkpoint: 1 }),
    ],
    carriedRollouts: [],
    runs: 1,
    forkedFrom: null,
    ...overrides,
  };
}

const description = (pending: unknown[] = []) =>
  ({
    status: { name: 'RUNNING' },
    raw: { pendingActivities: pending },
  }) as unknown as WorkflowExecutionDescription;

describe('campaign progress rendering', () => {
  it('the ETA: remaining iterations × the sum of stages, or the longer half with staleness 1', () => {
    assert.equal(etaSeconds(state(), 10, 0), 8 * 8);
    assert.equal(etaSeconds(state(), 10, 1), 8 * 5); // max(3, 5) and max(5, 3)
    assert.equal(etaSeconds(state({ status: 'paused' }), 10, 0), null);
    assert.equal(etaSeconds(state({ recentIterations: [] }), 10, 0), null);
  });

  it('stages in flight with the attempt and last failure the server reports', () => {
    const snap = snapshotOf(
      state(),
      description([
        { activityType: { name: 'rolloutShard' }, attempt: 1 },
        {
          activityType: { name: 'rolloutShard' },
          attempt: 3,
          lastFailure: { message: 'spot reclaimed', applicationFailureInfo: { type: 'Error' } },
        },
        { activityType: { name: 'updatePolicy' }, attempt: 1 },
      ]),
      { iterations: 10, staleness: 1 },
    );
    assert.deepEqual(
      snap.inFlight.map((s) => [s.iteration, s.stage, s.activities, s.attempt, s.lastFailure]),
      [
        [3, 'update', 1, 1, null],
        [4, 'rollout', 2, 3, 'Error: spot reclaimed'],
      ],
    );
    assert.equal(
      progressLine(snap),
      `${progressBar(2, 10)} 2/10  update 3, rollout 4 (2 shards) attempt 3 (last failure: Error: spot reclaimed)  reward 0.200  1234 tok/s  ETA 40.0s`,
    );
  });

  it("shards' heartbeats: chunk, samples or episodes done, the furthest turn; a few shown, the rest counted", () => {
    const beat = (shard: number, inChunk?: object) => ({
      activityType: { name: 'rolloutShard' },
      attempt: 1,
      heartbeatDetails: {
        payloads: [
          defaultPayloadConverter.toPayload({
            what: `rollout of iteration 4 shard ${shard}`,
            chunks: 8,
            chunksStored: 3,
            chunksRedone: 0,
            worker: 'w',
            failuresOnLiveWorker: 0,
            ...(inChunk ? { inChunk } : {}),
          }),
        ],
      },
    });
    const snap = snapshotOf(
      state(),
      description([
        beat(0, { chunk: 1, step: 41, steps: 64, tokens: 900, turn: 3 }),
        beat(1),
        beat(2, { chunk: 3, step: 5, steps: 64, tokens: 100 }),
        beat(3),
        {
          activityType: { name: 'rolloutShard' },
          attempt: 1,
          heartbeatDetails: { payloads: [{ data: 'not json' }] },
        },
      ]),
      { iterations: 10, staleness: 1 },
    );
    const rollout = snap.inFlight.find((s) => s.stage === 'rollout')!;
    assert.equal(rollout.shards.length, 4, 'a heartbeat that is not ours is left out');
    assert.match(
      progressLine(snap),
      /rollout 4 \(2 shards\) \[rollout of iteration 4 shard 0: chunk 2\/8, 41\/64 episodes, turn 3; rollout of iteration 4 shard 1: 3\/8 chunks; rollout of iteration 4 shard 2: chunk 4\/8, 5\/64; 1 more\]/,
    );
  });

  it("an iteration of episodes says how many, their turns, tool errors and the tools' share of their time", () => {
    const stats = {
      episodes: 64,
      policyTurns: 147,
      endReasons: { answered: 60, 'max-turns': 4 },
      toolCalls: { calculator: 83 },
      toolErrors: { timeout: 2, 'bad-arguments': 1 },
      toolSeconds: 21,
      generationSeconds: 79,
    };
    assert.equal(episodesText(stats), '64 episodes, 2.3 turns each, 3 tool errors, tools 21% of their time');
  });

  it("dynamic sampling's line says what it drew and what it filtered", () => {
    const d = { rounds: 2, drawnPrompts: 64, groupsWithSignal: 57, filteredGroups: 71 };
    assert.equal(
      dynamicSamplingText(d),
      'drew 64 more prompts in 2 rounds, 57 groups with signal, 71 filtered',
    );
    assert.equal(
      dynamicSamplingText({ ...d, rounds: 0, drawnPrompts: 0, filteredGroups: 3 }),
      '57 groups with signal, 3 filtered',
    );
  });

  it('a pause shows its reason and no ETA; a closed execution shows how it ended', () => {
    const paused = state({
      status: 'paused',
      pauseRequested: true,
      pauseReason: 'inspect',
      activeStages: [],
    });
    const snap = snapshotOf(paused, description(), { iterations: 10, staleness: 0 });
    assert.equal(progressLine(snap), `${progressBar(2, 10)} 2/10  paused: inspect  reward 0.200  1234 tok/s`);
    const done = snapshotOf(
      state({ status: 'cancelled', activeStages: [] }),
      { ...description(), status: { name: 'CANCELED' } } as unknown as WorkflowExecutionDescription,
      undefined,
    );
    assert.equal(progressLine(done), '2 committed  cancelled  reward 0.200  1234 tok/s');
  });

  it("the workflow's current details: status, then the stages in flight per iteration", () => {
    const progress = new Map([
      [stageKey(3, 'update'), { tries: 2 }],
      [stageKey(4, 'rollout'), { tries: 1, shardsDone: 1 }],
    ]);
    assert.equal(
      currentDetails(state(), testSpec({ iterations: 10, rolloutShards: 2 }), progress),
      [
        'running — 2/10 iterations committed, mean reward 0.200 (iteration 2)',
        'iteration 3: update, try 2',
        'iteration 4: rollout, 1/2 shards done',
      ].join('\n'),
    );
  });
});
