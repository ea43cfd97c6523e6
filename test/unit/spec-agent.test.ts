// The `agent` section of the spec: environments chosen per data_source (the shipped tools, a
// user's file with its functions' schemas, an MCP server), the combinations a campaign cannot run refused with
// their field, and the environment a row gets.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { sandboxEnvironmentTools } from '../../activities/agents/environments.js';
import { parseCampaignSpec } from '../../workflows/spec.js';
import { agentEnvironment, type SandboxToolsSpec } from '../../workflows/spec-agent.js';
import { hfSpecDoc, specProblems, validSpecDoc } from '../support/spec-docs.js';

const openai = { engine: { rollout: 'openai' } };
const calculator = { kind: 'tools', builtin: ['calculator'] };
const adder = {
  type: 'function',
  function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'number' } } } },
};

describe('spec: agent', () => {
  it('chooses the environment by data_source, the default for the others, none without either', () => {
    const spec = parseCampaignSpec({
      ...hfSpecDoc(),
      ...openai,
      agent: {
        bySource: { arith: calculator, mine: { kind: 'tools', file: 'tools/mine.py', functions: [adder] } },
      },
    });
    assert.equal(spec.agent?.toolCallFormat, 'hermes');
    assert.equal(spec.agent?.maxTurns, 8);
    const sandboxed = (source: string) => {
      const env = agentEnvironment(spec.agent, source);
      assert.equal(env?.kind, 'tools');
      return sandboxEnvironmentTools(env as SandboxToolsSpec);
    };
    assert.deepEqual(
      sandboxed('arith').map((t) => t.function.name),
      ['calculator'],
    );
    assert.deepEqual(sandboxed('mine'), [adder]);
    assert.equal(agentEnvironment(spec.agent, 'gsm8k'), undefined, 'a source of no environment is one-shot');
    assert.equal(agentEnvironment(spec.agent, 'constructor'), undefined, "an object's own keys only");
    const withDefault = parseCampaignSpec({ ...hfSpecDoc(), ...openai, agent: { default: calculator } });
    assert.deepEqual(agentEnvironment(withDefault.agent, 'gsm8k'), calculator);
  });

  it('refuses an agent without a dataset or the openai engine, and malformed environments', () => {
    const onBuiltin = specProblems({ ...validSpecDoc(), ...openai, agent: { default: calculator } });
    assert.ok(
      onBuiltin.some((p) => /^agent:.*dataset tasks/.test(p)),
      onBuiltin.join('\n'),
    );
    const native = specProblems({ ...hfSpecDoc(), agent: { default: calculator } });
    assert.ok(
      native.some((p) => /^agent:.*engine\.rollout openai/.test(p)),
      native.join('\n'),
    );
    const cases: [unknown, RegExp][] = [
      [{}, /needs a default environment, bySource entries, or both/],
      [{ default: { kind: 'tools' } }, /exactly one of builtin .* and file/],
      [
        { default: { kind: 'tools', builtin: ['calculator', 'calculator'] } },
        /names the tool calculator twice/,
      ],
      [{ default: { kind: 'tools', builtin: ['shell'] } }, /calculator.*python|invalid/i],
      [{ default: { kind: 'tools', file: 'x.py' } }, /file and functions go together/],
      [
        {
          default: { kind: 'tools', file: 'x.py', functions: [{ ...adder, function: { name: 'no-dash' } }] },
        },
        /must be a Python function name/,
      ],
      [{ default: calculator, maxTurns: 0 }, /maxTurns/],
    ];
    for (const [agent, pattern] of cases) {
      const found = specProblems({ ...hfSpecDoc(), ...openai, agent });
      assert.ok(
        found.some((p) => pattern.test(p)),
        `${JSON.stringify(agent)}: ${found.join('\n')}`,
      );
    }
  });

  it('an MCP environment needs exactly one of command and url, each with its own options', () => {
    const problems = (env: unknown) =>
      specProblems({ ...hfSpecDoc(), ...openai, agent: { default: env } }).join('\n');
    const mcp = { kind: 'mcp', command: ['server', '--stdio'], inheritEnv: ['API_KEY'], tools: ['a'] };
    assert.deepEqual(
      parseCampaignSpec({ ...hfSpecDoc(), ...openai, agent: { default: mcp } }).agent?.default,
      mcp,
    );
    assert.match(problems({ kind: 'mcp' }), /exactly one of command \(stdio\) and url/);
    assert.match(problems({ kind: 'mcp', command: ['s'], url: 'http://h/mcp' }), /exactly one of command/);
    assert.match(problems({ kind: 'mcp', url: 'ftp://h/mcp' }), /url/);
    assert.match(
      problems({ kind: 'mcp', url: 'http://h/mcp', inheritEnv: ['A'] }),
      /inheritEnv: .*is for a server started by command/,
    );
    assert.match(
      problems({ kind: 'mcp', command: ['s'], headersFromEnv: { a: 'B' } }),
      /headersFromEnv: .*is for a server at a url/,
    );
    assert.match(
      problems({ kind: 'mcp', command: ['s'], inheritEnv: ['NOT-A-NAME'] }),
      /environment variable name/,
    );
    assert.match(problems({ kind: 'mcp', command: ['s'], tools: ['a', 'a'] }), /names the tool a twice/);
    assert.match(problems({ kind: 'shell' }), /kind/);
  });
});
