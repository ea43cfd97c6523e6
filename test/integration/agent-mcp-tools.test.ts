// MCP environments (activities/agents/mcp-tools.ts) against a real MCP server built on the official
// SDK (test/support/mcp-test-server.ts), over stdio and streamable HTTP: its tools listed as the
// chat template and the parser take them, calls answered, and a server that hangs, writes what is
// not JSON-RPC, answers a malformed result or exits costs the call an error and nothing more; the
// session is made anew for the next call. A stdio server is given no variable of the worker's
// environment the spec does not name.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runEpisode, type TurnGenerator } from '../../activities/agents/episode.js';
import { mcpTools } from '../../activities/agents/mcp-tools.js';
import { ToolCallParser } from '../../activities/agents/tool-calls.js';
import { BadInputError } from '../../activities/rewards/errors.js';
import type { McpServerSpec } from '../../workflows/spec-agent.js';
import { mcpTestServerCommand, startMcpHttpServer, type McpHttpServer } from '../support/mcp-servers.js';

const connectMs = 30_000;
const stdio = (...args: string[]): McpServerSpec => ({ kind: 'mcp', command: mcpTestServerCommand(...args) });
const call = (tools: Awaited<ReturnType<typeof mcpTools>>, expression: string, ms = 10_000) =>
  tools.call('calculator', { expression }, AbortSignal.timeout(ms));

