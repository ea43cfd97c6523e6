// The campaign spec: what a user writes in YAML, validated once by the CLI and carried by the
// workflow. Shared by CLI, workflow and activities, so it holds no I/O (the YAML parsing lives in
// cli/spec-file.ts). Unknown fields are errors: a typo must never pass silently.
import { z } from 'zod';
import { agentSchema } from './spec-agent.js';
import { algorithmSchema } from './spec-algorithm.js';
import { datasetSchema } from './spec-dataset.js';
import { engineSchema } from './spec-engine.js';
import { kubernetesLauncherSchema, kubernetesStoreProblems } from './spec-kubernetes.js';
import { exportSchema, isHfModel, modelSchema } from './spec-model.js';
import { rendezvousFields } from './spec-rendezvous.js';
import { rewardsSchema } from './spec-rewards.js';
import { validationSchema } from './spec-validation.js';

/** Names of the verifiable tasks the native core generates prompts for (docs/tasks.md). */
export const builtinTasks = ['add', 'sort', 'reverse'] as const;

const positiveInt = (max: number) => z.number().int().min(1).max(max);

/** The SFT warm start's defaults, also for specs of campaigns started before its fields existed. */
export const sftWarmStartDefaults = { lr: 3e-3, batchSize: 64 } as const;

/** The SFT warm start a spec asks for (steps 0: none). */
export function sftWarmStart(spec: {
  sftWarmStartSteps: number;
  sftWarmStartLr?: number;
  sftWarmStartBatchSize?: number;
}): { steps: number; lr: number; batchSize: number } {
  return {
    steps: spec.sftWarmStartSteps,
    lr: spec.sftWarmStartLr ?? sftWarmStartDefaults.lr,
    batchSize: spec.sftWarmStartBatchSize ?? sftWarmStartDefaults.batchSize,
  };
}

export const hyperparametersSchema = z.strictObject({
  lr: z.number().gt(0).max(1).describe('AdamW learning rate of the policy update'),
  klCoef: z
    .number()
    .min(0)
    .max(10)
    .describe('weight of the KL penalty to the reference policy (algorithm.klEstimator)'),
  clipEps: z
    .number()
    .gt(0)
    .max(1)
    .describe(
      'ratio clip below, 1 - clipEps, and above unless clipHigh is set (GSPO: its sequence ratio; CISPO: its weight)',
    ),
  clipHigh: z
    .number()
    .gt(0)
    .max(10)
    .optional()
    .describe("ratio clip above, 1 + clipHigh (DAPO's clip-higher; default: dapo 0.28, else clipEps)"),
  lossNormTokens: positiveInt(1_000_000)
    .optional()
    .describe("seq-mean-token-sum-norm's constant (default: the most tokens a sample can train)"),
  temperature: z.number().gt(0).max(5).describe('sampling temperature for rollouts'),
  topP: z.number().gt(0).max(1).describe('nucleus sampling threshold for rollouts'),
  entropyCoef: z.number().min(0).max(1).describe('weight of the entropy bonus'),
  auxLossCoef: z.number().min(0).max(1).describe('weight of the router load-balancing loss'),
  maxNewTokens: positiveInt(4096).describe('tokens generated per sample at most'),
  minibatches: positiveInt(1024).describe("optimizer steps per epoch over an iteration's samples"),
  epochs: positiveInt(64).describe("passes over an iteration's samples"),
  tisClip: z
    .number()
    .min(0)
    .max(100)
    .refine((c) => c === 0 || c >= 1, 'must be 0 (off) or at least 1')
    .describe('truncated importance sampling: cap C on the weight p_train / p_rollout, 0 = off'),
});
export type Hyperparameters = z.infer<typeof hyperparametersSchema>;

export const defaultHyperparameters: Hyperparameters = {
  lr: 3e-4,
  klCoef: 0.0,
  clipEps: 0.2,
  temperature: 1.0,
  topP: 1.0,
  entropyCoef: 0.0,
  auxLossCoef: 0.01,
  maxNewTokens: 16,
  minibatches: 4,
  epochs: 2,
  tisClip: 0,
};

const taskSchema = z.union([
  z.strictObject({ builtin: z.enum(builtinTasks) }),
  z.strictObject({
    dataset: datasetSchema.describe("the user's prompts in verl's row schema (docs/tasks.md)"),
  }),
]);

