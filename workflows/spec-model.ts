// The `model` section of the campaign spec: moerl's own architecture, initialised at random from
// its shape, or a Hugging Face model directory (Qwen3-MoE, Mixtral) in the store or an S3 bucket,
// whose config.json gives the shape. Pure zod, like spec.ts: workflows import it.
import { z } from 'zod';
import { parseDatasetRef, type DatasetRef } from './spec-dataset.js';

const positiveInt = (max: number) => z.number().int().min(1).max(max);

export const nativeModelSchema = z
  .strictObject({
    layers: positiveInt(64),
    hidden: positiveInt(16384),
    heads: positiveInt(256),
    experts: positiveInt(1024),
    topK: positiveInt(16),
    expertHidden: positiveInt(65536).optional().describe('width of each expert; default: hidden'),
    contextLength: positiveInt(65536).default(32).describe('positions the model can attend over'),
  })
  .superRefine((m, ctx) => {
    if (m.hidden % m.heads !== 0)
      ctx.addIssue({
        code: 'custom',
        path: ['hidden'],
        message: `hidden (${m.hidden}) must be divisible by heads (${m.heads})`,
      });
    if (m.topK > m.experts)
      ctx.addIssue({
        code: 'custom',
        path: ['topK'],
        message: `topK (${m.topK}) must be at most experts (${m.experts})`,
      });
  });

/**
 * A model directory: a store key prefix (`models/qwen3-30b-a3b`) or `s3://bucket/prefix`, read
 * the way datasets are (docs/hf-models.md). A trailing slash is allowed.
 */
export function parseModelRef(ref: string): DatasetRef | string {
  const parsed = parseDatasetRef(ref.replace(/\/+$/, ''));
  return typeof parsed === 'string' ? parsed.replace('must name a file', 'must name a folder') : parsed;
}

/** A folder of the campaign's store or of an S3 bucket (parseModelRef). */
const folderRef = (what: string) =>
  z
    .string()
    .superRefine((ref, ctx) => {
      const parsed = parseModelRef(ref);
      if (typeof parsed === 'string') ctx.addIssue({ code: 'custom', message: parsed });
    })
    .describe(what);

export const hfModelSchema = z.strictObject({
  huggingFace: folderRef(
    "a Hugging Face model folder (config.json, safetensors with or without model.safetensors.index.json, tokenizer.json, tokenizer_config.json): a key prefix of the campaign's store (models/qwen3-moe) or s3://bucket/prefix",
  ),
  contextLength: positiveInt(1 << 20)
    .optional()
    .describe(
      "positions the policy attends over (prompt + completion); default: the config's max_position_embeddings, bounded by the trainer's KV-cache budget",
    ),
});

export const modelSchema = z.union([nativeModelSchema, hfModelSchema]);

/** Every committed checkpoint of a Hugging Face campaign exported as a model folder vLLM or SGLang can serve. */
export const exportSchema = z.strictObject({
  to: folderRef(
    "where exports go: a key prefix of the campaign's store or s3://bucket/prefix; checkpoint i at <to>/<i, 6 digits>/",
  ),
  everyIterations: positiveInt(1_000_000)
    .default(1)
    .describe('export the checkpoint of every N-th iteration, and the last'),
});
export type ExportSpec = z.output<typeof exportSchema>;
export type ModelSpec = z.output<typeof modelSchema>;
export type NativeModelSpec = z.output<typeof nativeModelSchema>;
export type HfModelSpec = z.output<typeof hfModelSchema>;

export function isHfModel(model: ModelSpec): model is HfModelSpec {
  return 'huggingFace' in model;
}
