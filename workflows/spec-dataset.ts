// The `task: { dataset: … }` section of the campaign spec: a prompt dataset of the user's own,
// in verl's row schema by default (docs/tasks.md, "Datasets"), with the column names mapped
// where a file uses others. Pure zod, like spec.ts: workflows import it. Reading and
// validating the rows themselves is the dataset layer's job (activities/datasets/).
import { z } from 'zod';

export const datasetFormats = ['parquet', 'jsonl'] as const;
export type DatasetFormat = (typeof datasetFormats)[number];

const s3Bucket = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;

/** Where a dataset file lives: an object of the campaign's store, or an object in an S3 bucket. */
export type DatasetRef = { kind: 'store'; key: string } | { kind: 's3'; bucket: string; key: string };

/**
 * Reads a dataset reference: `s3://bucket/key` is an object in that bucket (reached with the
 * campaign store's S3 settings when it has them), anything else a key of the campaign's store
 * (`datasets/gsm8k/train.parquet`). Returns the problem as a string when it is malformed.
 */
export function parseDatasetRef(ref: string): DatasetRef | string {
  if (ref.startsWith('s3://')) {
    const rest = ref.slice('s3://'.length);
    const slash = rest.indexOf('/');
    const bucket = slash < 0 ? rest : rest.slice(0, slash);
    const key = slash < 0 ? '' : rest.slice(slash + 1);
    if (!s3Bucket.test(bucket)) return `"${bucket}" is not a valid S3 bucket name`;
    const problem = keyProblem(key);
    return problem ? `the object key ${problem}` : { kind: 's3', bucket, key };
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(ref)) return 'only s3:// URIs and store keys are datasets';
  const problem = keyProblem(ref);
  return problem ? `a store key ${problem}` : { kind: 'store', key: ref };
}

function keyProblem(key: string): string | undefined {
  if (key === '') return 'is empty';
  if (key.startsWith('/'))
    return 'must be relative to the store (no leading /): a worker reads datasets from the store, never its own disk';
  if (key.endsWith('/')) return 'must name a file (no trailing /)';
  if (key.split('/').some((s) => s === '' || s === '.' || s === '..'))
    return 'has an empty, "." or ".." segment';
  return undefined;
}

const datasetRef = (what: string) =>
  z
    .string()
    .superRefine((ref, ctx) => {
      const parsed = parseDatasetRef(ref);
      if (typeof parsed === 'string') ctx.addIssue({ code: 'custom', message: parsed });
    })
    .describe(`${what}: a key of the campaign's store (datasets/train.parquet) or s3://bucket/key`);

// A column, or a dotted path into a struct column: reward_model.ground_truth.
const path = z
  .string()
  .regex(
    /^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$/,
    'must be a column name or a dotted path into one, e.g. reward_model.ground_truth',
  );
const fieldPath = (what: string, fallback: string) =>
  path.default(fallback).describe(`${what} (default ${fallback})`);

export const datasetSchema = z.strictObject({
  train: datasetRef('the training prompts'),
  validation: datasetRef('held-out prompts scored on a schedule').optional(),
  format: z.enum(datasetFormats).describe('parquet (read by row groups) or jsonl (one JSON object a line)'),
  promptKey: fieldPath('the prompt: chat messages [{role, content}] or one string (a user turn)', 'prompt'),
  dataSourceKey: fieldPath('the name that chooses the reward function of a row', 'data_source'),
  groundTruthKey: fieldPath(
    "the reference answer given to the row's reward function",
    'reward_model.ground_truth',
  ),
  abilityKey: fieldPath('the task category, copied into the records', 'ability'),
  extraInfoKey: fieldPath("an object handed to the row's reward function as is", 'extra_info'),
  responseKey: path
    .optional()
    .describe(
      "the reference completion of a row (a string, or a multi-turn demonstration: the assistant and tool turns after the prompt), learned by the SFT warm start (sftWarmStartSteps); verl's SFT layout keeps it at extra_info.answer",
    ),
});
export type DatasetSpec = z.output<typeof datasetSchema>;
