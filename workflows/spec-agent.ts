// The `agent` section of the campaign spec: which dataset rows are multi-turn episodes and with
// which tools (sandboxed Python functions or an MCP server's), chosen by the row's data_source as
// rewards are (docs/agents.md). A data source with no environment stays a one-shot completion.
// Pure zod, like spec.ts: workflows import it.
import { z } from 'zod';

/** The sandboxed tools moerl ships (activities/agents/python/builtin_tools.py). */
export const builtinTools = ['calculator', 'python'] as const;

// A tool as the chat template and the parser take it (OpenAI's function-calling form); its
// parameters' JSON Schema is compiled where it is used (activities/agents/tool-calls.ts).
const toolFunctionSchema = z.strictObject({
  type: z.literal('function'),
  function: z.strictObject({
    name: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a Python function name'),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional().describe('JSON Schema of the arguments object'),
  }),
});

const sandboxToolsSchema = z
  .strictObject({
    kind: z.literal('tools').describe('Python functions run in the reward sandbox (no network)'),
    builtin: z
      .array(z.enum(builtinTools))
      .min(1)
      .optional()
      .describe('the shipped tools the episode may call'),
    file: z
      .string()
      .min(1)
      .optional()
      .describe('a Python file of your tool functions, on the rollout workers'),
    functions: z
      .array(toolFunctionSchema)
      .min(1)
      .optional()
      .describe("the file's functions the model is given, with their schemas"),
  })
  .superRefine((e, ctx) => {
    if ((e.builtin === undefined) === (e.file === undefined))
      ctx.addIssue({ code: 'custom', message: 'needs exactly one of builtin (the shipped tools) and file' });
    if ((e.file === undefined) !== (e.functions === undefined))
      ctx.addIssue({
        code: 'custom',
        path: [e.file === undefined ? 'functions' : 'file'],
        message: 'file and functions go together: the file holds the functions the schemas declare',
      });
    const names = e.builtin ?? e.functions?.map((f) => f.function.name) ?? [];
    const twice = names.find((n, i) => names.indexOf(n) !== i);
    if (twice !== undefined) ctx.addIssue({ code: 'custom', message: `names the tool ${twice} twice` });
  });

// An environment variable's name: what a spec may say of the worker's secrets (never their values,
// which would sit in the workflow's history).
const envName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name');

const mcpSchema = z
  .strictObject({
    kind: z.literal('mcp').describe("a Model Context Protocol server's tools (tools/list, tools/call)"),
    command: z
      .array(z.string().min(1))
      .min(1)
      .optional()
      .describe('stdio: the argv of the server, started by each rollout worker for each shard'),
    inheritEnv: z
      .array(envName)
      .optional()
      .describe(
        "stdio: the worker's environment variables the server is given (PATH, HOME and the like always)",
      ),
    url: z
      .url({ protocol: /^https?$/ })
      .optional()
      .describe('streamable HTTP: the endpoint of a running server'),
    headersFromEnv: z
      .record(z.string().min(1), envName)
      .optional()
      .describe(
        "streamable HTTP: headers sent with each request, each from the worker's environment variable",
      ),
    tools: z
      .array(z.string().min(1))
      .min(1)
      .optional()
      .describe("the server's tools the model is given (default: every tool it lists)"),
  })
  .superRefine((e, ctx) => {
    if ((e.command === undefined) === (e.url === undefined))
      ctx.addIssue({
        code: 'custom',
        message: 'needs exactly one of command (stdio) and url (streamable HTTP)',
      });
    if (e.inheritEnv !== undefined && e.command === undefined)
      ctx.addIssue({ code: 'custom', path: ['inheritEnv'], message: 'is for a server started by command' });
    if (e.headersFromEnv !== undefined && e.url === undefined)
      ctx.addIssue({ code: 'custom', path: ['headersFromEnv'], message: 'is for a server at a url' });
    const twice = e.tools?.find((n, i) => e.tools!.indexOf(n) !== i);
    if (twice !== undefined) ctx.addIssue({ code: 'custom', message: `names the tool ${twice} twice` });
  });

const openEnvSchema = z.strictObject({
  kind: z.literal('openenv').describe('an OpenEnv environment: its state, its reward and its end its own'),
  url: z.url({ protocol: /^https?$/ }).describe('the running server (its /ws, /schema)'),
  tool: z
    .string()
    .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a function name')
    .default('act')
    .describe("the name of the tool the model acts with (its arguments: the environment's action)"),
  description: z.string().optional().describe("the tool's description for the model"),
  resetArgs: z
    .record(z.string(), z.unknown())
    .optional()
    .describe("what each episode's reset is sent beside its seed"),
});

const environmentSchema = z.discriminatedUnion('kind', [sandboxToolsSchema, mcpSchema, openEnvSchema]);
export type AgentEnvironmentSpec = z.output<typeof environmentSchema>;
export type SandboxToolsSpec = z.output<typeof sandboxToolsSchema>;
export type McpServerSpec = z.output<typeof mcpSchema>;
export type OpenEnvSpec = z.output<typeof openEnvSchema>;

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
