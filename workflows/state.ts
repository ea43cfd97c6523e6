// Pure transitions of the campaign state: no Temporal APIs here, so each rule is unit-testable
// and the workflow file reads as orchestration only.
import { advancePosition, startPosition } from '../activities/datasets/sampling.js';
import type {
  CheckpointOutput,
  ChunksPerShard,
  IterationDataset,
  IterationPrompts,
  RolloutShardOutput,
} from '../activities/types.js';
import type { SetHyperparametersInput } from './messages.js';
import type { CampaignChange, CampaignSpec, Hyperparameters } from './spec.js';
import type {
  CampaignInput,
  CampaignState,
  HyperparameterChange,
  IterationSummary,
  PromptSegment,
  RolloutPhaseResult,
  StageFailure,
  StageName,
  ValidationSummary,
} from './types.js';

/** How many iteration summaries the state keeps; the rest is in the workflow history. */
export const recentIterationsKept = 10;

export function initialState(input: CampaignInput): CampaignState {
  return {
    campaignId: input.campaignId,
    name: input.spec.name,
    status: 'running',
    pauseRequested: false,
    pauseReason: null,
    hyperparameters: { ...input.spec.hyperparameters },
    hyperparameterChanges: [],
    nextIteration: input.forkFrom ? input.forkFrom.iteration + 1 : 1,
    committedIteration: -1,
    latestCheckpoint: null,
    referenceCheckpoint: null,
    checkpoints: [],
    activeStages: [],
    retries: { prepare: 0, rollout: 0, reward: 0, update: 0, checkpoint: 0, validation: 0 },
    lastFailure: null,
    recentIterations: [],
    carriedRollouts: [],
    promptSchedule: input.promptSchedule ?? [
      { fromIteration: 1, promptsPerIteration: input.spec.promptsPerIteration },
    ],
    runs: 1,
    forkedFrom: input.forkFrom
      ? { campaignId: input.forkFrom.campaignId, iteration: input.forkFrom.iteration }
      : null,
  };
}

/** Derives the status from the pause flag and running stages (cancel/complete are set directly). */
export function refreshStatus(state: CampaignState): void {
  if (state.status === 'completed' || state.status === 'cancelled') return;
  if (!state.pauseRequested) state.status = 'running';
  else state.status = state.activeStages.length > 0 ? 'pausing' : 'paused';
}

export function requestPause(state: CampaignState, reason: string): void {
  state.pauseRequested = true;
  state.pauseReason = reason;
  refreshStatus(state);
}

export function resume(state: CampaignState): void {
  state.pauseRequested = false;
  state.pauseReason = null;
  refreshStatus(state);
}

export function stageStarted(state: CampaignState, iteration: number, stage: StageName, at: Date): void {
  state.activeStages.push({ iteration, stage, startedAt: at.toISOString() });
  refreshStatus(state);
}

export function stageEnded(state: CampaignState, iteration: number, stage: StageName): void {
  const idx = state.activeStages.findIndex((s) => s.iteration === iteration && s.stage === stage);
  if (idx >= 0) state.activeStages.splice(idx, 1);
  refreshStatus(state);
}

/** A stage failed for good: remember why and pause, so an operator can fix and resume. */
export function stageFailed(state: CampaignState, failure: StageFailure): void {
  state.lastFailure = failure;
  requestPause(state, `${failure.stage} of iteration ${failure.iteration} failed: ${failure.message}`);
}

/** Attempts beyond the first of a finished activity are retries of its stage. */
export function countRetries(state: CampaignState, stage: StageName, attempt: number): void {
  state.retries[stage] += Math.max(0, attempt - 1);
}

/**
 * Applies a validated change. Hyperparameters are snapshotted, and an iteration's prompts
 * decided, when its rollout starts, so the change first applies to the next iteration whose
 * rollout has not started.
 */