describe('MCP tools (a real MCP server)', () => {
  let dir: string;
  let http: McpHttpServer;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-mcp-'));
    http = await startMcpHttpServer(join(dir, 'http.log'), '--require-header', 'x-tools-token=sesame');
  });
  after(async () => {
    await http?.process.stop(2000);
    rmSync(dir, { recursive: true, force: true });
  });

  it('lists the tools a stdio server serves as function schemas and calls them; each call reaches it once', async () => {
    const callsFile = join(dir, 'calls.jsonl');
    const tools = await mcpTools(stdio('--calls-file', callsFile), { connectMs });
    try {
      assert.deepEqual(
        tools.tools.map((t) => t.function.name),
        ['calculator', 'charge', 'echo', 'env'],
      );
      const calculator = tools.tools[0]!.function;
      assert.equal(calculator.description, 'Adds and subtracts integers exactly');
      assert.deepEqual((calculator.parameters as { required: string[] }).required, ['expression']);
      // The listed schemas compile: the parser checks a call's arguments against them.
      const parser = new ToolCallParser(tools.tools, 'hermes');
      const parsed = parser.parse(
        '<tool_call>{"name": "calculator", "arguments": {"expression": 7}}</tool_call>',
      );
      assert.deepEqual(
        [parsed.calls.length, parsed.errors[0]?.kind],
        [0, 'bad-arguments'],
        'a number where the server declares a string',
      );
      assert.equal(await call(tools, '123456789123456789 + 1 - 3'), '123456789123456787');
      await assert.rejects(
        call(tools, 'two plus two'),
        /cannot evaluate two plus two/,
        'isError is a failed call',
      );
      // The tools' own declarations say which may be sent again; a call's key reaches the server.
      assert.deepEqual(
        ['calculator', 'charge', 'echo'].map((t) => tools.idempotent(t)),
        [true, false, false],
      );
      assert.equal(
        await tools.call('charge', { amount: 3 }, AbortSignal.timeout(10_000), 'key-7'),
        'charged 3',
      );
      const lines = readFileSync(callsFile, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as { tool: string; key?: string });
      assert.deepEqual(
        lines.map((l) => [l.tool, l.key ?? null]),
        [
          ['calculator', null],
          ['calculator', null],
          ['charge', 'key-7'],
        ],
      );
    } finally {
      await tools.close();
    }
  });

  it('gives the model only the tools the spec names, in its order, and refuses one the server lacks', async () => {
    const chosen = await mcpTools({ ...stdio(), tools: ['echo', 'calculator'] }, { connectMs });
    assert.deepEqual(
      chosen.tools.map((t) => t.function.name),
      ['echo', 'calculator'],
    );
    await chosen.close();
    await assert.rejects(
      mcpTools({ ...stdio(), tools: ['calculator', 'search'] }, { connectMs }),
      (err: Error) =>
        err instanceof BadInputError &&
        /lists no tool search \(it lists calculator, charge, echo, env\)/.test(err.message),
    );
  });

  it("passes a stdio server only the worker's variables the spec names", async () => {
    const env = { ...process.env, TOOLS_API_KEY: 'k-123', WORKER_SECRET: 's-456' };
    const tools = await mcpTools({ ...stdio(), inheritEnv: ['TOOLS_API_KEY'] }, { connectMs, env });
    try {
      const value = (name: string) => tools.call('env', { name }, AbortSignal.timeout(10_000));
      assert.equal(await value('TOOLS_API_KEY'), 'k-123');
      assert.equal(await value('WORKER_SECRET'), '(unset)');
      assert.notEqual(await value('PATH'), '(unset)', 'the SDK passes PATH');
    } finally {
      await tools.close();
    }
    await assert.rejects(
      mcpTools({ ...stdio(), inheritEnv: ['NOT_SET_ANYWHERE'] }, { connectMs, env }),
      /the environment variable NOT_SET_ANYWHERE is not set/,
    );
  });

  it('a call that hangs is cut at its time limit; the session goes on', async () => {
    const tools = await mcpTools(stdio(), { connectMs });
    try {
      const started = Date.now();
      await assert.rejects(call(tools, 'hang', 300), /abort|timeout/i);
      assert.ok(Date.now() - started < 5000, 'cut at the signal, not the SDK default of 60 s');
      assert.equal(
        await tools.call('echo', { text: 'still here' }, AbortSignal.timeout(10_000)),
        'still here',
      );
    } finally {
      await tools.close();
    }
  });

  it('garbage, a malformed result or an exit fails the call at once; the next call gets a new server', async () => {
    const callsFile = join(dir, 'garbage-calls.jsonl');
    const tools = await mcpTools(stdio('--calls-file', callsFile), { connectMs });
    try {
      for (const [expression, error] of [
        ['garbage', /sent what is not JSON-RPC/],
        ['bad-result', /expected array|invalid/i],
        ['crash', /closed the connection/],
      ] as const) {
        const started = Date.now();
        await assert.rejects(call(tools, expression, 20_000), error, expression);
        assert.ok(Date.now() - started < 10_000, `${expression}: failed at once, not at the time limit`);
        assert.equal(await call(tools, '40 + 2'), '42', `${expression}: the next call is answered`);
      }
      const expressions = readFileSync(callsFile, 'utf8')
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { args: { expression: string } }).args.expression);
      assert.deepEqual(expressions, ['garbage', '40 + 2', 'bad-result', '40 + 2', 'crash', '40 + 2']);
    } finally {
      await tools.close();
    }
  });

  it('an episode on an MCP server: a hung call and a garbage answer are error turns, the episode goes on', async () => {
    const tools = await mcpTools(stdio(), { connectMs });
    const encode = (text: string) => [...text].map((c) => c.charCodeAt(0));
    const script = ['hang', 'garbage', '1 + 2'].map(
      (expression) =>
        `<tool_call>{"name": "calculator", "arguments": {"expression": "${expression}"}}</tool_call>`,
    );
    let turn = 0;
    const policy: TurnGenerator = {
      async generate() {
        const tokens = [...encode(script[turn++] ?? 'answer: 3'), 0];
        return { tokens, logprobs: tokens.map(() => -1), stopped: true };
      },
      replay: () => assert.fail('nothing is journaled'),
      decode: (ids) => String.fromCharCode(...ids.filter((id) => id !== 0)),
    };
    try {
      const episode = await runEpisode([1, 2, 3], {
        policy,
        parser: new ToolCallParser(tools.tools, 'hermes'),
        tools,
        renderEnvironmentTurn: (messages) => encode(messages.map((m) => m.content).join('|')),
        limits: {
          maxTurns: 8,
          maxTokens: 10_000,
          contextLength: 100_000,
          // The call after the garbage starts a new server within its time: room for a loaded machine.
          toolCallMs: 4000,
          episodeMs: 60_000,
        },
        signal: new AbortController().signal,
      });
      assert.equal(episode.record.end_reason, 'answered');
      const calls = episode.record.turns.flatMap((t) => (t.role === 'environment' ? t.calls : []));
      assert.deepEqual(
        calls.map((c) => [c.error ?? 'ok', c.error ? '' : c.result]),
        [
          ['timeout', ''],
          ['failed', ''],
          ['ok', '3'],
        ],
      );
    } finally {
      await tools.close();
    }
  });

  it('reaches a streamable HTTP server with headers from the worker environment', async () => {
    const spec: McpServerSpec = {
      kind: 'mcp',
      url: http.url,
      headersFromEnv: { 'x-tools-token': 'TOOLS_TOKEN' },
    };
    const tools = await mcpTools(spec, { connectMs, env: { TOOLS_TOKEN: 'sesame' } });
    try {
      assert.deepEqual(
        tools.tools.map((t) => t.function.name),
        ['calculator', 'charge', 'echo', 'env'],
      );
      assert.equal(await call(tools, '2 + 2'), '4');
    } finally {
      await tools.close();
    }
    await assert.rejects(mcpTools(spec, { connectMs, env: { TOOLS_TOKEN: 'wrong' } }), (err: Error) =>
      err.message.includes(`MCP server ${http.url}: could not connect`),
    );
    await assert.rejects(
      mcpTools(spec, { connectMs, env: {} }),
      /header x-tools-token: .*TOOLS_TOKEN is not set/,
    );
  });

  it('names the server that cannot be started', async () => {
    await assert.rejects(
      mcpTools({ kind: 'mcp', command: [join(dir, 'no-such-server')] }, { connectMs }),
      /MCP server `.*no-such-server`: could not connect/,
    );
  });
});
