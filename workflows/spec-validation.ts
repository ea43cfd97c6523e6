// The `validation` section of the campaign spec: when and how a dataset task's held-out prompts
// (task.dataset.validation) are generated and scored. Pure zod and pure functions, like spec.ts:
// the workflow imports them to decide which checkpoints to validate.
import { z } from 'zod';
import type { CampaignSpec } from './spec.js';

const positiveInt = (max: number) => z.number().int().min(1).max(max);

export const validationSchema = z.strictObject({
  everyIterations: positiveInt(1_000_000)
    .default(10)
    .describe('checkpoints validated: the initial policy, every N-th and the last'),
  samples: positiveInt(1024).default(1).describe('completions per prompt: pass@k is over these k samples'),
  temperature: z
    .number()
    .min(0)
    .max(5)
    .default(0)
    .describe('sampling temperature of validation completions (0: greedy)'),
  topP: z.number().gt(0).max(1).default(1),
  maxNewTokens: positiveInt(4096)
    .optional()
    .describe("tokens generated per completion at most (default: the campaign's maxNewTokens)"),
  maxPrompts: positiveInt(100_000_000)
    .optional()
    .describe('validate on the first N rows of the file only (default: every row)'),
  shards: positiveInt(1024).default(1).describe('rollout activities the validation set is split over'),
});
export type ValidationSpec = z.output<typeof validationSchema>;

/** Settings of a campaign whose dataset names a validation file but whose spec has no section. */
export const defaultValidation: ValidationSpec = validationSchema.parse({});

/** Whether checkpoint `iteration` is validated: the initial policy, every N-th and the campaign's last. */
export function validatesCheckpoint(v: ValidationSpec, iteration: number, lastIteration: number): boolean {
  return iteration % v.everyIterations === 0 || iteration === lastIteration;
}

/**
 * The validation a campaign runs: its spec's section, or the defaults when the dataset names a
 * validation file without one; none without a validation file.
 */
export function campaignValidation(spec: CampaignSpec): ValidationSpec | undefined {
  if (!('dataset' in spec.task) || spec.task.dataset.validation === undefined) return undefined;
  return spec.validation ?? defaultValidation;
}

/** Prompts of a validation file of `rows` rows that are validated: the first maxPrompts, or all. */
export function validationPromptCount(v: ValidationSpec, rows: number): number {
  return Math.min(rows, v.maxPrompts ?? rows);
}
