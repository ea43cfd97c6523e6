// The dataset layer: prompt datasets of the user's own (Parquet or JSONL, verl's row schema),
// validated before a campaign starts, identified by their content hash, sampled
// deterministically by (seed, epoch) and read by row index by the shards (docs/tasks.md,
// "Datasets").
export { DatasetChangedError, DatasetError, defaultMaxProblems } from './errors.js';
export {
  datasetLimitEnv,
  datasetLimitsFromEnv,
  defaultDatasetLimits,
  maxNestingDepth,
  type DatasetLimits,
} from './limits.js';
export { readDatasetRows, type ReadRowsOptions } from './read.js';
export { verlColumns, type ChatMessage, type DatasetColumns, type DatasetRow } from './rows.js';
export {
  advancePosition,
  drawPrompts,
  epochPermutation,
  iterationPosition,
  shardPrompts,
  startPosition,
  type DatasetPosition,
  type DrawnPrompt,
  type SamplingInput,
  type ShardRange,
} from './sampling.js';
export {
  datasetLocation,
  hashDataset,
  localCopy,
  type DatasetIdentity,
  type DatasetInput,
} from './source.js';
export { validateDataset, type PromptLimit, type RewardMapping, type ValidateOptions } from './validate.js';
