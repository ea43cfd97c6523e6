// The campaign workflow: one per experiment. It holds the decisions (what runs next, on which
// checkpoint, with which hyperparameters, when to pause or continue-as-new); activities do the
// I/O. Each iteration i is rollout (fanned out over shards) → reward → update → checkpoint.
// Checkpoint i is the policy after iteration i's update; checkpoint 0 is the initial policy.
import {
  ActivityFailure,
  ApplicationFailure,
  CancellationScope,
  allHandlersFinished,
  condition,
  continueAsNew,
  isCancellation,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { ActivityOptions } from '@temporalio/workflow';
import { badInputErrorType } from '../activities/types.js';
import type { DatasetIdentity } from '../activities/datasets/index.js';
import type {
  CampaignActivities,
  CheckpointRef,
  IterationPrompts,
  RewardOutput,
  StagedCheckpoint,
} from '../activities/types.js';
import { addEpisodeStats, emptyEpisodeStats } from '../activities/agents/episode-stats.js';
import { pauseSignal, resumeSignal, setHyperparametersUpdate, statusQuery } from './messages.js';
import { campaignStatusKey, iterationKey, meanRewardKey } from './search-attributes.js';
import { defaultCommitHeartbeatSeconds, validateHyperparameterChange } from './spec.js';
import { overlongShaping } from './spec-algorithm.js';
import { isHfModel } from './spec-model.js';
import { campaignValidation, validatesCheckpoint, validationPromptCount } from './spec-validation.js';
import type { ValidationSpec } from './spec-validation.js';
import type { CampaignSpec } from './spec.js';
import * as st from './state.js';
import * as summaries from './summaries.js';
import type { CampaignInput, CampaignState, RolloutPhaseResult, StageName, TaskQueues } from './types.js';

export interface CampaignResult {
  campaignId: string;
  status: CampaignState['status'];
  committedIteration: number;
  latestCheckpoint: CheckpointRef | null;
}

/** Activity options per stage, suited to where each runs. */
function stageActivities(spec: CampaignSpec, queues: TaskQueues) {
  const o = spec.orchestration;
  const stageTimeout = `${o.stageTimeoutMinutes} minutes`;
  const nonRetryableErrorTypes = [badInputErrorType];
  // Rollout workers run on Spot capacity: a lost worker is noticed within one heartbeat
  // timeout and the shard is retried elsewhere, forever, with a capped backoff.
  const rollout: ActivityOptions = {
    taskQueue: queues.rollout,
    startToCloseTimeout: stageTimeout,
    heartbeatTimeout: `${o.rolloutHeartbeatSeconds} seconds`,
    retry: { initialInterval: '1 second', maximumInterval: '30 seconds', nonRetryableErrorTypes },
  };
  // Trainer ranks run on stable capacity; repeated failure means something is wrong.
  const train: ActivityOptions = {
    taskQueue: queues.train,
    startToCloseTimeout: stageTimeout,
    heartbeatTimeout: `${o.updateHeartbeatSeconds} seconds`,
    retry: {
      initialInterval: '5 seconds',
      maximumInterval: '1 minute',
      maximumAttempts: o.updateMaxAttempts,
      nonRetryableErrorTypes,
    },
  };
  // A commit heartbeats on a timer, so a control worker lost mid-commit (or a completion the
  // server never got) is retried within a heartbeat timeout, not after the 30-minute limit.
  const control: ActivityOptions = {
    taskQueue: queues.control,
    startToCloseTimeout: '30 minutes',
    // A campaign started before the field existed carries a spec without it.
    heartbeatTimeout: `${(o as Partial<typeof o>).commitHeartbeatSeconds ?? defaultCommitHeartbeatSeconds} seconds`,
    retry: {
      initialInterval: '1 second',
      maximumInterval: '30 seconds',
      maximumAttempts: 10,
      nonRetryableErrorTypes,
    },
  };
  return {
    rollout: proxyActivities<CampaignActivities>(rollout),
    train: proxyActivities<CampaignActivities>(train),
    control: proxyActivities<CampaignActivities>(control),
  };
}

const secondsSince = (start: Date) => (Date.now() - start.getTime()) / 1000;

/** The iteration's episodes, its shards' added up: `{ episodes }`, or nothing without any. */
function iterationEpisodes(shards: RolloutPhaseResult['shards']) {
  const withEpisodes = shards.flatMap((s) => (s.episodes ? [s.episodes] : []));
  if (withEpisodes.length === 0) return {};
  return { episodes: withEpisodes.reduce((into, e) => addEpisodeStats(into, e), emptyEpisodeStats()) };
}

export async function campaign(input: CampaignInput): Promise<CampaignResult> {
  const { spec, campaignId } = input;
  // A state carried from a run before the validation stage existed counts no retries of it yet.
  const state: CampaignState = input.state
    ? {
        ...input.state,
        promptSchedule: st.promptSchedule(input.state, spec),
        runs: input.state.runs + 1,
        retries: { ...input.state.retries, validation: input.state.retries.validation ?? 0 },
      }
    : st.initialState(input);
  const acts = stageActivities(spec, input.taskQueues);

  // What the UI and `temporal workflow metadata` show as the campaign's current details.
  // Setting them records nothing in the history: replay is unaffected.
  const progress = new Map<string, summaries.StageProgress>();
  const stageTries = new Map<string, number>();
  const showDetails = () => setCurrentDetails(summaries.currentDetails(state, spec, progress));

  setHandler(pauseSignal, ({ reason }) => {
    st.requestPause(state, reason ?? 'paused by user');
    showDetails();
  });
  setHandler(resumeSignal, () => {
    st.resume(state);
    showDetails();
  });
  setHandler(
    setHyperparametersUpdate,
    (req) =>
      st.applyHyperparameterChange(
        state,
        spec,
        req,
        validateHyperparameterChange(req.changes, spec),
        new Date(),
      ),
    {
      validator: (req) => {
        if (state.status === 'completed' || state.status === 'cancelled')
          throw new Error(`campaign is ${state.status}; nothing left to apply hyperparameters to`);
        validateHyperparameterChange(req?.changes, spec);
      },
    },
  );
  setHandler(statusQuery, () => state);

  let lastStatus = '';
  const publishStatus = () => {
    showDetails();
    if (state.status === lastStatus) return;
    lastStatus = state.status;
    upsertSearchAttributes([{ key: campaignStatusKey, value: state.status }]);
  };

  // Cancellation of the workflow as a whole: it must reach a wait at the pause boundary even
  // inside a non-cancellable scope (a paused commit), or cancelling a paused campaign would hang
  // until someone resumed it.
  const workflowScope = CancellationScope.current();

  /** Waits here while a pause is requested: the boundary between stages. */
  async function boundary(): Promise<void> {
    st.refreshStatus(state);
    publishStatus();
    await Promise.race([condition(() => !state.pauseRequested), workflowScope.cancelRequested]);
    publishStatus();
  }

  /**
   * One try of a stage's activity (Temporal retries it per its retry policy). A failure that
   * outlives the retry policy pauses the campaign with the reason recorded and yields null: the
   * caller decides what to run again once the campaign is resumed. `part` tells apart the
   * activities of one stage (a rollout's shards) for counting tries.
   */
  async function attemptStage<T extends { attempt: number }>(
    iteration: number,
    stage: StageName,
    call: () => Promise<T>,
    part = '',
  ): Promise<T | null> {
    await boundary();
    const key = summaries.stageKey(iteration, stage);
    const tries = (stageTries.get(`${key}/${part}`) ?? 0) + 1;
    stageTries.set(`${key}/${part}`, tries);
    const p = progress.get(key) ?? { tries: 0 };
    progress.set(key, { ...p, tries: Math.max(p.tries, tries) });
    st.stageStarted(state, iteration, stage, new Date());
    showDetails();
    try {
      const out = await call();
      st.countRetries(state, stage, out.attempt);
      return out;
    } catch (err) {
      if (isCancellation(err) || !(err instanceof ActivityFailure)) throw err;
      const cause = err.cause;
      st.stageFailed(state, {
        iteration,
        stage,
        message: cause?.message ?? err.message,
        type: cause instanceof ApplicationFailure ? (cause.type ?? 'Error') : (cause?.name ?? 'Error'),
        nonRetryable: cause instanceof ApplicationFailure && cause.nonRetryable === true,
        at: new Date().toISOString(),
      });
      state.retries[stage] += 1;
      return null;
    } finally {
      st.stageEnded(state, iteration, stage);
      publishStatus();
    }
  }

  /** A stage whose own activity is what `resume` runs again (outputs are keyed deterministically). */
  async function runStage<T extends { attempt: number }>(
    iteration: number,
    stage: StageName,
    call: () => Promise<T>,
    part = '',
  ): Promise<T> {
    for (;;) {
      const out = await attemptStage(iteration, stage, call, part);
      if (out) return out;
    }
  }

  /**
   * Rollout phases running ahead of their update (staleness k ≥ 1), by iteration, each with the
   * iteration of the checkpoint it samples from: retention keeps those until they are updated on.
   */
  const ahead = new Map<number, { phase: Promise<RolloutPhaseResult>; policy: number }>();

  /** `protect`: checkpoints that rollout phases not yet updated on still sample from. */
  async function commit(staged: StagedCheckpoint, meanReward: number | null, protect: number[] = []) {
    // The commit is short and atomic (manifest last); let it finish even if the campaign is
    // being cancelled, so the store never holds debris of a commit cut in half.
    const out = await CancellationScope.nonCancellable(() =>
      attemptStage(staged.iteration, 'checkpoint', () =>
        acts.control.commitCheckpoint.executeWithOptions(
          { summary: summaries.checkpointSummary(staged.iteration) },
          [
            {
              campaignId,
              spec,
              staged,
              meanReward,
              referenceIteration: state.referenceCheckpoint?.iteration ?? staged.iteration,
              protectIterations: protect,
            },
          ],
        ),
      ),
    );
    if (out) st.checkpointCommitted(state, out);
    return out;
  }

  /**
   * Validations in flight, by the iteration of the checkpoint each scores: they run beside the
   * training loop (on the rollout workers), and retention keeps their checkpoints until they end.
   * No patched() gate: only campaigns whose prepareInputs reported a validation file (code newer
   * than this) ever schedule one, so no recorded history changes.
   */
  const validating = new Map<number, Promise<void>>();

  function startValidation(checkpoint: CheckpointRef): void {
    const v = campaignValidation(spec);
    const dataset = state.validationDataset;
    if (!v || !dataset || !validatesCheckpoint(v, checkpoint.iteration, spec.iterations)) return;
    if (validating.has(checkpoint.iteration)) return;
    const run = validate(checkpoint, v, dataset).finally(() => validating.delete(checkpoint.iteration));
    run.catch(() => undefined); // its failure surfaces where it is awaited
    validating.set(checkpoint.iteration, run);
  }

  /**
   * Generates the validation prompts' completions from `checkpoint` and scores them. A score that
   * fails for good (a chunk that does not verify) generates again on resume: the shards keep the
   * chunks that verify.
   */
  async function validate(checkpoint: CheckpointRef, v: ValidationSpec, dataset: DatasetIdentity) {
    const { iteration } = checkpoint;
    const ranges = st.splitPrompts(validationPromptCount(v, dataset.rows), v.shards);
    const common = { campaignId, spec, policy: checkpoint, validation: v, dataset };
    for (;;) {
      const shards = await Promise.all(
        ranges.map((range) =>
          runStage(
            iteration,
            'validation',
            () =>
              acts.rollout.validationShard.executeWithOptions(
                { summary: summaries.validationShardSummary(iteration, range.shard, ranges.length) },
                [{ ...common, ...range }],
              ),
            `shard-${range.shard}`,
          ),
        ),
      );
      const scored = await attemptStage(
        iteration,
        'validation',
        () =>
          acts.rollout.scoreValidation.executeWithOptions(
            { summary: summaries.validationScoreSummary(iteration) },
            [{ ...common, chunksPerShard: st.chunksPerShard(shards) }],
          ),
        'score',
      );
      if (scored) {
        const { attempt: _attempt, ...summary } = scored;
        st.validationFinished(state, summary);
        showDetails();
        return;
      }
    }
  }

  async function prepare(): Promise<void> {
    const source = input.forkFrom
      ? { kind: 'fork' as const, checkpoint: input.forkFrom }
      : { kind: 'init' as const };
    const iteration = input.forkFrom?.iteration ?? 0;
    // A Hugging Face model's tokenizer and config, and a dataset checked whole, before its weights.
    if (isHfModel(spec.model)) {
      const inputs = await runStage(
        iteration,
        'prepare',
        () =>
          acts.rollout.prepareInputs.executeWithOptions({ summary: summaries.prepareInputsSummary(spec) }, [
            { campaignId, spec, ...(input.forkFrom ? { forkFrom: input.forkFrom } : {}) },
          ]),
        'inputs',
      );
      if (inputs.dataset) state.dataset = inputs.dataset;
      if (inputs.validationDataset) state.validationDataset = inputs.validationDataset;
    }
    // A commit that fails for good (a staged file corrupt) means preparing again.
    for (;;) {
      const out = await runStage(iteration, 'prepare', () =>
        acts.train.preparePolicy.executeWithOptions(
          { summary: summaries.prepareSummary(spec, iteration, input.forkFrom) },
          [{ campaignId, spec, source }],
        ),
      );
      const committed = await commit(out.staged, null);
      if (committed) {
        state.referenceCheckpoint = committed.checkpoint;
        // A fork's first checkpoint is its parent's, scored there if the parent wanted it.
        if (!input.forkFrom) startValidation(committed.checkpoint);
        return;
      }
    }
  }

  /**
   * Rollout over all shards, then reward, for one iteration sampled from `policy`. A reward that
   * fails for good (a malformed rollout) runs the rollout again on resume: its activities keep
   * the chunks that verify and regenerate the rest.
   */
  async function rolloutPhase(iteration: number, policy: CheckpointRef): Promise<RolloutPhaseResult> {
    await boundary();
    state.nextIteration = Math.max(state.nextIteration, iteration + 1);
    const hyperparameters = { ...state.hyperparameters };
    for (;;) {
      const phase = await rolloutAndReward(iteration, policy, hyperparameters);
      if (phase) return phase;
    }
  }

  async function rolloutAndReward(
    iteration: number,
    policy: CheckpointRef,
    hyperparameters: RolloutPhaseResult['hyperparameters'],
  ): Promise<RolloutPhaseResult | null> {
    const own = st.iterationPrompts(st.promptSchedule(state, spec), iteration);
    const first = await drawRound(iteration, policy, hyperparameters, own, []);
    if (!first) return null;
    const sampling = spec.algorithm?.dynamicSampling;
    let { shards } = first;
    const stageSeconds = { rollout: first.rolloutSeconds, reward: first.rewardSeconds };
    let dynamicSampling: RolloutPhaseResult['dynamicSampling'];
    if (sampling) {
      // DAPO: draw from the iteration's reserve while fewer groups than prompts carry signal
      const summary = { rounds: 0, drawnPrompts: 0, groupsWithSignal: 0, filteredGroups: 0 };
      const tally = (r: RewardOutput) => {
        summary.groupsWithSignal += r.groupsWithSignal ?? 0;
        summary.filteredGroups += (r.groups ?? 0) - (r.groupsWithSignal ?? 0);
      };
      tally(first.reward);
      const perRound = sampling.promptsPerRound ?? own.count;
      while (summary.rounds < sampling.maxRounds && summary.groupsWithSignal < own.count) {
        const reserve = st.reservePrompts(iteration, summary.drawnPrompts, perRound);
        const more = await drawRound(iteration, policy, hyperparameters, reserve, shards);
        if (!more) return null;
        shards = more.shards;
        stageSeconds.rollout += more.rolloutSeconds;
        stageSeconds.reward += more.rewardSeconds;
        summary.rounds++;
        summary.drawnPrompts += perRound;
        tally(more.reward);
      }
      dynamicSampling = summary;
    }
    return {
      iteration,
      policy,
      hyperparameters,
      shards,
      reward: first.reward,
      stageSeconds,
      ...(dynamicSampling ? { dynamicSampling } : {}),
    };
  }

  /**
   * Rollout of `prompts` over shards numbered after `before`'s, then the reward of those shards;
   * every shard so far, or null when the reward failed for good.
   */
  async function drawRound(
    iteration: number,
    policy: CheckpointRef,
    hyperparameters: RolloutPhaseResult['hyperparameters'],
    iterationPrompts: IterationPrompts,
    before: RolloutPhaseResult['shards'],
  ) {
    const started = new Date();
    const key = summaries.stageKey(iteration, 'rollout');
    const firstShard = before.length;
    const ranges = st
      .splitPrompts(iterationPrompts.count, spec.rolloutShards)
      .map((r) => ({ ...r, shard: firstShard + r.shard }));
    const dataset = st.iterationDataset(state, iterationPrompts);
    const total = firstShard + ranges.length;
    progress.set(key, { tries: progress.get(key)?.tries ?? 0, shardsDone: firstShard, shards: total });
    const shards = await Promise.all(
      ranges.map(async (range) => {
        const out = await runStage(
          iteration,
          'rollout',
          () =>
            acts.rollout.rolloutShard.executeWithOptions(
              { summary: summaries.rolloutSummary(iteration, range.shard, total) },
              [
                {
                  campaignId,
                  iteration,
                  spec,
                  policy,
                  hyperparameters,
                  ...range,
                  iterationPrompts,
                  ...dataset,
                },
              ],
            ),
          String(range.shard),
        );
        const p = progress.get(key);
        if (p) p.shardsDone = (p.shardsDone ?? 0) + 1;
        showDetails();
        return out;
      }),
    );
    const rolloutSeconds = secondsSince(started);
    const rewardStarted = new Date();
    const all = [...before, ...shards];
    const overlong = overlongShaping(spec, hyperparameters);
    const reward = await attemptStage(iteration, 'reward', () =>
      acts.rollout.computeRewards.executeWithOptions(
        { summary: summaries.rewardSummary(iteration, ranges.length) },
        [
          {
            campaignId,
            iteration,
            spec,
            chunksPerShard: st.chunksPerShard(all),
            iterationPrompts,
            ...dataset,
            ...(overlong ? { overlong } : {}),
            ...(firstShard > 0 ? { firstShard } : {}),
          },
        ],
      ),
    );
    return reward
      ? { shards: all, reward, rolloutSeconds, rewardSeconds: secondsSince(rewardStarted) }
      : null;
  }

  /**
   * Update on a finished rollout phase and commit the result as checkpoint `phase.iteration`.
   * False when the update or its commit failed for good: once resumed, the iteration's rollout
   * phase is checked (and repaired) again before the update re-runs.
   */
  async function updatePhase(phase: RolloutPhaseResult): Promise<boolean> {
    const { iteration } = phase;
    const started = new Date();
    const update = await attemptStage(iteration, 'update', () =>
      acts.train.updatePolicy.executeWithOptions({ summary: summaries.updateSummary(spec, iteration) }, [
        {
          campaignId,
          iteration,
          spec,
          policy: state.latestCheckpoint!,
          reference: state.referenceCheckpoint!,
          chunksPerShard: st.chunksPerShard(phase.shards),
          hyperparameters: phase.hyperparameters,
        },
      ]),
    );
    if (!update) return false;
    const updateSeconds = secondsSince(started);
    const commitStarted = new Date();
    const protect = [
      phase.policy.iteration,
      ...[...ahead.values()].map((a) => a.policy),
      ...validating.keys(),
    ];
    const committed = await commit(update.staged, phase.reward.meanReward, protect);
    if (!committed) return false;
    // Before the next commit, so retention cannot remove the checkpoint under the export.
    if (spec.export && (iteration % spec.export.everyIterations === 0 || iteration === spec.iterations))
      await runStage(
        iteration,
        'checkpoint',
        () =>
          acts.train.exportPolicy.executeWithOptions({ summary: summaries.exportSummary(spec, iteration) }, [
            { campaignId, spec, iteration },
          ]),
        'export',
      );
    startValidation(committed.checkpoint);
    const sum = (f: (s: RolloutPhaseResult['shards'][number]) => number) =>
      phase.shards.reduce((acc, s) => acc + f(s), 0);
    st.iterationFinished(state, {
      iteration,
      policyIteration: phase.policy.iteration,
      meanReward: phase.reward.meanReward,
      passRate: phase.reward.passRate,
      samples: sum((s) => s.samples),
      tokens: sum((s) => s.tokens),
      rolloutTokensPerSecond: sum((s) => s.tokensPerSecond),
      chunksRedone: sum((s) => s.chunksRedone),
      ...iterationEpisodes(phase.shards),
      ...(phase.dynamicSampling ? { dynamicSampling: phase.dynamicSampling } : {}),
      stageSeconds: { ...phase.stageSeconds, update: updateSeconds, checkpoint: secondsSince(commitStarted) },
      attempts: {
        rollout: Math.max(...phase.shards.map((s) => s.attempt)),
        reward: phase.reward.attempt,
        update: update.attempt,
        checkpoint: committed.attempt,
      },
      trainMetrics: update.metrics,
    });
    for (const k of [...progress.keys(), ...stageTries.keys()])
      if (k.startsWith(`${iteration}/`)) {
        progress.delete(k);
        stageTries.delete(k);
      }
    showDetails();
    upsertSearchAttributes([
      { key: iterationKey, value: iteration },
      { key: meanRewardKey, value: phase.reward.meanReward },
    ]);
    return true;
  }

  const shouldContinueAsNew = (iterationsThisRun: number) =>
    workflowInfo().continueAsNewSuggested || iterationsThisRun >= spec.orchestration.continueAsNewEvery;

  try {
    if (state.latestCheckpoint === null) await prepare();
    for (const phase of st.takeCarriedRollouts(state))
      ahead.set(phase.iteration, { phase: Promise.resolve(phase), policy: phase.policy.iteration });
    let iterationsThisRun = 0;
    for (let i = state.committedIteration + 1; i <= spec.iterations; i++) {
      // Bounded staleness k: iterations up to i+k sample from the checkpoint update i starts
      // from, so iteration j's policy is at most k checkpoints older than an on-policy one's.
      // The staleness in force as this iteration starts (`moerl set` may change it). Phases
      // started ahead under a larger one are kept and trained on in order; none starts past i + k.
      const policy = state.latestCheckpoint!;
      const k = st.staleness(state, spec);
      const runAhead = () => {
        for (let j = i + 1; j <= Math.min(i + k, spec.iterations); j++) {
          if (ahead.has(j)) continue;
          const started = rolloutPhase(j, policy);
          started.catch(() => undefined); // its failure surfaces where it is awaited
          ahead.set(j, { phase: started, policy: policy.iteration });
        }
      };
      // A deeper pipeline fills as soon as the checkpoint is there; staleness 1 starts the next
      // rollout once this one is done, beside the update (the order its recorded histories hold).
      if (k > 1) runAhead();
      const running = ahead.get(i);
      ahead.delete(i);
      let phase = await (running?.phase ?? rolloutPhase(i, policy));
      runAhead();
      while (!(await updatePhase(phase))) phase = await rolloutPhase(i, phase.policy);
      iterationsThisRun++;
      if (i < spec.iterations && shouldContinueAsNew(iterationsThisRun)) {
        state.carriedRollouts = await Promise.all(
          [...ahead.keys()].sort((a, b) => a - b).map((j) => ahead.get(j)!.phase),
        );
        await Promise.all(validating.values());
        await condition(allHandlersFinished);
        await continueAsNew<typeof campaign>({ ...input, state });
      }
    }
    await Promise.all(validating.values());
    state.status = 'completed';
    publishStatus();
    await condition(allHandlersFinished);
  } catch (err) {
    if (isCancellation(err)) {
      state.status = 'cancelled';
      state.activeStages = [];
      publishStatus();
    }
    throw err;
  }
  return {
    campaignId,
    status: state.status,
    committedIteration: state.committedIteration,
    latestCheckpoint: state.latestCheckpoint,
  };
}
