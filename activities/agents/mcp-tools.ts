// An MCP environment of agentic rollouts: the tools of a Model Context Protocol server, found with
// tools/list and called with tools/call through the official TypeScript SDK, over stdio (a server
// process the worker starts per shard) or streamable HTTP (a server already running). The server
// is the campaign author's own program, like a rollout server: it is not jailed (it may need the
// network, a search API, a database), and it is given no secret the spec does not name.
//
// A server is untrusted in what it answers: a call that hangs is cut at the call time limit, a
// line that is not JSON-RPC fails the calls waiting on it at once (the SDK would drop it and let
// them wait), a result that is not a CallToolResult fails its call, and a server that exits is
// started again for the next call. Each of those is the call's error turn, never the shard's.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js';
import type { McpServerSpec } from '../../workflows/spec-agent.js';
import { BadInputError } from '../rewards/errors.js';
import type { EnvironmentRunner } from './environments.js';
import type { ToolSchema } from './tool-calls.js';

export interface McpToolsOptions {
  /** Wall time of connecting and listing the tools. */
  connectMs: number;
  /** Characters of a result the model is shown; the rest is cut, saying so (default 16000). */
  maxResultChars?: number;
  /** Where inheritEnv and headersFromEnv are read (default process.env). */
  env?: NodeJS.ProcessEnv;
  /** Where a stdio server's stderr goes (default: this process's, as the SDK's). */
  stderr?: 'inherit' | 'ignore';
}

/** The `_meta` field of a tools/call that carries the call's idempotency key (docs/agents.md). */
export const idempotencyKeyMeta = 'moerl/idempotency-key';

/** Pages of tools/list read at most: a server that pages forever is refused. */
const maxListPages = 100;

/** A name for the server in messages: its command or its URL. */
export function mcpServerName(spec: McpServerSpec): string {
  return spec.url !== undefined ? `MCP server ${spec.url}` : `MCP server \`${spec.command!.join(' ')}\``;
}

function fromEnv(env: NodeJS.ProcessEnv, variable: string, what: string): string {
  const value = env[variable];
  if (value === undefined)
    throw new BadInputError(`${what}: the environment variable ${variable} is not set`);
  return value;
}

function transportOf(spec: McpServerSpec, options: McpToolsOptions, name: string): Transport {
  const env = options.env ?? process.env;
  if (spec.url !== undefined) {
    const headers = Object.fromEntries(
      Object.entries(spec.headersFromEnv ?? {}).map(([header, variable]) => [
        header,
        fromEnv(env, variable, `${name} header ${header}`),
      ]),
    );
    return new StreamableHTTPClientTransport(new URL(spec.url), { requestInit: { headers } });
  }
  const [command, ...args] = spec.command!;
  return new StdioClientTransport({
    command: command!,
    args,
    // The SDK adds PATH, HOME, USER and the like; nothing else of the worker's unless named.
    env: Object.fromEntries((spec.inheritEnv ?? []).map((v) => [v, fromEnv(env, v, name)])),
    stderr: options.stderr ?? 'inherit',
  });
}

/** One session with the server; `broken` once its transport closed or spoke garbage. */
interface Session {
  client: Client;
  broken: Error | null;
  /** Rejects the calls waiting on this session. */
  inFlight: Set<(err: Error) => void>;
}

async function openSession(spec: McpServerSpec, options: McpToolsOptions, name: string): Promise<Session> {
  const client = new Client({ name: 'moerl', version: '1' });
  const session: Session = { client, broken: null, inFlight: new Set() };
  const fail = (err: Error) => {
    session.broken ??= err;
    for (const reject of session.inFlight) reject(err);
    session.inFlight.clear();
  };
  client.onerror = (err) => fail(new Error(`${name} sent what is not JSON-RPC: ${err.message}`));
  client.onclose = () => fail(new Error(`${name} closed the connection`));
  try {
    await client.connect(transportOf(spec, options, name), { timeout: options.connectMs });
  } catch (err) {
    await client.close().catch(() => {});
    throw new Error(`${name}: could not connect within ${options.connectMs} ms: ${(err as Error).message}`);
  }
  return session;
}