export function applyHyperparameterChange(
  state: CampaignState,
  spec: CampaignSpec,
  input: SetHyperparametersInput,
  changes: CampaignChange,
  at: Date,
): HyperparameterChange {
  const change: HyperparameterChange = {
    iteration: state.nextIteration,
    changes,
    reason: input.reason ?? '',
    at: at.toISOString(),
  };
  const { promptsPerIteration, staleness, ...hyperparameters } = changes;
  state.hyperparameters = { ...state.hyperparameters, ...hyperparameters };
  if (staleness !== undefined) state.staleness = staleness;
  if (promptsPerIteration !== undefined)
    state.promptSchedule = withSegment(promptSchedule(state, spec), {
      fromIteration: state.nextIteration,
      promptsPerIteration,
    });
  state.hyperparameterChanges.push(change);
  return change;
}

/** The staleness in force: the last one `moerl set` gave, else the spec's. */
export function staleness(state: CampaignState, spec: CampaignSpec): number {
  return state.staleness ?? spec.staleness;
}

/** The campaign's prompts per iteration by iteration (the spec's alone in states that predate it). */
export function promptSchedule(state: CampaignState, spec: CampaignSpec): PromptSegment[] {
  return state.promptSchedule ?? [{ fromIteration: 1, promptsPerIteration: spec.promptsPerIteration }];
}

/** `schedule` with `segment` in force from its iteration on: later segments give way to it. */
function withSegment(schedule: readonly PromptSegment[], segment: PromptSegment): PromptSegment[] {
  return [...schedule.filter((s) => s.fromIteration < segment.fromIteration), segment];
}

/**
 * Iteration `iteration`'s prompts: `count` of them, global ids from `first` on, right after the
 * prompts of every earlier iteration. A pure function of the schedule, so resumes, re-run
 * rollout phases and continue-as-new give every iteration the same prompts.
 */
export function iterationPrompts(schedule: readonly PromptSegment[], iteration: number): IterationPrompts {
  let first = 0;
  for (const [k, s] of schedule.entries()) {
    const until = schedule[k + 1]?.fromIteration ?? Infinity;
    if (iteration < until)
      return {
        first: first + (iteration - s.fromIteration) * s.promptsPerIteration,
        count: s.promptsPerIteration,
      };
    first += (until - s.fromIteration) * s.promptsPerIteration;
  }
  throw new Error(`no prompt schedule covers iteration ${iteration}`);
}

/**
 * A fork's schedule: the parent's up to checkpoint `forkIteration`, so the fork's first iteration
 * draws the prompts the parent's next one did, then `promptsPerIteration` from there on when the
 * fork asks for another count (its spec's differs from the parent's).
 */
export function forkPromptSchedule(
  parent: readonly PromptSegment[],
  forkIteration: number,
  promptsPerIteration: number | undefined,
): PromptSegment[] {
  const kept = parent.filter((s) => s.fromIteration <= forkIteration + 1);
  if (promptsPerIteration === undefined) return kept;
  return withSegment(kept, { fromIteration: forkIteration + 1, promptsPerIteration });
}

/**
 * A fork's hyperparameters: its parent's spec with every `moerl set` that applied up to the
 * parent's iteration after checkpoint `forkIteration` (the one the fork's first iteration
 * stands in for), so a fork trains on as its parent did from that checkpoint. Later changes
 * are the parent's own.
 */
export function forkHyperparameters(
  spec: CampaignSpec,
  changes: readonly HyperparameterChange[],
  forkIteration: number,
): Hyperparameters {
  let hyperparameters: Hyperparameters = { ...spec.hyperparameters };
  for (const change of changes) {
    if (change.iteration > forkIteration + 1) continue;
    const set: Partial<CampaignChange> = { ...change.changes };
    delete set.promptsPerIteration; // the prompt schedule's, not a hyperparameter
    hyperparameters = { ...hyperparameters, ...set };
  }
  return hyperparameters;
}