const launcherSchema = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('local'), ...rendezvousFields }),
  kubernetesLauncherSchema,
]);

const storeSchema = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('fs'), path: z.string().min(1) }),
  z.strictObject({
    kind: z.literal('s3'),
    bucket: z.string().regex(/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/, 'must be a valid S3 bucket name'),
    prefix: z.string().default(''),
    region: z.string().default('us-east-1'),
    endpoint: z.url().optional().describe('custom endpoint for S3-compatible servers'),
    forcePathStyle: z.boolean().default(false),
  }),
]);

const rewardSchema = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('verifier') }),
  z.strictObject({
    kind: z.literal('http'),
    url: z.url().describe('reward model endpoint (protocol in docs/rewards.md)'),
    timeoutMs: positiveInt(600_000).default(30_000),
    maxRetries: z.number().int().min(0).max(20).default(3),
    batchSize: positiveInt(100_000).default(64),
    rewardKind: z.enum(['binary', 'continuous']).default('continuous'),
    maxResponseBytes: positiveInt(1024 ** 3)
      .default(16 * 1024 * 1024)
      .describe('largest response body read; a larger one fails the reward stage'),
    auth: z
      .strictObject({
        header: z
          .string()
          .regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/, 'must be an HTTP header name, e.g. authorization')
          .refine(
            (h) => !['accept', 'content-type', 'content-length', 'host'].includes(h.toLowerCase()),
            'is a header the client sets itself',
          ),
        scheme: z
          .string()
          .regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/, 'must be one word, e.g. Bearer')
          .optional(),
        secretEnv: z
          .string()
          .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name')
          .optional(),
        secretFile: z.string().min(1).optional(),
      })
      .refine(
        (a) => (a.secretEnv === undefined) !== (a.secretFile === undefined),
        'needs exactly one of secretEnv and secretFile (the secret itself never goes in the spec)',
      )
      .optional()
      .describe("a header sent with every request, its secret read from the worker's environment or a file"),
  }),
]);

/** Also the value for specs of campaigns started before the field existed. */
export const defaultCommitHeartbeatSeconds = 60;

const orchestrationSchema = z.strictObject({
  continueAsNewEvery: positiveInt(10000)
    .default(50)
    .describe('iterations per workflow run before continue-as-new'),
  rolloutHeartbeatSeconds: positiveInt(3600).default(30),
  rolloutMaxFailuresOnLiveWorker: positiveInt(1000)
    .default(5)
    .describe(
      'attempts of one rollout shard in a row that may fail on a worker that stays alive before the campaign pauses (lost workers do not count)',
    ),
  updateHeartbeatSeconds: positiveInt(3600).default(120),
  commitHeartbeatSeconds: positiveInt(3600)
    .default(defaultCommitHeartbeatSeconds)
    .describe(
      'heartbeat timeout of a checkpoint commit: how soon a commit on a lost control worker is retried',
    ),
  updateMaxAttempts: positiveInt(100).default(4),
  stageTimeoutMinutes: positiveInt(7 * 24 * 60).default(240),
});

/** The most iterations a rollout may run ahead (prime-rl's max_off_policy_steps defaults to 8). */
export const maxStaleness = 8;

const stalenessSchema = z
  .number()
  .int()
  .min(0)
  .max(maxStaleness)
  .describe(
    'iterations a rollout may run ahead of the update it trains: iteration i samples from a checkpoint at least i-1-staleness',
  );

