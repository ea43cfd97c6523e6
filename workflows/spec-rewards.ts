// The `rewards` section of the campaign spec: the reward of each dataset row, chosen by its
// data_source (docs/tasks.md, "Bring a reward function"): a built-in verifier or the user's own
// function in verl's signature, with a default for data sources the map does not name. The
// shapes are the ones activities/rewards/functions.ts scores with. Pure zod, like spec.ts.
import { z } from 'zod';

const regexFlags = z
  .string()
  .regex(/^[dgimsuvy]*$/, 'must be JavaScript regex flags')
  .optional();

/** A pattern must compile as JavaScript compiles it where it is used (activities/rewards). */
function checkRegex(r: { pattern: string; flags?: string | undefined }, ctx: z.RefinementCtx): void {
  try {
    new RegExp(r.pattern, r.flags);
  } catch (err) {
    ctx.addIssue({ code: 'custom', path: ['pattern'], message: (err as Error).message });
  }
}

const formatSchema = z
  .strictObject({ pattern: z.string().min(1), flags: regexFlags, weight: z.number().finite() })
  .superRefine(checkRegex)
  .describe('adds weight to the score when the completion matches pattern (a JavaScript regex)');

const format = { format: formatSchema.optional() };
const functionName = z
  .string()
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a function name')
  .optional()
  .describe('default compute_score');

export const rewardChoiceSchema = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('math'), ...format }),
  z
    .strictObject({ kind: z.literal('environment'), ...format })
    .describe("an agentic episode's environment's reward (OpenEnv's, summed over its steps; 0 without one)"),
  z.strictObject({ kind: z.literal('match'), normalise: z.boolean().optional(), ...format }),
  z.strictObject({
    kind: z.literal('choice'),
    letters: z
      .string()
      .regex(/^[A-Za-z]{2,26}$/, 'must be 2 to 26 letters, e.g. ABCD')
      .optional(),
    ...format,
  }),
  z
    .strictObject({
      kind: z.literal('regex'),
      pattern: z.string().min(1),
      flags: regexFlags,
      normalise: z.boolean().optional(),
      ...format,
    })
    .superRefine(checkRegex),
  z.strictObject({ kind: z.literal('json-schema'), schema: z.unknown().optional(), ...format }),
  z
    .strictObject({
      kind: z.literal('python'),
      module: z
        .string()
        .regex(/^[A-Za-z_][\w.]*:[A-Za-z_]\w*$/, 'must be package.module:function')
        .optional(),
      path: z.array(z.string().min(1)).optional().describe('folders searched for module'),
      file: z.string().min(1).optional(),
      function: functionName,
      ...format,
    })
    .superRefine((r, ctx) => {
      if ((r.module === undefined) === (r.file === undefined))
        ctx.addIssue({
          code: 'custom',
          message: 'needs exactly one of module (package.module:function) and file',
        });
      if (r.module !== undefined && r.function !== undefined)
        ctx.addIssue({
          code: 'custom',
          path: ['function'],
          message: 'goes with file; module names its function',
        });
      if (r.file !== undefined && r.path !== undefined)
        ctx.addIssue({
          code: 'custom',
          path: ['path'],
          message: 'goes with module; a file is found by its path',
        });
    }),
  z.strictObject({ kind: z.literal('js'), file: z.string().min(1), function: functionName, ...format }),
]);
export type RewardChoiceSpec = z.output<typeof rewardChoiceSchema>;

export const rewardsSchema = z
  .strictObject({
    default: rewardChoiceSchema.optional().describe('the reward of a data source bySource does not name'),
    bySource: z.record(z.string().min(1), rewardChoiceSchema).optional(),
  })
  .refine((r) => r.default !== undefined || Object.keys(r.bySource ?? {}).length > 0, {
    message: 'needs a default, bySource entries, or both',
  });
export type RewardsSpec = z.output<typeof rewardsSchema>;
