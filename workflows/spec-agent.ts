// The `agent` section of the campaign spec: which dataset rows are multi-turn episodes and with
// which tools, chosen by the row's data_source as rewards are (docs/agents.md). A data source with
// no environment stays a one-shot completion. Pure zod, like spec.ts: workflows import it.
import { z } from 'zod';

/** The sandboxed tools moerl ships (activities/agents/python/builtin_tools.py). */
export const builtinTools = ['calculator', 'python'] as const;

const environmentSchema = z.strictObject({
  kind: z.literal('tools').describe('Python functions run in the reward sandbox (no network)'),
  builtin: z
    .array(z.enum(builtinTools))
    .min(1)
    .refine((t) => new Set(t).size === t.length, 'names a tool twice')
    .describe('the shipped tools the episode may call'),
});
export type AgentEnvironmentSpec = z.output<typeof environmentSchema>;

export const agentSchema = z
  .strictObject({
    toolCallFormat: z
      .enum(['hermes', 'mistral'])
      .default('hermes')
      .describe("how the model writes tool calls: hermes (Qwen3's <tool_call>) or mistral ([TOOL_CALLS])"),
    default: environmentSchema.optional().describe('the environment of a data source bySource does not name'),
    bySource: z.record(z.string().min(1), environmentSchema).optional(),
    maxTurns: z.number().int().min(1).max(256).default(8).describe('policy turns per episode at most'),
    maxEpisodeTokens: z
      .number()
      .int()
      .min(1)
      .max(1_000_000)
      .optional()
      .describe(
        "completion ids of an episode at most, the environment's included (default: the model's context)",
      ),
    toolCallSeconds: z.number().positive().max(3600).default(10).describe('wall time of one tool call'),
    episodeSeconds: z.number().positive().max(86_400).default(300).describe('wall time of one episode'),
  })
  .refine((a) => a.default !== undefined || Object.keys(a.bySource ?? {}).length > 0, {
    message: 'needs a default environment, bySource entries, or both',
  });
export type AgentSpec = z.output<typeof agentSchema>;

/** The environment of rows of `dataSource`, or undefined: a one-shot completion. */
export function agentEnvironment(
  agent: AgentSpec | undefined,
  dataSource: string,
): AgentEnvironmentSpec | undefined {
  if (!agent) return undefined;
  const bySource = agent.bySource ?? {};
  return Object.hasOwn(bySource, dataSource) ? bySource[dataSource] : agent.default;
}