export const campaignSpecSchema = z
  .strictObject({
    name: z
      .string()
      .regex(/^[a-z0-9]([-a-z0-9]{0,46}[a-z0-9])?$/, 'must be lowercase letters, digits and dashes (≤48)'),
    task: taskSchema,
    model: modelSchema,
    iterations: positiveInt(1_000_000),
    promptsPerIteration: positiveInt(1_000_000),
    groupSize: z.number().int().min(2).max(1024).describe('samples per prompt (GRPO needs ≥2)'),
    rolloutShards: positiveInt(4096),
    chunkSize: positiveInt(1_000_000).describe(
      'prompts per rollout chunk, all samples of each (the unit of redone work)',
    ),
    epWorldSize: positiveInt(4096),
    rolloutEpWorldSize: positiveInt(4096)
      .default(1)
      .describe('moe_generate ranks per rollout shard (expert parallel; must divide model.experts)'),
    reward: rewardSchema
      .default({ kind: 'verifier' })
      .describe("the task's verifier (a dataset's: the rewards section), or an HTTP reward model"),
    rewards: rewardsSchema
      .optional()
      .describe("a dataset task's reward per data_source: built-in verifiers or your own functions"),
    agent: agentSchema
      .optional()
      .describe(
        "a dataset task's multi-turn episodes per data_source: the tools they call, their limits (docs/agents.md)",
      ),
    sftWarmStartSteps: z.number().int().min(0).max(1_000_000).default(0),
    sftWarmStartLr: z
      .number()
      .positive()
      .max(1)
      .default(sftWarmStartDefaults.lr)
      .describe(
        'peak learning rate of the SFT warm start (10 warm-up steps, then cosine decay); the default suits a small or freshly made model, a pretrained one wants about 1e-5',
      ),
    sftWarmStartBatchSize: positiveInt(4096)
      .default(sftWarmStartDefaults.batchSize)
      .describe('rows per SFT warm-start step'),
    validation: validationSchema
      .optional()
      .describe("when and how task.dataset.validation is generated and scored (docs/tasks.md, 'Validation')"),
    export: exportSchema
      .optional()
      .describe(
        "a Hugging Face model's committed checkpoints exported as model folders while the campaign runs",
      ),
    engine: engineSchema.default({ trainer: 'native', rollout: 'native' }),
    launcher: launcherSchema.default({ kind: 'local' }),
    store: storeSchema.default({ kind: 'fs', path: '.moerl/store' }),
    algorithm: algorithmSchema
      .optional()
      .describe(
        'loss, advantage estimator, aggregation and KL estimator (docs/algorithms.md; default: GRPO)',
      ),
    hyperparameters: hyperparametersSchema.partial().default({}),
    staleness: stalenessSchema.default(0),
    retention: z
      .strictObject({ keepLast: positiveInt(10000).default(3), keepBest: z.boolean().default(true) })
      .default({ keepLast: 3, keepBest: true }),
    seed: z
      .number()
      .int()
      .min(0)
      .max(2 ** 31 - 1),
    orchestration: orchestrationSchema.default(orchestrationSchema.parse({})),
  })
  .superRefine((s, ctx) => {
    const problem = (path: string[], message: string) => ctx.addIssue({ code: 'custom', path, message });
    if (isHfModel(s.model)) {
      // The expert count is the config's: the import checks it against epWorldSize.
      if ('builtin' in s.task)
        problem(
          ['task'],
          'a Hugging Face model trains on a dataset (task.dataset): the built-in tasks have their own tokenizer',
        );
      if (s.sftWarmStartSteps > 0 && 'dataset' in s.task && s.task.dataset.responseKey === undefined)
        problem(
          ['task', 'dataset', 'responseKey'],
          "the SFT warm start learns each row's reference completion: name its field (verl's SFT layout: extra_info.answer)",
        );
      if (s.engine.trainer === 'pytorch' && s.sftWarmStartSteps > 0)
        problem(
          ['sftWarmStartSteps'],
          'the SFT warm start runs on the native trainer: 0 with engine.trainer pytorch',
        );
    } else {
      if (s.engine.trainer === 'pytorch')
        problem(
          ['engine', 'trainer'],
          'pytorch trains a Hugging Face model (model.huggingFace); the native model trains with native',
        );
      if (s.engine.rollout === 'openai')
        problem(
          ['engine', 'rollout'],
          'openai samples a Hugging Face model (model.huggingFace); the native model samples with native',
        );
      if (s.export !== undefined)
        problem(['export'], "exports a Hugging Face model's checkpoints: give model.huggingFace");
      if (s.model.experts % s.epWorldSize !== 0)
        problem(
          ['epWorldSize'],
          `model.experts (${s.model.experts}) must be divisible by epWorldSize (${s.epWorldSize})`,
        );
      if (s.model.experts % s.rolloutEpWorldSize !== 0)
        problem(
          ['rolloutEpWorldSize'],
          `model.experts (${s.model.experts}) must be divisible by rolloutEpWorldSize (${s.rolloutEpWorldSize})`,
        );
      if ('dataset' in s.task)
        problem(
          ['task', 'dataset'],
          "a dataset's prompts are chat messages, rendered with a model's own chat template: give model.huggingFace",
        );
    }
    if ('dataset' in s.task && s.reward.kind !== 'http' && s.rewards === undefined)
      problem(
        ['rewards'],
        'a dataset task needs its rewards (default and/or bySource), or an http reward model',
      );
    if (s.validation !== undefined && !('dataset' in s.task && s.task.dataset.validation !== undefined))
      problem(['validation'], 'schedules the validation of task.dataset.validation: name that file too');
    if (s.agent !== undefined && !('dataset' in s.task))
      problem(['agent'], "is for dataset tasks: an episode's prompt is chat messages");
    if (s.agent !== undefined && s.engine.rollout !== 'openai')
      problem(
        ['agent'],
        'needs engine.rollout openai: moe_generate has no multi-turn mode yet (docs/agents.md)',
      );
    if ('builtin' in s.task && s.rewards !== undefined)
      problem(['rewards'], 'is for dataset tasks; a built-in task is scored by its own verifier');
    if (s.reward.kind === 'http' && s.rewards !== undefined)
      problem(['rewards'], 'goes with reward.kind verifier; an http reward model scores every sample');
    if (s.rolloutShards > s.promptsPerIteration)
      ctx.addIssue({
        code: 'custom',
        path: ['rolloutShards'],
        message: `rolloutShards (${s.rolloutShards}) must be at most promptsPerIteration (${s.promptsPerIteration})`,
      });
    for (const [path, message] of stalenessProblems(s, s.staleness))
      ctx.addIssue({ code: 'custom', path, message });
    if (s.launcher.kind === 'kubernetes')
      for (const [path, message] of kubernetesStoreProblems(s.launcher, s.store))
        ctx.addIssue({ code: 'custom', path, message });
  });

