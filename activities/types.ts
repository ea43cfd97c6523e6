// The contract between the campaign workflow and its activities: inputs and outputs carry keys
// and small summaries only (each payload well under 64 KB); bulk data lives in the object store.
import type { CampaignSpec, Hyperparameters } from '../workflows/spec.js';
import type { OverlongShaping } from '../workflows/spec-algorithm.js';
import type { ValidationSpec } from '../workflows/spec-validation.js';
import type { StageName } from '../workflows/types.js';
import type { DatasetIdentity, DatasetPosition } from './datasets/index.js';

/** Where a campaign's artifacts live: the spec's store section (no credentials, ever). */
export type StoreLocation = CampaignSpec['store'];

/** A committed checkpoint: its manifest exists, so every file in it is whole and verified. */
export interface CheckpointRef {
  campaignId: string;
  /** Iteration whose update produced it (0 = the initial policy). */
  iteration: number;
  /** Store key of the checkpoint directory, e.g. campaigns/<id>/checkpoints/000012 */
  key: string;
  /** sha256 of manifest.json: identifies the checkpoint's content (rollout caches key on it). */
  manifestSha256: string;
  meanReward: number | null;
}

/** manifest.json as the native core writes and reads it (docs/native-model.md), plus our section. */
export interface CheckpointManifest {
  format: string;
  version: number;
  world_size: number;
  files: { name: string; bytes: number; sha256: string }[];
  /** Added by the commit: which campaign and iteration, and the reward it was scored with. */
  moerl?: { campaignId: string; iteration: number; meanReward: number | null; committedAt: string };
  [field: string]: unknown;
}

/** A checkpoint whose files are in the store but whose manifest is not (yet): not readable. */
export interface StagedCheckpoint {
  campaignId: string;
  iteration: number;
  key: string;
  /** The manifest the commit will write (a few hundred bytes). */
  manifest: CheckpointManifest;
}

interface ActivityOutcome {
  /** Temporal attempt number that produced this result (1 = first try). */
  attempt: number;
}

export interface PrepareInputsInput {
  campaignId: string;
  spec: CampaignSpec;
  /** A fork takes the parent campaign's model files. */
  forkFrom?: CheckpointRef;
}
export interface PrepareInputsOutput extends ActivityOutcome {
  /** The training dataset's identity, when the task is a dataset. */
  dataset: DatasetIdentity | null;
  /** The validation file's, when the dataset names one (absent from workers older than validation). */
  validationDataset?: DatasetIdentity | null;
}

/** A dataset task's prompts of one iteration: the dataset's identity and where the iteration starts in it. */
export interface IterationDataset {
  identity: DatasetIdentity;
  position: DatasetPosition;
}

export interface PrepareInput {
  campaignId: string;
  spec: CampaignSpec;
  /** init a fresh policy (plus optional SFT warm start), or import a checkpoint of another campaign. */
  source: { kind: 'init' } | { kind: 'fork'; checkpoint: CheckpointRef };
}
/**
 * Where a training job's time went, and how often its ranks restarted as a gang: waiting for a cluster queue to admit it (Kueue,
 * `launcher.queueName`) and running once admitted. Absent when the job did not run in this
 * attempt (its checkpoint was already committed) or its launcher has no queues (local).
 */
export interface TrainJobTimes {
  queueWaitSeconds?: number;
  runSeconds?: number;
  /** Times every rank of the job started again together after one was lost (a gang restart). */
  gangRestarts?: number;
}

export interface PrepareOutput extends ActivityOutcome, TrainJobTimes {
  staged: StagedCheckpoint;
  metrics: Record<string, number>;
}

/** An iteration's prompts: `count` of them, global prompt ids [first, first + count). */
export interface IterationPrompts {
  first: number;
  count: number;
}

/**
 * The prompts of the iteration a rollout or reward input belongs to. Inputs of workflow code from
 * before `set promptsPerIteration` carry none: every iteration then had the spec's count.
 */
export function iterationPromptsOf(input: {
  iteration: number;
  spec: CampaignSpec;
  iterationPrompts?: IterationPrompts;
}): IterationPrompts {
  const count = input.spec.promptsPerIteration;
  return input.iterationPrompts ?? { first: (input.iteration - 1) * count, count };
}

