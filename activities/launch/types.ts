// A Launcher runs one training job: the same native command on every rank, with the rank
// contract (docs/native-ep.md) in each rank's environment. Local processes or a Kubernetes
// Indexed Job (one pod per rank) implement it.

export type FabricProvider = 'shm' | 'tcp' | 'efa';

export interface TrainJobSpec {
  /** Deterministic per (campaign, iteration, attempt group): a retry finds and adopts its job. */
  name: string;
  worldSize: number;
  /** Executable and arguments, identical on every rank. */
  command: string[];
  /** Extra environment for every rank (the rank contract variables are added by the launcher). */
  env: Record<string, string>;
  provider: FabricProvider;
}

export type RankState = 'running' | 'succeeded' | 'failed';

export interface RankStatus {
  rank: number;
  state: RankState;
  exitCode: number | null;
  signal: string | null;
}

export interface JobStatus {
  name: string;
  state: RankState;
  ranks: RankStatus[];
  /** The first rank that failed, and why (its exit and the tail of its log). */
  failure: { rank: number; exitCode: number | null; signal: string | null; logTail: string } | null;
}

export interface TrainJob {
  readonly name: string;
  /** True when launch() found this job already running instead of starting it. */
  readonly adopted: boolean;
  status(): JobStatus;
  /** Resolves when every rank has exited (after a failure, the others are stopped first). */
  wait(): Promise<JobStatus>;
  /** Stops every rank. */
  kill(): Promise<void>;
  /** The rank's combined stdout and stderr so far. */
  readLog(rank: number): Promise<Buffer>;
}

export interface Launcher {
  /** Starts the job, or adopts the running job of the same name. */
  launch(spec: TrainJobSpec): Promise<TrainJob>;
}
