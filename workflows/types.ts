// Campaign workflow input and state. The state is one plain JSON-safe object (no Map/Set): it
// is the query answer and travels whole across continue-as-new.
import type { DatasetIdentity } from '../activities/datasets/index.js';
import type {
  CheckpointRef,
  EpisodeStats,
  RewardOutput,
  RolloutShardOutput,
  ValidationOutput,
} from '../activities/types.js';
import type { CampaignChange, CampaignSpec, Hyperparameters } from './spec.js';

export type StageName = 'prepare' | 'rollout' | 'reward' | 'update' | 'checkpoint' | 'validation';
export const stageNames: readonly StageName[] = [
  'prepare',
  'rollout',
  'reward',
  'update',
  'checkpoint',
  'validation',
];

export type CampaignStatus = 'running' | 'pausing' | 'paused' | 'completed' | 'cancelled';

export interface TaskQueues {
  control: string;
  rollout: string;
  train: string;
}

export interface CampaignInput {
  campaignId: string;
  spec: CampaignSpec;
  taskQueues: TaskQueues;
  /** Start from this committed checkpoint of another campaign instead of a fresh policy. */
  forkFrom?: CheckpointRef;
  /** Present when this run continues an earlier one (continue-as-new). */
  state?: CampaignState;
  /** A fork's: its parent's prompts per iteration up to the fork, and from it on (forkPromptSchedule). */
  promptSchedule?: PromptSegment[];
}

/** From iteration `fromIteration` on, until the next segment, each iteration draws this many prompts. */
export interface PromptSegment {
  fromIteration: number;
  promptsPerIteration: number;
}

export interface ActiveStage {
  iteration: number;
  stage: StageName;
  startedAt: string;
}

export interface HyperparameterChange {
  /** First iteration whose stages use the new values. */
  iteration: number;
  changes: CampaignChange;
  reason: string;
  at: string;
}

export interface StageFailure {
  iteration: number;
  stage: StageName;
  message: string;
  /** The error type (e.g. BadInput) and whether retrying could help. */
  type: string;
  nonRetryable: boolean;
  at: string;
}

/** What one finished iteration left behind: small scalars only. */
export interface IterationSummary {
  iteration: number;
  /** Iteration of the checkpoint the rollout sampled from (iteration-1 on-policy, iteration-2 one-step off). */
  policyIteration: number;
  meanReward: number;
  passRate: number;
  samples: number;
  tokens: number;
  rolloutTokensPerSecond: number;
  chunksRedone: number;
  /** An agentic campaign's episodes (absent for one-shot completions). */
  episodes?: EpisodeStats;
  /** Dynamic sampling's further draws (absent without algorithm.dynamicSampling). */
  dynamicSampling?: DynamicSamplingSummary;
  stageSeconds: Partial<Record<StageName, number>>;
  attempts: Partial<Record<StageName, number>>;
  trainMetrics: Record<string, number>;
}

/** Rollout + reward of one iteration, finished ahead of its update when staleness is 1 or more. */
export interface RolloutPhaseResult {
  iteration: number;
  policy: CheckpointRef;
  /** Snapshot taken when the rollout started; the update of the same iteration uses it too. */
  hyperparameters: Hyperparameters;
  shards: RolloutShardOutput[];
  /** The reward of the iteration's own prompts: its figures are the iteration's. */
  reward: RewardOutput;
  stageSeconds: Partial<Record<StageName, number>>;
  dynamicSampling?: DynamicSamplingSummary;
}

/** What dynamic sampling drew for one iteration beyond its own prompts. */
export interface DynamicSamplingSummary {
  /** Further draws made (0: the iteration's own prompts had enough groups with signal). */
  rounds: number;
  /** Reserve prompts drawn over those rounds. */
  drawnPrompts: number;
  /** Groups with signal, over every draw: what the update trains on. */
  groupsWithSignal: number;
  /** Groups whose rewards were all equal, over every draw: filtered out of training. */
  filteredGroups: number;
}

/** A validated checkpoint's scores (the activity's output less its attempt). */
export type ValidationSummary = Omit<ValidationOutput, 'attempt'>;

export interface CampaignState {
  campaignId: string;
  name: string;
  status: CampaignStatus;
  pauseRequested: boolean;
  /** Why the campaign is paused when the campaign paused itself (a stage failed for good). */
  pauseReason: string | null;
  hyperparameters: Hyperparameters;
  hyperparameterChanges: HyperparameterChange[];
  /** The staleness `moerl set` last gave (rollouts started from then on); the spec's until then. */
  staleness?: number;
  /** First iteration whose rollout has not started yet. */
  nextIteration: number;
  /** Last iteration with a committed checkpoint (0 = initial policy, -1 = none yet). */
  committedIteration: number;
  latestCheckpoint: CheckpointRef | null;
  /** The campaign's first checkpoint: the KL reference, never removed by retention. */
  referenceCheckpoint: CheckpointRef | null;
  /** Committed checkpoints still kept by retention, oldest first. */
  checkpoints: CheckpointRef[];
  activeStages: ActiveStage[];
  /** Retries observed per stage (attempts beyond the first, summed over activities). */
  retries: Record<StageName, number>;
  lastFailure: StageFailure | null;
  /** The last few iterations (older ones are in the workflow history). */
  recentIterations: IterationSummary[];
  /** Rollout phases finished ahead of their updates (staleness k: up to k), carried across continue-as-new. */
  carriedRollouts: RolloutPhaseResult[];
  /** The one phase a run before bounded staleness k carried; read once by takeCarriedRollouts. */
  carriedRollout?: RolloutPhaseResult | null;
  /** Number of workflow runs so far (1 + continue-as-new count). */
  runs: number;
  forkedFrom: { campaignId: string; iteration: number } | null;
  /**
   * A dataset task's training file as the campaign started with it (its hash, size and rows): each
   * iteration's prompts follow from it and the iteration number. Absent: a built-in task.
   */
  dataset?: DatasetIdentity;
  /**
   * Prompts per iteration, by iteration: the spec's from iteration 1, then each accepted `set`'s.
   * Iteration i's prompts are the global ids after every earlier iteration's (iterationPrompts).
   * Absent in states of runs before the field: the spec's throughout.
   */
  promptSchedule?: PromptSegment[];
  /** The validation file as the campaign started with it; absent without one. */
  validationDataset?: DatasetIdentity;
  /** The last few validated checkpoints' scores, oldest first (all of them are in the history). */
  validations?: ValidationSummary[];
}