/** What staleness `staleness` would break in a campaign of `spec`: [path, message] pairs. */
function stalenessProblems(
  spec: { retention: { keepLast: number }; rolloutShards: number },
  staleness: number,
): [string[], string][] {
  const problems: [string[], string][] = [];
  // With staleness k, 1 + k checkpoints are in use at once (the update's and those the rollouts
  // running ahead sample from); retention protects them anyway, so a smaller keepLast only misleads.
  if (spec.retention.keepLast < 1 + staleness)
    problems.push([
      ['retention', 'keepLast'],
      `keepLast (${spec.retention.keepLast}) must be at least ${1 + staleness} with staleness ${staleness}: the rollouts running ahead sample from checkpoints up to ${staleness} before the latest`,
    ]);
  // Temporal fails every workflow task that would schedule past this many pending activities.
  // With staleness k a rollout phase re-run after a failed update overlaps the k phases running
  // ahead, so 1 + k iterations' shards can be in flight, plus a reward and an update or commit.
  const pending = maxPendingActivities(spec.rolloutShards, staleness);
  if (pending > temporalPendingActivityLimit)
    problems.push([
      ['rolloutShards'],
      `rolloutShards (${spec.rolloutShards}) with staleness ${staleness} can keep ${pending} activities pending, over Temporal's limit of ${temporalPendingActivityLimit} per workflow; use at most ${maxRolloutShards(staleness)} shards (larger shards with more chunks each)`,
    ]);
  return problems;
}

/** Temporal's default `limit.numPendingActivities.error`: pending activities per workflow execution. */
export const temporalPendingActivityLimit = 2000;

/** Activities a campaign can have pending at once: shards of 1 + staleness iterations, a reward, an update or commit. */
export function maxPendingActivities(rolloutShards: number, staleness: number): number {
  return (1 + staleness) * rolloutShards + 2;
}

/** The most rollout shards a campaign with this staleness may have. */
export function maxRolloutShards(staleness: number): number {
  return Math.floor((temporalPendingActivityLimit - 2) / (1 + staleness));
}

/** A spec as written (before defaults). */
export type CampaignSpecInput = z.input<typeof campaignSpecSchema>;
/** A validated spec with defaults filled in; hyperparameters are complete. */
export type CampaignSpec = Omit<z.output<typeof campaignSpecSchema>, 'hyperparameters'> & {
  hyperparameters: Hyperparameters;
};

