// Where a campaign's artifacts live in the store (docs/store.md). Keys are deterministic, so a
// retried activity overwrites its own partial output instead of adding to it.
const pad6 = (n: number) => String(n).padStart(6, '0');

export const campaignPrefix = (campaignId: string) => `campaigns/${campaignId}`;
export const specKey = (campaignId: string) => `${campaignPrefix(campaignId)}/spec.json`;
export const latestKey = (campaignId: string) => `${campaignPrefix(campaignId)}/LATEST`;

export const checkpointsPrefix = (campaignId: string) => `${campaignPrefix(campaignId)}/checkpoints`;
export const checkpointKey = (campaignId: string, iteration: number) =>
  `${checkpointsPrefix(campaignId)}/${pad6(iteration)}`;
export const manifestName = 'manifest.json';

/**
 * The files of the Hugging Face model a campaign started from, besides its weights: config.json
 * (what an export writes back), the tokenizer, chat template and generation config (what
 * rollouts render prompts with and stop on). Copied in when the campaign prepares its policy.
 */
export const modelPrefix = (campaignId: string) => `${campaignPrefix(campaignId)}/model`;
/** Those files by name, as moe_hf export copies them (native/io/hf.cc, hf_side_files). */
export const hfModelFiles = [
  'config.json',
  'generation_config.json',
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'chat_template.jinja',
  'vocab.json',
  'merges.txt',
  'tokenizer.model',
  'added_tokens.json',
] as const;

/** A Hugging Face model's SFT warm start examples as token ids (moe_train sft --data), rendered once. */
export const sftExamplesKey = (campaignId: string) => `${campaignPrefix(campaignId)}/sft/examples.jsonl`;

export const rolloutShardPrefix = (campaignId: string, iteration: number, shard: number) =>
  `${campaignPrefix(campaignId)}/rollouts/${pad6(iteration)}/shard-${shard}`;
export const rolloutChunkKey = (campaignId: string, iteration: number, shard: number, chunk: number) =>
  `${rolloutShardPrefix(campaignId, iteration, shard)}/chunk-${chunk}.jsonl`;

// A validated checkpoint's completions and scores, kept with the campaign (they are its record).
export const validationPrefix = (campaignId: string, iteration: number) =>
  `${campaignPrefix(campaignId)}/validation/${pad6(iteration)}`;
export const validationChunkKey = (campaignId: string, iteration: number, shard: number, chunk: number) =>
  `${validationPrefix(campaignId, iteration)}/shard-${shard}/chunk-${chunk}.jsonl`;
export const validationScoresKey = (campaignId: string, iteration: number) =>
  `${validationPrefix(campaignId, iteration)}/scores.json`;

export const rewardKey = (campaignId: string, iteration: number, shard: number) =>
  `${campaignPrefix(campaignId)}/rewards/${pad6(iteration)}/shard-${shard}.jsonl`;
export const metricsKey = (campaignId: string, iteration: number) =>
  `${campaignPrefix(campaignId)}/metrics/${pad6(iteration)}.json`;
export const rankLogKey = (campaignId: string, iteration: number, attempt: number, rank: number) =>
  `${campaignPrefix(campaignId)}/logs/${pad6(iteration)}/${attempt}/rank-${rank}.log`;

/** The iteration a checkpoint key names, or null for anything else under checkpoints/. */
export function checkpointIterationOf(key: string): number | null {
  const m = /\/checkpoints\/(\d{6})(?:\/|$)/.exec(key);
  return m ? Number(m[1]) : null;
}

/** A training job's exchange area: its input index objects and what rank 0 reports back. */
export const jobPrefix = (campaignId: string, jobName: string) =>
  `${campaignPrefix(campaignId)}/jobs/${jobName}`;