export function checkpointCommitted(state: CampaignState, out: CheckpointOutput): void {
  state.latestCheckpoint = out.checkpoint;
  state.committedIteration = out.checkpoint.iteration;
  const removed = new Set(out.removed);
  state.checkpoints = [...state.checkpoints.filter((c) => !removed.has(c.key)), out.checkpoint];
}

/**
 * The rollout phases the previous run finished ahead of their updates, taken out of the state
 * (the run holds them until each is updated on). A run before bounded staleness k carried at
 * most one, as `carriedRollout`.
 */
export function takeCarriedRollouts(state: CampaignState): RolloutPhaseResult[] {
  const carried = [...(state.carriedRollouts ?? []), ...(state.carriedRollout ? [state.carriedRollout] : [])];
  state.carriedRollouts = [];
  delete state.carriedRollout;
  return carried;
}

export function iterationFinished(state: CampaignState, summary: IterationSummary): void {
  state.recentIterations = [...state.recentIterations, summary].slice(-recentIterationsKept);
}

export function validationFinished(state: CampaignState, summary: ValidationSummary): void {
  state.validations = [...(state.validations ?? []).filter((v) => v.iteration !== summary.iteration), summary]
    .sort((a, b) => a.iteration - b.iteration)
    .slice(-recentIterationsKept);
}

/** A dataset task's prompts of an iteration whose prompts are `prompts`: none for a built-in task. */
export function iterationDataset(
  state: CampaignState,
  prompts: IterationPrompts,
): { dataset: IterationDataset } | Record<string, never> {
  if (!state.dataset) return {};
  const identity = state.dataset;
  return { dataset: { identity, position: advancePosition(startPosition, prompts.first, identity.rows) } };
}

/**
 * Prompt ids of iteration `iteration`'s reserve for dynamic sampling: a block of its own, far past
 * any prompt the main order reaches (2^44), so drawing from it shifts no later iteration's prompts;
 * `drawn` reserve prompts came before. A dataset task reads them where the prompt stream would be
 * (an epoch of its own seeded shuffle), a built-in task generates them from the seed and the id:
 * a resumed, continued-as-new or forked campaign draws the same ones.
 */
export function reservePrompts(iteration: number, drawn: number, count: number): IterationPrompts {
  if (drawn + count > reservePromptsPerIteration)
    throw new Error(`iteration ${iteration}'s reserve holds ${reservePromptsPerIteration} prompts`);
  return { first: reservePromptBase + iteration * reservePromptsPerIteration + drawn, count };
}
const reservePromptBase = 2 ** 44;
/** 16 rounds of 1,000,000 prompts fit (algorithm.dynamicSampling's bounds). */
const reservePromptsPerIteration = 2 ** 24;

/** Splits `prompts` prompts into at most `shards` contiguous ranges, sizes differing by at most one. */
export function splitPrompts(
  prompts: number,
  shards: number,
): { shard: number; promptStart: number; promptCount: number }[] {
  const n = Math.max(1, Math.min(shards, prompts));
  const base = Math.floor(prompts / n);
  const extra = prompts % n;
  const ranges = [];
  let start = 0;
  for (let shard = 0; shard < n; shard++) {
    const count = base + (shard < extra ? 1 : 0);
    ranges.push({ shard, promptStart: start, promptCount: count });
    start += count;
  }
  return ranges;
}

/**
 * Chunks stored per shard, indexed by shard. Rollout results recorded before shards reported a
 * count carry the list of their chunk keys instead (histories and carried state of older runs).
 */
export function chunksPerShard(shards: readonly RolloutShardOutput[]): ChunksPerShard {
  const counts: number[] = [];
  for (const s of shards)
    counts[s.shard] = s.chunks ?? (s as { chunkKeys?: string[] }).chunkKeys?.length ?? 0;
  return Array.from(counts, (n) => n ?? 0);
}
