// Checkpoints between the native trainer's local directories and the object store (rules in
// docs/store.md, "Checkpoints"): staging and the idempotent commit with retention
// (checkpoints/commit.ts), fetching verified copies (checkpoints/fetch.ts), the worker's
// bounded cache (checkpoints/cache.ts), manifest checks and hashing (checkpoints/manifest.ts).
export { acquireCheckpoint, CheckpointCache, cacheLimitsFromEnv } from './checkpoints/cache.js';
export type { CacheLimits, CheckpointLease } from './checkpoints/cache.js';
export {
  commitCheckpoint,
  committedCheckpoint,
  stageCheckpoint,
  stageCopiedCheckpoint,
} from './checkpoints/commit.js';
export type { CommitOptions } from './checkpoints/commit.js';
export {
  fetchCheckpoint,
  fetchCheckpointForRank,
  fetchHuggingFaceForRank,
  rankFiles,
} from './checkpoints/fetch.js';
export {
  checkpointConflictErrorType,
  huggingFaceFiles,
  parseManifest,
  sha256Hex,
  sha256OfStream,
  stagedCheckpointFromManifest,
  withHuggingFaceFiles,
} from './checkpoints/manifest.js';