export interface RolloutShardInput {
  campaignId: string;
  iteration: number;
  shard: number;
  spec: CampaignSpec;
  policy: CheckpointRef;
  /** Prompts [promptStart, promptStart + promptCount) of this iteration belong to this shard. */
  promptStart: number;
  promptCount: number;
  hyperparameters: Hyperparameters;
  /** The whole iteration's prompts (iterationPromptsOf). */
  iterationPrompts?: IterationPrompts;
  /** Absent for a built-in task. */
  dataset?: IterationDataset;
}
export interface RolloutShardOutput extends ActivityOutcome {
  shard: number;
  /** Chunks stored, keyed `rolloutChunkKey(campaign, iteration, shard, 0..chunks-1)` (layout.ts). */
  chunks: number;
  samples: number;
  tokens: number;
  tokensPerSecond: number;
  /** Chunks regenerated because an earlier attempt died before storing them. */
  chunksRedone: number;
  /** An agentic campaign's episodes among the samples (absent without any). */
  episodes?: EpisodeStats;
}

/** What a shard's (or an iteration's) episodes did: counts, and times summed over episodes. */
export interface EpisodeStats {
  episodes: number;
  policyTurns: number;
  /** Episodes by end reason (agents/episode.ts episodeEndReasons). */
  endReasons: Record<string, number>;
  /** Calls by tool: a name the model made up counts as "(unknown)", a call without one "(unnamed)". */
  toolCalls: Record<string, number>;
  /** Calls that did not run or failed, by error kind. */
  toolErrors: Record<string, number>;
  /** Time spent waiting on tools, and generating policy turns, summed over episodes. */
  toolSeconds: number;
  generationSeconds: number;
}

/**
 * An iteration's stored rollout: shard s has `chunksPerShard[s]` chunks. The keys of its chunks
 * and rewards files follow from layout.ts, so no payload carries one key per chunk.
 */
export type ChunksPerShard = number[];

export interface RewardInput {
  campaignId: string;
  iteration: number;
  spec: CampaignSpec;
  chunksPerShard: ChunksPerShard;
  /** The iteration's prompts (iterationPromptsOf). */
  iterationPrompts?: IterationPrompts;
  /** Absent for a built-in task. */
  dataset?: IterationDataset;
  /** DAPO's overlong penalty for this iteration (algorithm.overlong.bufferTokens); absent: none. */
  overlong?: OverlongShaping;
  /** Dynamic sampling's further draws: the shards before this one were scored by an earlier reward. */
  firstShard?: number;
}
/** One rewards file per shard, at `rewardKey(campaign, iteration, shard)`. */
export interface RewardOutput extends ActivityOutcome {
  meanReward: number;
  stdReward: number;
  passRate: number;
  /** Samples whose reward function failed (scored 0), and why; absent when none did. */
  failedSamples?: number;
  failuresByReason?: Partial<Record<string, number>>;
  /** Prompt groups scored, and those whose rewards (as the trainer reads them) are not all equal. */
  groups?: number;
  groupsWithSignal?: number;
}

export interface UpdateInput {
  campaignId: string;
  iteration: number;
  spec: CampaignSpec;
  policy: CheckpointRef;
  /** KL reference policy (the campaign's first checkpoint). */
  reference: CheckpointRef;
  chunksPerShard: ChunksPerShard;
  hyperparameters: Hyperparameters;
}
export interface UpdateOutput extends ActivityOutcome, TrainJobTimes {
  staged: StagedCheckpoint;
  /** Scalar training metrics of the update (loss terms, KL, entropy, grad norm, tokens/s, ...). */
  metrics: Record<string, number>;
}

/** One shard of a checkpoint's validation: rows [promptStart, promptStart + promptCount) of the file. */
export interface ValidationShardInput {
  campaignId: string;
  spec: CampaignSpec;
  /** The checkpoint validated; its iteration keys the outputs (layout.ts, validationChunkKey). */
  policy: CheckpointRef;
  validation: ValidationSpec;
  /** The validation file as the campaign started with it. */
  dataset: DatasetIdentity;
  shard: number;
  promptStart: number;
  promptCount: number;
}

export interface ScoreValidationInput {
  campaignId: string;
  spec: CampaignSpec;
  policy: CheckpointRef;
  validation: ValidationSpec;
  dataset: DatasetIdentity;
  chunksPerShard: ChunksPerShard;
}

