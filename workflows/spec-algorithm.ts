// The `algorithm` section of the campaign spec: which loss family, advantage estimator,
// aggregation and KL estimator a campaign trains with (docs/algorithms.md). Fixed per campaign;
// its numbers (clipEps, clipHigh, lossNormTokens, klCoef) are hyperparameters, changed by
// `moerl set`. Pure zod and pure functions, like spec.ts.
import { z } from 'zod';
import type { CampaignSpec, Hyperparameters } from './spec.js';

export const algorithmNames = ['grpo', 'dr_grpo', 'dapo', 'gspo', 'cispo'] as const;
export type AlgorithmName = (typeof algorithmNames)[number];
const advantageEstimators = ['group-norm', 'group-mean', 'rloo', 'reinforce-pp-baseline'] as const;
const aggregations = [
  'token-mean',
  'seq-mean-token-sum',
  'seq-mean-token-mean',
  'seq-mean-token-sum-norm',
] as const;

export const algorithmSchema = z.strictObject({
  loss: z.enum(algorithmNames).default('grpo').describe('the recipe: its policy loss and its defaults below'),
  advantage: z
    .enum(advantageEstimators)
    .optional()
    .describe("advantage estimator of the outcome rewards (default: the recipe's)"),
  aggregation: z
    .enum(aggregations)
    .optional()
    .describe("how token losses make the step's loss, by verl's names (default: the recipe's)"),
  klEstimator: z
    .enum(['k1', 'k2', 'k3'])
    .default('k3')
    .describe('estimator of the KL to the reference policy (weight: klCoef)'),
  klPenalty: z
    .enum(['loss', 'reward'])
    .default('loss')
    .describe(
      "where the KL goes: a term of the loss, or a penalty on each sample's reward before its advantage",
    ),
  overlong: z
    .strictObject({
      bufferTokens: z
        .number()
        .int()
        .positive()
        .optional()
        .describe(
          "DAPO's soft overlong penalty: a sample whose policy tokens reach into the last bufferTokens " +
            'before the longest it may have loses reward linearly, `penalty` at the limit',
        ),
      penalty: z.number().positive().max(100).default(1).describe('the penalty at the length limit'),
      filter: z
        .boolean()
        .default(false)
        .describe(
          "DAPO's overlong filtering: samples cut at the length limit (finish_reason length) are not trained on",
        ),
    })
    .refine((o) => o.bufferTokens !== undefined || o.filter, {
      message: 'give bufferTokens (the soft penalty), filter: true, or both',
    })
    .optional()
    .describe("DAPO's overlong handling (docs/algorithms.md)"),
  dynamicSampling: z
    .strictObject({
      maxRounds: z
        .number()
        .int()
        .min(1)
        .max(16)
        .default(4)
        .describe('further draws per iteration at most, each a rollout and a reward of its own'),
      promptsPerRound: z
        .number()
        .int()
        .positive()
        .max(1_000_000)
        .optional()
        .describe("prompts per further draw (default: the iteration's own count)"),
    })
    .optional()
    .describe(
      "DAPO's dynamic sampling: while fewer groups than the iteration's prompts carry signal, draw more " +
        "prompts from the iteration's reserve (docs/algorithms.md)",
    ),
});
export type AlgorithmSpec = z.output<typeof algorithmSchema>;

/** Also the section of campaigns started before it existed: today's GRPO. */
export const defaultAlgorithm: AlgorithmSpec = { loss: 'grpo', klEstimator: 'k3', klPenalty: 'loss' };

/** Each recipe's policy loss and defaults (docs/algorithms.md gives the formulas and papers). */
const recipes: Record<
  AlgorithmName,
  {
    policyLoss: 'ppo-clip' | 'gspo' | 'cispo';
    advantage: (typeof advantageEstimators)[number];
    aggregation: (typeof aggregations)[number];
    clipHigh?: number;
  }
> = {
  grpo: { policyLoss: 'ppo-clip', advantage: 'group-norm', aggregation: 'token-mean' },
  dr_grpo: { policyLoss: 'ppo-clip', advantage: 'group-mean', aggregation: 'seq-mean-token-sum-norm' },
  dapo: { policyLoss: 'ppo-clip', advantage: 'group-norm', aggregation: 'token-mean', clipHigh: 0.28 },
  gspo: { policyLoss: 'gspo', advantage: 'group-norm', aggregation: 'seq-mean-token-mean' },
  cispo: { policyLoss: 'cispo', advantage: 'group-norm', aggregation: 'token-mean' },
};

/**
 * The most tokens one sample can train: maxNewTokens a turn, over an agent's turns (its
 * maxEpisodeTokens also counts the environment's, so it bounds them too). Dr.GRPO's constant.
 */
export function longestCompletion(spec: Pick<CampaignSpec, 'agent'>, hp: Hyperparameters): number {
  if (!spec.agent) return hp.maxNewTokens;
  return Math.min(hp.maxNewTokens * spec.agent.maxTurns, spec.agent.maxEpisodeTokens ?? Infinity);
}

/** What the reward activity needs of DAPO's overlong penalty in one iteration (activities/rewards/overlong.ts). */
export interface OverlongShaping {
  /** L_max: the most policy tokens a sample can have (longestCompletion). */
  maxTokens: number;
  /** L_cache: the buffer before L_max over which the penalty grows. */
  bufferTokens: number;
  /** The penalty at L_max. */
  penalty: number;
}

/** The iteration's overlong penalty, or undefined when the campaign has none. */
export function overlongShaping(
  spec: Pick<CampaignSpec, 'algorithm' | 'agent'>,
  hp: Hyperparameters,
): OverlongShaping | undefined {
  const o = spec.algorithm?.overlong;
  if (o?.bufferTokens === undefined) return undefined;
  return { maxTokens: longestCompletion(spec, hp), bufferTokens: o.bufferTokens, penalty: o.penalty };
}

/** The trainers' loss flags for a campaign's algorithm and an iteration's hyperparameters. */
export function algorithmFlags(
  spec: Pick<CampaignSpec, 'algorithm' | 'agent'>,
  hp: Hyperparameters,
): string[] {
  const a = spec.algorithm ?? defaultAlgorithm;
  const recipe = recipes[a.loss];
  const aggregation = a.aggregation ?? recipe.aggregation;
  // prettier-ignore
  return [
    '--policy-loss', recipe.policyLoss,
    '--advantage', a.advantage ?? recipe.advantage,
    '--aggregation', aggregation,
    '--kl-estimator', a.klEstimator,
    '--clip-eps', String(hp.clipEps),
    '--clip-high', String(hp.clipHigh ?? recipe.clipHigh ?? hp.clipEps),
    ...(aggregation === 'seq-mean-token-sum-norm'
      ? ['--norm-tokens', String(hp.lossNormTokens ?? longestCompletion(spec, hp))]
      : []),
    ...(a.overlong?.filter ? ['--mask-truncated'] : []),
    // a klCoef of 0 (moerl set) runs without the reference at all
    ...(a.klPenalty === 'reward' && hp.klCoef > 0 ? ['--kl-in-reward'] : []),
  ];
}
