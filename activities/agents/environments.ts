// The environments of an agentic campaign's rollout shard (spec `agent`, docs/agents.md: sandboxed
// tools, an MCP server, an OpenEnv environment): per entry of the spec, its tools (what a prompt of its data sources is rendered with and its calls
// are checked against) and what runs their calls, opened the first time a row needs it and
// closed with the shard. The prompts and the episodes of a shard see one list of tools: an MCP
// server is listed once per shard.
import {
  agentEnvironment,
  type AgentEnvironmentSpec,
  type AgentSpec,
  type SandboxToolsSpec,
} from '../../workflows/spec-agent.js';
import type { ToolRunner } from './episode.js';
import { mcpTools } from './mcp-tools.js';
import { openEnvTools } from './openenv-tools.js';
import { builtinToolSchemas, sandboxToolRunner } from './sandbox-tools.js';
import { ToolCallParser, type ToolSchema } from './tool-calls.js';

/** What runs an environment's calls. */
export interface EnvironmentRunner extends ToolRunner {
  /** Stops what it started; calls after fail. */
  close(): void | Promise<void>;
  /** An environment with state (OpenEnv): the runner of one episode, its session its own. */
  episode?(seed: number): ToolRunner & { close(): Promise<void> };
}

export interface OpenEnvironment {
  /** The schemas of its tools: what the chat template and the parser are given. */
  tools: readonly ToolSchema[];
  parser: ToolCallParser;
  runner: EnvironmentRunner;
}

export type EnvironmentOpener = (
  agent: AgentSpec,
  env: AgentEnvironmentSpec,
) => Promise<{ tools: readonly ToolSchema[]; runner: EnvironmentRunner }>;

/** Opens the tools of one environment of the spec: a sandboxed pool, or an MCP server's session. */
const openEnvironment: EnvironmentOpener = async (agent, env) => {
  // A call is stopped where the episode stops waiting for it.
  const timeoutMs = agent.toolCallSeconds * 1000;
  if (env.kind === 'openenv') return openEnvTools(env, { connectMs: Math.max(timeoutMs, 30_000) });
  if (env.kind === 'mcp') {
    const mcp = await mcpTools(env, { connectMs: Math.max(timeoutMs, 30_000) });
    return { tools: mcp.tools, runner: mcp };
  }
  const tools = sandboxEnvironmentTools(env);
  const file = env.file !== undefined ? { tools: { file: env.file, tools } } : {};
  return { tools, runner: sandboxToolRunner({ timeoutMs, ...file }) };
};

/** The schemas of a sandboxed environment's tools, in the order it names them. */
export function sandboxEnvironmentTools(env: SandboxToolsSpec): ToolSchema[] {
  if (env.functions) return env.functions as ToolSchema[];
  return env.builtin!.map((name) => builtinToolSchemas.find((t) => t.function.name === name)!);
}

export class ShardEnvironments {
  private readonly opened = new Map<AgentEnvironmentSpec, Promise<OpenEnvironment>>();
  private closed = false;

  constructor(
    readonly agent: AgentSpec,
    private readonly open: EnvironmentOpener = openEnvironment,
  ) {}

  /** The environment of rows of `dataSource`, opened once; undefined: a one-shot completion. */
  of(dataSource: string): Promise<OpenEnvironment | undefined> {
    const env = agentEnvironment(this.agent, dataSource);
    if (!env) return Promise.resolve(undefined);
    if (this.closed) return Promise.reject(new Error("the shard's environments are closed"));
    let opening = this.opened.get(env);
    if (!opening) {
      opening = this.open(this.agent, env).then(({ tools, runner }) => ({
        tools,
        parser: new ToolCallParser(tools, this.agent.toolCallFormat),
        runner,
      }));
      this.opened.set(env, opening);
    }
    return opening;
  }

  /** Closes every environment opened (those that failed to open have nothing to close). */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(
      [...this.opened.values()].map((opening) =>
        opening.then(
          (e) => e.runner.close(),
          () => {},
        ),
      ),
    );
  }
}