/** Every tool the server lists, page by page. */
async function listTools(session: Session, options: McpToolsOptions, name: string) {
  const tools = [];
  let cursor: string | undefined;
  for (let page = 0; page < maxListPages; page++) {
    const listed = await session.client.listTools(cursor === undefined ? {} : { cursor }, {
      timeout: options.connectMs,
    });
    tools.push(...listed.tools);
    cursor = listed.nextCursor;
    if (cursor === undefined) return tools;
  }
  throw new Error(`${name}: tools/list still had more pages after ${maxListPages}`);
}

/** A CallToolResult as the tool turn shows it: its text parts, the others named. */
function resultText(result: Awaited<ReturnType<Client['callTool']>>, maxChars: number): string {
  const content = (result.content ?? []) as { type: string; text?: string }[];
  let text =
    content.length === 0 && result.structuredContent !== undefined
      ? JSON.stringify(result.structuredContent)
      : content.map((c) => (c.type === 'text' ? c.text! : `[${c.type} content]`)).join('\n');
  if (text.length > maxChars)
    text = `${text.slice(0, maxChars)}\n[cut: ${text.length - maxChars} more characters]`;
  return text;
}

/**
 * Connects to the server and lists its tools (those `spec.tools` names, in that order; every
 * one it lists otherwise); the runner calls them. A server that cannot be reached or listed
 * throws (the shard is retried); one that lacks a named tool is the spec's bad input.
 */
export async function mcpTools(
  spec: McpServerSpec,
  options: McpToolsOptions,
): Promise<EnvironmentRunner & { tools: ToolSchema[] }> {
  const name = mcpServerName(spec);
  const maxChars = options.maxResultChars ?? 16_000;
  let session = await openSession(spec, options, name);
  let listed;
  try {
    listed = await listTools(session, options, name);
  } catch (err) {
    await session.client.close().catch(() => {});
    throw new Error(`${name}: tools/list failed: ${(err as Error).message}`);
  }
  const byName = new Map(listed.map((t) => [t.name, t]));
  const chosen = spec.tools ?? listed.map((t) => t.name);
  const missing = chosen.filter((t) => !byName.has(t));
  if (missing.length > 0) {
    await session.client.close().catch(() => {});
    throw new BadInputError(
      `${name} lists no tool ${missing.join(', ')} (it lists ${listed.map((t) => t.name).join(', ') || 'none'})`,
    );
  }
  const tools: ToolSchema[] = chosen.map((t) => {
    const tool = byName.get(t)!;
    return {
      type: 'function',
      function: {
        name: tool.name,
        ...(tool.description !== undefined ? { description: tool.description } : {}),
        parameters: tool.inputSchema as Record<string, unknown>,
      },
    };
  });
  // A tool that declares it changes nothing (read-only) or nothing more when called again.
  const idempotent = new Set(
    chosen.filter((t) => {
      const hints = byName.get(t)!.annotations;
      return hints?.idempotentHint === true || hints?.readOnlyHint === true;
    }),
  );
  let reopening: Promise<Session> | null = null;
  let closed = false;
  // A session that broke is replaced for the calls after: a server that crashed starts anew.
  const current = async (): Promise<Session> => {
    if (closed) throw new Error(`${name}: closed`);
    if (session.broken === null) return session;
    reopening ??= openSession(spec, options, name).then(
      (s) => {
        void session.client.close().catch(() => {});
        session = s;
        reopening = null;
        return s;
      },
      (err: unknown) => {
        reopening = null;
        throw err;
      },
    );
    return reopening;
  };
  return {
    tools,
    idempotent: (toolName) => idempotent.has(toolName),
    async call(toolName, args, signal, key) {
      const s = await current();
      const meta = key === undefined ? {} : { _meta: { [idempotencyKeyMeta]: key } };
      return new Promise<string>((resolve, reject) => {
        s.inFlight.add(reject);
        // The episode's signal is the call's time limit: the SDK's own is set out of its way.
        s.client
          .callTool({ name: toolName, arguments: args, ...meta }, undefined, { signal, timeout: 2 ** 31 - 1 })
          .then(
            (result) => {
              const text = resultText(result, maxChars);
              if (result.isError === true) reject(new Error(text || 'the tool reported an error'));
              else resolve(text);
            },
            (err: unknown) => reject(new Error(`${name}: ${(err as Error).message}`)),
          )
          .finally(() => s.inFlight.delete(reject));
      });
    },
    async close() {
      closed = true;
      await Promise.all([session.client.close(), reopening?.then((s) => s.client.close())]).catch(() => {});
    },
  };
}