export class SpecError extends Error {
  constructor(
    readonly problems: string[],
    where = 'campaign spec',
  ) {
    super(`${where} is invalid:\n  - ${problems.join('\n  - ')}`);
    this.name = 'SpecError';
  }
}

function describeValue(input: unknown): string {
  if (input === undefined) return 'missing';
  const json = JSON.stringify(input);
  return json.length > 60 ? `${json.slice(0, 57)}...` : json;
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let cur: unknown = root;
  for (const key of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[key];
  }
  return cur;
}

/** Turns zod issues into "field: got VALUE; ALLOWED" lines, one per problem. */
export function formatIssues(issues: readonly z.core.$ZodIssue[], input: unknown): string[] {
  return issues.flatMap((issue): string[] => {
    const field = issue.path.length ? issue.path.map(String).join('.') : '(top level)';
    if (issue.code === 'unrecognized_keys') {
      return [
        `${field === '(top level)' ? '' : field + ': '}unknown field(s) ${issue.keys.map((k) => `"${k}"`).join(', ')}`,
      ];
    }
    if (issue.code === 'invalid_union' && issue.errors.length > 0) {
      const got = `${field}: got ${describeValue(valueAt(input, issue.path))}`;
      // Every form wants a literal here (e.g. staleness 0 | 1): list them all.
      const flat = issue.errors.flat();
      if (flat.every((e) => e.code === 'invalid_value' && e.path.length === 0)) {
        const values = flat.flatMap((e) => (e.code === 'invalid_value' ? e.values : []));
        return [`${got}; expected one of ${values.map((v) => JSON.stringify(v)).join(', ')}`];
      }
      // The form the input meant is the one whose keys it uses (unknown fields deeper inside
      // are that form's own problems): report that form's problems, all of them.
      const meant = issue.errors.filter(
        (errs) => errs.length > 0 && errs.every((e) => e.code !== 'unrecognized_keys' || e.path.length > 0),
      );
      const form = meant.sort((a, b) => a.length - b.length)[0];
      if (form)
        return formatIssues(
          form.map((e) => ({ ...e, path: [...issue.path, ...e.path] })),
          input,
        );
      return [`${got}; expected one of the allowed forms (see \`moerl spec schema\`)`];
    }
    return [`${field}: got ${describeValue(valueAt(input, issue.path))}; ${issue.message}`];
  });
}

/** Validates a parsed spec document; throws SpecError listing every problem at once. */
export function parseCampaignSpec(input: unknown, where?: string): CampaignSpec {
  const result = campaignSpecSchema.safeParse(input);
  if (!result.success) throw new SpecError(formatIssues(result.error.issues, input), where);
  return {
    ...result.data,
    hyperparameters: { ...defaultHyperparameters, ...result.data.hyperparameters },
  };
}

/** What `moerl set` may change while a campaign runs: the hyperparameters and the prompts per iteration. */
const campaignChangeSchema = hyperparametersSchema
  .extend({
    promptsPerIteration: positiveInt(1_000_000).describe(
      'prompts drawn per iteration from the next rollout on (the dataset position carries on from where it is)',
    ),
    staleness: stalenessSchema,
  })
  .partial();
export type CampaignChange = z.infer<typeof campaignChangeSchema>;

/** Validates a change of a running campaign of `spec`: used by the setHyperparameters update validator. */
export function validateHyperparameterChange(
  change: unknown,
  spec: Pick<CampaignSpec, 'retention' | 'rolloutShards'>,
): CampaignChange {
  const result = campaignChangeSchema.safeParse(change);
  if (!result.success)
    throw new SpecError(formatIssues(result.error.issues, change), 'hyperparameter change');
  if (Object.keys(result.data).length === 0)
    throw new SpecError(['no hyperparameter given'], 'hyperparameter change');
  const { staleness } = result.data;
  if (staleness !== undefined) {
    const problems = stalenessProblems(spec, staleness);
    if (problems.length > 0)
      throw new SpecError(
        problems.map(([path, message]) => `staleness ${staleness}: the spec's ${path.join('.')}: ${message}`),
        'hyperparameter change',
      );
  }
  return result.data;
}

/** JSON Schema of the spec for editors (`moerl spec schema`). */
export function campaignSpecJsonSchema(): unknown {
  return z.toJSONSchema(campaignSpecSchema, { io: 'input', unrepresentable: 'any' });
}
