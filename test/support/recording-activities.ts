// Test implementations of the campaign activities: they do no real work, they record every
// call (with start and end times) and can be slowed, blocked or made to fail, so workflow tests
// can assert on scheduling, overlap, retries and cancellation against the real dev server.
import { ApplicationFailure, Context, sleep } from '@temporalio/activity';
import { badInputErrorType } from '../../activities/types.js';
import type {
  CampaignActivities,
  CheckpointInput,
  CheckpointOutput,
  ExportInput,
  ExportOutput,
  PrepareInput,
  PrepareInputsInput,
  PrepareInputsOutput,
  PrepareOutput,
  RewardInput,
  RewardOutput,
  RolloutShardInput,
  RolloutShardOutput,
  ScoreValidationInput,
  StagedCheckpoint,
  UpdateInput,
  UpdateOutput,
  ValidationOutput,
  ValidationShardInput,
} from '../../activities/types.js';
import type { DatasetIdentity } from '../../activities/datasets/index.js';
import { waitFor } from './campaign-harness.js';

export type ActivityName = keyof CampaignActivities;

export interface RecordedCall {
  activity: ActivityName;
  campaignId: string;
  iteration: number;
  shard?: number;
  attempt: number;
  startedAt: number;
  endedAt?: number;
  outcome?: 'ok' | 'failed' | 'cancelled';
  input: unknown;
}

export interface RecordingOptions {
  /** Milliseconds each activity takes (heartbeating meanwhile); default 0. */
  delayMs?: Partial<Record<ActivityName, number>>;
  /**
   * Calls that wait, heartbeating, until `release` lets their activity and iteration go (or they
   * are cancelled): a test acts on a stage it knows is running, from `started`, where a window
   * polled by queries closes unseen while one query is slow.
   */
  holdWhen?: (call: RecordedCall) => boolean;
  /** Return an error to throw for this call (retryable unless it is an ApplicationFailure saying otherwise). */
  failWhen?: (call: RecordedCall) => Error | undefined;
  /**
   * Milliseconds this call neither heartbeats nor answers before it goes on: what a lost worker,
   * or a completion the server never got, looks like to the server.
   */
  silentMsWhen?: (call: RecordedCall) => number | undefined;
  /** Mean reward reported for an iteration; default rises with the iteration. */
  rewardFor?: (iteration: number) => number;
  /** More of computeRewards' output for a call (its groups, say); default none. */
  rewardExtra?: (input: RewardInput) => Partial<RewardOutput>;
  /** What prepareInputs reports of a dataset task's files; default none (a built-in task). */
  datasets?: { train: DatasetIdentity; validation?: DatasetIdentity };
}

export function badInput(message: string): ApplicationFailure {
  return ApplicationFailure.create({ message, type: badInputErrorType, nonRetryable: true });
}

