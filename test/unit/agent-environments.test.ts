// A shard's environments (activities/agents/environments.ts), their opener a fake: each entry of
// the spec is opened once however many rows and episodes ask for it at once, data sources that
// share an entry share its tools, a row without one is a one-shot completion, an opening that
// failed is not closed, and close reaches every runner opened.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ShardEnvironments, type EnvironmentOpener } from '../../activities/agents/environments.js';
import type { ToolSchema } from '../../activities/agents/tool-calls.js';
import { agentSchema } from '../../workflows/spec-agent.js';

const schema = (name: string): ToolSchema => ({
  type: 'function',
  function: { name, parameters: { type: 'object' } },
});

describe('shard environments (fake opener)', () => {
  it('opens each spec entry once, shares it between its data sources, closes what it opened', async () => {
    const agent = agentSchema.parse({
      bySource: {
        a: { kind: 'mcp', command: ['server-a'] },
        b: { kind: 'mcp', command: ['server-b'] },
        broken: { kind: 'mcp', url: 'http://127.0.0.1:9/mcp' },
      },
      default: { kind: 'tools', builtin: ['calculator'] },
    });
    const opened: string[] = [];
    const closed: string[] = [];
    const open: EnvironmentOpener = async (_agent, env) => {
      const name = env.kind === 'mcp' ? (env.command?.[0] ?? 'http') : 'sandbox';
      opened.push(name);
      await new Promise((resolve) => setTimeout(resolve, 10));
      if (name === 'http') throw new Error('cannot connect');
      return {
        tools: [schema(`${name.replace('-', '_')}_tool`)],
        runner: { call: async () => name, idempotent: () => true, close: () => void closed.push(name) },
      };
    };
    const envs = new ShardEnvironments(agent, open);
    const [a1, a2, b, other, another] = await Promise.all([
      envs.of('a'),
      envs.of('a'),
      envs.of('b'),
      envs.of('gsm8k'),
      envs.of('math'),
    ]);
    assert.deepEqual(opened, ['server-a', 'server-b', 'sandbox'], 'one opening per entry, at once or not');
    assert.equal(a1, a2);
    assert.equal(other, another, 'the default entry is one environment for every source it covers');
    assert.deepEqual(
      b?.tools.map((t) => t.function.name),
      ['server_b_tool'],
    );
    assert.ok(
      b?.parser.parse('<tool_call>{"name": "server_b_tool", "arguments": {}}</tool_call>').calls.length === 1,
    );
    await assert.rejects(envs.of('broken'), /cannot connect/);
    const onlyX = agentSchema.parse({ bySource: { x: { kind: 'tools', builtin: ['python'] } } });
    assert.equal(await new ShardEnvironments(onlyX, open).of('y'), undefined, 'no entry, no environment');
    await envs.close();
    assert.deepEqual(closed.sort(), ['sandbox', 'server-a', 'server-b']);
    await assert.rejects(envs.of('a'), /closed/);
  });
});
