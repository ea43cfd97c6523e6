// A Launcher runs one training job: the rank program (workers/rank.ts) on every rank, with the
// rank contract in each rank's environment and the job's description. Local processes
// (local.ts) and a Kubernetes Indexed Job with one pod per rank (kubernetes.ts) implement it;
// both run the same rank program, so a rank behaves the same wherever it runs.
import type { TrainerEngine } from '../../workflows/spec-engine.js';
import type { CheckpointRef, StoreLocation } from '../types.js';

export type FabricProvider = 'shm' | 'tcp' | 'efa';

/**
 * What one rank does, identical on every rank (each rank reads its own rank from the contract):
 * fetch its inputs from the store into a scratch directory of its own, run the native steps,
 * upload its outputs. A rank never reads the launching worker's files. Kept small (it travels
 * in an environment variable): long lists of keys go in index objects in the store.
 */
export interface RankJob {
  store: StoreLocation;
  /**
   * Committed checkpoints, each fetched into `{work}/<dir>`: the moerl checkpoint files this rank
   * reads to train on (weights and AdamW moments), with `part: 'weights'` its weights alone (the
   * KL reference), or with `part: 'huggingFace'` the whole Hugging Face directory the checkpoint
   * holds beside them (the PyTorch trainer's policy: weights, config.json, optimizer.moerl).
   */
  checkpoints: { ref: CheckpointRef; dir: string; part?: 'weights' | 'huggingFace' }[];
  /**
   * Index objects (`{ "keys": [...] }`) naming input objects: each object is fetched into
   * `{work}/<dir>/<n>.<ext>` and the local paths, one a line, are written to `{work}/<listFile>`.
   */
  inputLists: { indexKey: string; dir: string; listFile: string }[];
  /**
   * A Hugging Face model folder to import: config.json, the index and only the safetensors
   * shards holding this rank's tensors are fetched into `{work}/<dir>` under their own names.
   * With `whole`, rank 0 fetches every shard and the other ranks nothing (the PyTorch trainer's
   * first policy is the whole folder).
   */
  hfModel?: { store: StoreLocation; prefix: string; dir: string; whole?: boolean };
  /** The program the steps run: moe_train (native, the default) or the PyTorch trainer. */
  trainer?: TrainerEngine;
  /** Argument lists run one after the other; `{work}` is the rank's scratch directory. */
  steps: string[][];
  /**
   * Rank 0, after the steps: the Hugging Face directory `{work}/<dir>` joins the checkpoint in
   * `{work}/out`, which `moe_train init --from-hf` makes of it (as a world of one rank, with
   * `initArgs` added) for the native rollouts; its files are added to the manifest.
   */
  hfCheckpoint?: { dir: string; initArgs: string[] };
  /**
   * After every step succeeded: the files of `{work}/<dir>` (not recursive; those named in
   * `only` if given, less those in `exclude`) uploaded under `prefix/`, by rank `rank` only when
   * given (the PyTorch trainer's directory is rank 0's). A rank without the directory uploads
   * nothing from it.
   */
  outputs: { dir: string; prefix: string; only?: string[]; exclude?: string[]; rank?: number }[];
}

export interface TrainJobSpec {
  /** Deterministic per scheduled activity: a retry on any worker finds and adopts its job. */
  name: string;
  worldSize: number;
  job: RankJob;
  /** Extra environment for every rank (the rank contract variables are added by the launcher). */
  env: Record<string, string>;
  provider: FabricProvider;
  /** What the job is for, as labels on everything the launcher creates. */
  owner: { campaignId: string; iteration: number; attempt: number };
  /**
   * The longest the job may run (every attempt of its activity, adopting it, together): a
   * launcher that can bound it (Kubernetes: the Job's activeDeadlineSeconds) does, unless its
   * own settings say otherwise.
   */
  maxRunSeconds?: number;
}

export type RankState = 'pending' | 'running' | 'succeeded' | 'failed';

export interface RankStatus {
  rank: number;
  state: RankState;
  exitCode: number | null;
  signal: string | null;
}

export interface JobFailure {
  rank: number | null;
  exitCode: number | null;
  signal: string | null;
  /** Tail of the failed rank's log, or the launcher's account of what went wrong. */
  logTail: string;
  /** Retrying cannot help (a rank exited 2: bad input; an image that cannot be pulled). */
  permanent: boolean;
}

export interface JobStatus {
  name: string;
  /** `queued`: waiting for a cluster queue (Kueue) to admit it; admitted again after a preemption. */
  state: 'queued' | 'running' | 'succeeded' | 'failed';
  ranks: RankStatus[];
  /** The first rank that failed, and why. */
  failure: JobFailure | null;
  /**
   * Seconds the job has waited for admission so far and seconds it has run since admitted,
   * kept apart so a long queue does not read as a slow update. Absent: a launcher without queues.
   */
  queueWaitSeconds?: number;
  runSeconds?: number;
  /**
   * Gang restarts so far: every rank of the job started again in a new rendezvous after one or
   * more ranks were lost, counted once however many ranks were lost. Absent: a launcher that
   * does not restart a job in place (the local launcher fails it, and the activity retries).
   */
  restarts?: number;
}

export interface TrainJob {
  readonly name: string;
  /** True when launch() found this job already there instead of starting it. */
  readonly adopted: boolean;
  status(): JobStatus;
  /** Resolves when the job has finished (after a failure, the other ranks are stopped first). */
  wait(): Promise<JobStatus>;
  /** Stops every rank and removes what the launcher created for the job. */
  kill(): Promise<void>;
  /** Releases what the launcher keeps for a finished job (its directory, its Job object). */
  cleanUp(): Promise<void>;
  /** The rank's combined stdout and stderr so far. */
  readLog(rank: number): Promise<Buffer>;
}

export interface Launcher {
  /**
   * Starts the job, or adopts the job of the same name that is running or has succeeded. Once
   * `signal` is aborted (the activity was cancelled) it may give up, rejecting, before it has
   * created anything; a job it returns all the same is the caller's to kill.
   */
  launch(spec: TrainJobSpec, signal?: AbortSignal): Promise<TrainJob>;
}

/** The rank contract's environment for one rank (pods set MOERL_RANK from their index). */
export const rankEnv = {
  rank: 'MOERL_RANK',
  worldSize: 'MOERL_WORLD_SIZE',
  coordinator: 'MOERL_COORDINATOR',
  /** With the coordinator's port 0: where rank 0 publishes the port the kernel gave it. */
  coordinatorPortFile: 'MOERL_COORDINATOR_PORT_FILE',
  provider: 'MOERL_FI_PROVIDER',
  job: 'MOERL_JOB',
  workDir: 'MOERL_WORK_DIR',
} as const;

/**
 * The exit code of a rank stopped by SIGTERM (128 + 15), whatever its native step made of the
 * signal: a stop is not the rank's failure (Kubernetes: the podFailurePolicy ignores it).
 */
export const rankStoppedExitCode = 143;

/**
 * The exit code of a rank that stopped because another rank of its job was lost (it died,
 * failed, or a replacement broke the rendezvous): the native tools' kPeerLostExitCode
 * (native/tools/moe_cli.h). Not the rank's own failure: every rank of the job restarts together
 * in a new rendezvous (Kubernetes: the podFailurePolicy ignores it, so it uses up no backoffLimit).
 */
export const rankPeerLostExitCode = 75;