/** Validation scores of one group of prompts: all of them, or one data_source's. */
export interface ValidationScores {
  prompts: number;
  meanReward: number;
  /** Fraction of prompts with at least one of their k samples passing (docs/rewards.md, "Pass rate"). */
  passAtK: number;
}

/** A checkpoint's validation, also stored as `validationScoresKey` (layout.ts). */
export interface ValidationOutput extends ActivityOutcome, ValidationScores {
  iteration: number;
  /** Samples per prompt: the k of pass@k. */
  k: number;
  bySource: Record<string, ValidationScores>;
  /** Samples whose reward function failed (scored 0), and why; absent when none did. */
  failedSamples?: number;
  failuresByReason?: Partial<Record<string, number>>;
  /** Prompt groups scored, and those whose rewards (as the trainer reads them) are not all equal. */
  groups?: number;
  groupsWithSignal?: number;
}

export interface CheckpointInput {
  campaignId: string;
  spec: CampaignSpec;
  staged: StagedCheckpoint;
  meanReward: number | null;
  /** Iteration of the campaign's first checkpoint, which retention always keeps. */
  referenceIteration: number;
  /**
   * Iterations of the checkpoints that in-flight or carried rollout phases sample from, which
   * retention keeps too. Absent (workflow code from before this field): none.
   */
  protectIterations?: number[];
}
export interface CheckpointOutput extends ActivityOutcome {
  checkpoint: CheckpointRef;
  /** Checkpoint keys removed by retention. */
  removed: string[];
}

export interface ExportInput {
  campaignId: string;
  spec: CampaignSpec;
  /** A committed checkpoint's iteration. */
  iteration: number;
}
export interface ExportOutput extends ActivityOutcome {
  iteration: number;
  /** Where the model folder went (the store's description, no credentials). */
  out: string;
  files: number;
}

/** Every activity the campaign workflow schedules, by name. */
export interface CampaignActivities {
  prepareInputs(input: PrepareInputsInput): Promise<PrepareInputsOutput>;
  preparePolicy(input: PrepareInput): Promise<PrepareOutput>;
  rolloutShard(input: RolloutShardInput): Promise<RolloutShardOutput>;
  computeRewards(input: RewardInput): Promise<RewardOutput>;
  validationShard(input: ValidationShardInput): Promise<RolloutShardOutput>;
  scoreValidation(input: ScoreValidationInput): Promise<ValidationOutput>;
  updatePolicy(input: UpdateInput): Promise<UpdateOutput>;
  commitCheckpoint(input: CheckpointInput): Promise<CheckpointOutput>;
  exportPolicy(input: ExportInput): Promise<ExportOutput>;
}

/** The stage each activity runs: how the history and the metrics name an activity. */
/**
 * A rollout or validation shard's heartbeat details: its progress, carried from one attempt to
 * the next and shown by `moerl watch` (cli/progress.ts).
 */
export interface RolloutHeartbeat {
  /** The shard, for people: "rollout of iteration 12 shard 3". */
  what: string;
  /** Chunks of the shard. */
  chunks: number;
  /** Chunks known to be stored. */
  chunksStored: number;
  /** Chunks generated again so far because an earlier attempt did not store them. */
  chunksRedone: number;
  /** The worker process of the attempt that sent these details. */
  worker: string;
  /** Attempts in a row that ended while their worker lived on (not a lost worker). */
  failuresOnLiveWorker: number;
  /**
   * Within the chunk being generated: samples (or moe_generate's decode steps) done of all, new
   * tokens so far, and for a chunk of episodes the furthest policy turn begun (1 = the first).
   */
  inChunk?: { chunk: number; step: number; steps: number; tokens: number; turn?: number };
  /** The episodes of the chunks stored so far, by this attempt and those before it. */
  episodes?: EpisodeStats;
}

export const stageOfActivity: Record<keyof CampaignActivities, StageName> = {
  prepareInputs: 'prepare',
  preparePolicy: 'prepare',
  rolloutShard: 'rollout',
  computeRewards: 'reward',
  validationShard: 'validation',
  scoreValidation: 'validation',
  updatePolicy: 'update',
  commitCheckpoint: 'checkpoint',
  exportPolicy: 'checkpoint',
};

/** Error type names the workflow treats as non-retryable: the input is wrong, retrying cannot help. */
export const badInputErrorType = 'BadInput';