/** Creates recording test activities; `calls` fills as activities run. */
export function createRecordingTestActivities(opts: RecordingOptions = {}) {
  const calls: RecordedCall[] = [];
  const released = new Set<string>();
  const heldKey = (activity: ActivityName, iteration: number) => `${activity}/${iteration}`;
  /** Lets the held calls of `activity` for `iteration` go on, and those that come later. */
  const release = (activity: ActivityName, iteration: number) =>
    void released.add(heldKey(activity, iteration));
  /** The first call of `activity` for `iteration`, once it has started. */
  const started = (activity: ActivityName, iteration: number, timeoutMs = 60_000) =>
    waitFor(
      `${activity} of iteration ${iteration} to start`,
      async () => calls.find((c) => c.activity === activity && c.iteration === iteration),
      timeoutMs,
      20,
    );

  async function record<T>(
    activity: ActivityName,
    input: { campaignId: string; iteration: number; shard?: number },
    full: unknown,
    produce: () => T,
  ): Promise<T & { attempt: number }> {
    const attempt = Context.current().info.attempt;
    const call: RecordedCall = {
      activity,
      campaignId: input.campaignId,
      iteration: input.iteration,
      attempt,
      startedAt: Date.now(),
      input: full,
      ...(input.shard === undefined ? {} : { shard: input.shard }),
    };
    calls.push(call);
    try {
      const silentMs = opts.silentMsWhen?.(call);
      if (silentMs !== undefined) await sleep(silentMs); // no heartbeat; ends early on cancellation
      if (opts.holdWhen?.(call))
        while (!released.has(heldKey(activity, call.iteration))) {
          Context.current().heartbeat();
          await sleep(50);
        }
      const delay = opts.delayMs?.[activity] ?? 0;
      for (let waited = 0; waited < delay; waited += 50) {
        Context.current().heartbeat();
        await sleep(Math.min(50, delay - waited));
      }
      const failure = opts.failWhen?.(call);
      if (failure) throw failure;
      call.outcome = 'ok';
      return { ...produce(), attempt };
    } catch (err) {
      call.outcome = Context.current().cancellationSignal.aborted ? 'cancelled' : 'failed';
      throw err;
    } finally {
      call.endedAt = Date.now();
    }
  }

  const checkpointKey = (campaignId: string, iteration: number) =>
    `campaigns/${campaignId}/checkpoints/${String(iteration).padStart(6, '0')}`;
  const staged = (campaignId: string, iteration: number): StagedCheckpoint => ({
    campaignId,
    iteration,
    key: checkpointKey(campaignId, iteration),
    manifest: { format: 'moerl-checkpoint', version: 1, world_size: 1, files: [] },
  });
  const rewardFor = opts.rewardFor ?? ((i: number) => Math.min(1, 0.1 + 0.05 * i));

  const activities: CampaignActivities = {
    prepareInputs: (input: PrepareInputsInput): Promise<PrepareInputsOutput> =>
      record('prepareInputs', { campaignId: input.campaignId, iteration: 0 }, input, () => ({
        dataset: opts.datasets?.train ?? null,
        validationDataset: opts.datasets?.validation ?? null,
      })),
    preparePolicy: (input: PrepareInput): Promise<PrepareOutput> => {
      const iteration = input.source.kind === 'fork' ? input.source.checkpoint.iteration : 0;
      return record('preparePolicy', { campaignId: input.campaignId, iteration }, input, () => ({
        staged: staged(input.campaignId, iteration),
        metrics: {},
      }));
    },
    rolloutShard: (input: RolloutShardInput): Promise<RolloutShardOutput> =>
      record('rolloutShard', input, input, () => ({
        shard: input.shard,
        chunks: Math.ceil(input.promptCount / input.spec.chunkSize),
        samples: input.promptCount * input.spec.groupSize,
        tokens: input.promptCount * input.spec.groupSize * 10,
        tokensPerSecond: 1000,
        chunksRedone: 0,
      })),
    computeRewards: (input: RewardInput): Promise<RewardOutput> =>
      record('computeRewards', input, input, () => ({
        meanReward: rewardFor(input.iteration),
        stdReward: 0.1,
        passRate: rewardFor(input.iteration),
        ...opts.rewardExtra?.(input),
      })),
    validationShard: (input: ValidationShardInput): Promise<RolloutShardOutput> =>
      record('validationShard', { ...input, iteration: input.policy.iteration }, input, () => ({
        shard: input.shard,
        chunks: Math.ceil(input.promptCount / input.spec.chunkSize),
        samples: input.promptCount * input.validation.samples,
        tokens: input.promptCount * input.validation.samples * 10,
        tokensPerSecond: 1000,
        chunksRedone: 0,
      })),
    scoreValidation: (input: ScoreValidationInput): Promise<ValidationOutput> =>
      record(
        'scoreValidation',
        { campaignId: input.campaignId, iteration: input.policy.iteration },
        input,
        () => ({
          iteration: input.policy.iteration,
          k: input.validation.samples,
          prompts: input.dataset.rows,
          meanReward: rewardFor(input.policy.iteration),
          passAtK: rewardFor(input.policy.iteration),
          bySource: {
            all: { prompts: input.dataset.rows, meanReward: rewardFor(input.policy.iteration), passAtK: 1 },
          },
        }),
      ),
    updatePolicy: (input: UpdateInput): Promise<UpdateOutput> =>
      record('updatePolicy', input, input, () => ({
        staged: staged(input.campaignId, input.iteration),
        metrics: { loss: 1 / (1 + input.iteration) },
      })),
    commitCheckpoint: (input: CheckpointInput): Promise<CheckpointOutput> =>
      record(
        'commitCheckpoint',
        { campaignId: input.campaignId, iteration: input.staged.iteration },
        input,
        () => ({
          checkpoint: {
            campaignId: input.campaignId,
            iteration: input.staged.iteration,
            key: input.staged.key,
            manifestSha256: `test-${input.staged.iteration}`,
            meanReward: input.meanReward,
          },
          removed: [],
        }),
      ),
    exportPolicy: (input: ExportInput): Promise<ExportOutput> =>
      record('exportPolicy', input, input, () => ({ iteration: input.iteration, out: 'recorded', files: 0 })),
  };
  return { activities, calls, release, started };
}
