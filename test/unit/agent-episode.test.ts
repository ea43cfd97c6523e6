// The multi-turn episode loop (activities/agents/episode.ts) with a scripted policy and tools
// (fakes: a character-per-id "tokenizer", turns read from a script): the episode's ids are the
// policy's ids and the rendered environment turns in order, the loss mask marks the policy's,
// the engine is given only what was appended since its last turn, bad and failing calls become
// error turns, and each limit ends the episode with its reason. On an OpenAI-compatible engine
// (a fake one) each turn's prompt is the whole episode so far, as ids, with a seed of its own.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  runEpisode,
  type EpisodeLimits,
  type EpisodeOptions,
  type ToolRunner,
  type TurnGenerator,
} from '../../activities/agents/episode.js';
import { engineTurnGenerator, turnSeed } from '../../activities/agents/engine-turns.js';
import { addEpisodeStats, describeEpisodes, episodeStats } from '../../activities/agents/episode-stats.js';
import { ToolCallParser, type ToolSchema } from '../../activities/agents/tool-calls.js';
import type { CompletionRequest, RolloutEngine } from '../../activities/engines/types.js';
import type { ChatMessage } from '../../activities/models/chat-template.js';

const endOfTurn = 0; // the fake vocabulary: id 0 ends a turn, any other id is a char code
const encode = (text: string) => [...text].map((c) => c.charCodeAt(0));
const decode = (ids: readonly number[]) => String.fromCharCode(...ids.filter((id) => id !== endOfTurn));

/** Fake policy: turn i generates script[i] (then ends its turn unless `cut`), log-prob -0.5 an id. */
function scriptedPolicy(script: string[], opts: { cut?: boolean; delayMs?: number } = {}) {
  const appended: number[][] = [];
  const replayed: number[][] = [];
  let turn = 0;
  const policy: TurnGenerator = {
    async generate(ids, maxNewTokens, signal) {
      appended.push([...ids]);
      const text = script[turn++] ?? 'done';
      if (opts.delayMs) await new Promise((resolve) => setTimeout(resolve, opts.delayMs));
      signal.throwIfAborted();
      const full = opts.cut ? encode(text) : [...encode(text), endOfTurn];
      const tokens = full.slice(0, maxNewTokens);
      return {
        tokens,
        logprobs: tokens.map(() => -0.5),
        stopped: tokens.length === full.length && !opts.cut,
      };
    },
    replay(ids, generated) {
      replayed.push([...ids, ...generated.tokens]);
      turn++;
    },
    decode,
  };
  return { policy, appended, replayed };
}

const tools: ToolSchema[] = [
  {
    type: 'function',
    function: {
      name: 'add',
      parameters: {
        type: 'object',
        properties: { a: { type: 'number' }, b: { type: 'number' } },
        required: ['a', 'b'],
      },
    },
  },
  { type: 'function', function: { name: 'slow', parameters: { type: 'object' } } },
  { type: 'function', function: { name: 'broken', parameters: { type: 'object' } } },
];
const parser = new ToolCallParser(tools, 'hermes');
const runner: ToolRunner = {
  idempotent: () => true,
  async call(name: string, args: Record<string, unknown>) {
    if (name === 'add') return String((args.a as number) + (args.b as number));
    if (name === 'slow') return new Promise<string>(() => undefined); // never answers, ignores its signal
    throw new Error('the tool crashed');
  },
};
const render = (messages: ChatMessage[]) => encode(messages.map((m) => `<${m.role}>${m.content}`).join(''));
const limits: EpisodeLimits = {
  maxTurns: 8,
  maxTokens: 4096,
  contextLength: 8192,
  toolCallMs: 200,
  episodeMs: 10_000,
};
const call = (name: string, args: object) =>
  `<tool_call>${JSON.stringify({ name, arguments: args })}</tool_call>`;
const prompt = encode('Q: 2+3?');
const episodeOf = (policy: TurnGenerator, more: Partial<EpisodeOptions> = {}) =>
  runEpisode(prompt, { policy, parser, tools: runner, renderEnvironmentTurn: render, limits, ...more });

describe('runEpisode (scripted policy and tools: fakes)', () => {
  it('appends the rendered tool turn after the policy turn, masks it, and ends when the policy answers', async () => {
    const turn1 = `thinking ${call('add', { a: 2, b: 3 })}`;
    const { policy, appended } = scriptedPolicy([turn1, 'A: 5']);
    const episode = await episodeOf(policy);

    const env = render([{ role: 'tool', name: 'add', content: '5' }]);
    const want = [...encode(turn1), endOfTurn, ...env, ...encode('A: 5'), endOfTurn];
    assert.deepEqual(episode.tokens, want);
    assert.deepEqual(appended, [prompt, env], 'the engine gets the prompt, then only the environment turn');
    const policyIds = encode(turn1).length + 1;
    assert.deepEqual(episode.lossMask, [
      ...Array(policyIds).fill(1),
      ...Array(env.length).fill(0),
      ...Array(5).fill(1),
    ]);
    assert.deepEqual(
      episode.logprobs,
      episode.lossMask.map((m) => (m ? -0.5 : 0)),
    );
    assert.equal(episode.record.end_reason, 'answered');
    assert.equal(episode.record.version, 1);
    const [p1, e1, p2] = episode.record.turns;
    // A policy turn's latency is its generation time (the clock is real here).
    const timeless = (t: typeof p1) => t && { ...t, latencyMs: 0 };
    assert.deepEqual(timeless(p1), { role: 'policy', start: 0, end: policyIds, latencyMs: 0 });
    assert.equal(e1?.role, 'environment');
    assert.deepEqual(
      e1?.role === 'environment' && e1.calls.map((c) => [c.name, c.arguments, c.result, c.error]),
      [['add', { a: 2, b: 3 }, '5', undefined]],
    );
    assert.deepEqual(timeless(p2), {
      role: 'policy',
      start: policyIds + env.length,
      end: want.length,
      latencyMs: 0,
    });
  });

  it('answers a malformed call, a failing tool and a tool past its time limit with error turns, in call order', async () => {
    const turn = call('nope', {}) + call('broken', {}) + call('slow', {}) + call('add', { a: 1, b: 'x' });
    const { policy } = scriptedPolicy([turn, 'A']);
    const started = Date.now();
    const episode = await episodeOf(policy);
    const env = episode.record.turns[1];
    assert.ok(env?.role === 'environment');
    assert.deepEqual(
      env.calls.map((c) => c.error),
      ['unknown-tool', 'failed', 'timeout', 'bad-arguments'],
    );
    assert.match(env.calls[0]!.result, /unknown tool "nope"; the tools are: add, slow, broken/);
    assert.match(env.calls[1]!.result, /tool "broken" failed: the tool crashed/);
    assert.match(env.calls[2]!.result, /tool "slow" timed out after 200 ms/);
    assert.ok(
      env.calls[2]!.latencyMs >= 150,
      `the slow call was waited for its limit (${env.calls[2]!.latencyMs} ms)`,
    );
    assert.ok(
      Date.now() - started < 5_000,
      'a tool that ignores its signal is not waited for past its limit',
    );
    assert.equal(episode.record.end_reason, 'answered');
  });

  it('ends at max-turns, max-tokens and context-length with the reason recorded', async () => {
    const always = Array(20).fill(call('add', { a: 1, b: 1 }));
    const turns = await episodeOf(scriptedPolicy(always).policy, { limits: { ...limits, maxTurns: 3 } });
    assert.equal(turns.record.end_reason, 'max-turns');
    assert.equal(turns.record.turns.filter((t) => t.role === 'policy').length, 3);

    const cut = await episodeOf(scriptedPolicy(['a long answer'], { cut: true }).policy, {
      limits: { ...limits, maxTokens: 6 },
    });
    assert.equal(cut.record.end_reason, 'max-tokens');
    assert.equal(cut.tokens.length, 6, 'the policy was given what is left of the budget');

    const turn = call('add', { a: 1, b: 1 });
    const context = prompt.length + encode(turn).length + 1 + 3; // the tool turn does not fit
    const full = await episodeOf(scriptedPolicy([turn, 'A']).policy, {
      limits: { ...limits, contextLength: context },
    });
    assert.equal(full.record.end_reason, 'context-length');
    assert.equal(full.record.turns.length, 1, 'no environment turn was appended past the context');
    assert.ok(full.lossMask.every((m) => m === 1));
  });

  it('ends at episode-time when a slow policy or tool runs past the episode limit; a cancellation rejects', async () => {
    const slowTools = await episodeOf(scriptedPolicy([call('slow', {})]).policy, {
      limits: { ...limits, toolCallMs: 5_000, episodeMs: 150 },
    });
    assert.equal(slowTools.record.end_reason, 'episode-time');

    const slowPolicy = await episodeOf(scriptedPolicy(['A'], { delayMs: 300 }).policy, {
      limits: { ...limits, episodeMs: 100 },
    });
    assert.equal(slowPolicy.record.end_reason, 'episode-time');

    const cancel = new AbortController();
    const run = episodeOf(scriptedPolicy(['A'], { delayMs: 300 }).policy, { signal: cancel.signal });
    cancel.abort(new Error('cancelled'));
    await assert.rejects(run, /cancelled/);
  });
});

describe('engineTurnGenerator (fake engine recording its requests)', () => {
  it('sends every id of the episode so far as the prompt, each turn with its own seed, and reads stop as the turn end', async () => {
    const requests: CompletionRequest[] = [];
    const replies = [encode(call('add', { a: 2, b: 3 })), encode('A: 5')];
    const engine: RolloutEngine = {
      kind: 'fake',
      endpoint: 'fake://',
      async complete(request) {
        requests.push(request);
        const tokens = [...replies[requests.length - 1]!, endOfTurn];
        return { tokens, logprobs: tokens.map(() => -0.25), finishReason: 'stop' };
      },
      async isReady() {
        return true;
      },
    };
    const policy = engineTurnGenerator({
      engine,
      temperature: 0.7,
      topP: 0.9,
      seed: 1234,
      stopTokenIds: [endOfTurn],
      decode,
    });
    const episode = await episodeOf(policy);
    assert.equal(episode.record.end_reason, 'answered');
    const env = render([{ role: 'tool', name: 'add', content: '5' }]);
    assert.deepEqual(requests[0]!.promptTokens, prompt);
    assert.deepEqual(requests[1]!.promptTokens, [...prompt, ...replies[0]!, endOfTurn, ...env]);
    assert.deepEqual(
      requests.map((r) => [r.seed, r.temperature, r.topP, r.stopTokenIds]),
      [
        [1234, 0.7, 0.9, [endOfTurn]],
        [turnSeed(1234, 1), 0.7, 0.9, [endOfTurn]],
      ],
    );
    assert.notEqual(turnSeed(1234, 1), 1234);
    assert.equal(turnSeed(1234, 1), turnSeed(1234, 1));
    assert.notEqual(turnSeed(1234, 1), turnSeed(1234, 2));
    assert.deepEqual(
      [...prompt, ...episode.tokens],
      [...requests[1]!.promptTokens, ...replies[1]!, endOfTurn],
    );
  });
});

describe('episode stats', () => {
  it("counts a chunk's turns, end reasons, calls (made-up tool names as one), errors and times; shards add up", () => {
    const stats = episodeStats([
      {
        version: 1,
        end_reason: 'answered',
        turns: [
          { role: 'policy', start: 0, end: 3, latencyMs: 500 },
          {
            role: 'environment',
            start: 3,
            end: 5,
            calls: [
              { name: 'add', arguments: {}, result: '5', latencyMs: 250 },
              { name: '', arguments: null, result: 'bad', error: 'bad-json', latencyMs: 0 },
              {
                name: 'made_up_9f3',
                arguments: null,
                result: 'unknown',
                error: 'unknown-tool',
                latencyMs: 0,
              },
            ],
          },
          { role: 'policy', start: 5, end: 6, latencyMs: 250 },
        ],
      },
      // A record written before policy turns had a latency.
      { version: 1, end_reason: 'max-turns', turns: [{ role: 'policy', start: 0, end: 2 }] },
    ]);
    assert.equal(
      describeEpisodes(stats),
      '2 episodes, 1.50 policy turns each, ended {"answered":1,"max-turns":1}, calls {"add":1,"(unnamed)":1,"(unknown)":1}, errors {"bad-json":1,"unknown-tool":1}, tool time 0.25 s, generation 0.75 s',
    );
    const twice = addEpisodeStats(structuredClone(stats), stats);
    assert.deepEqual(
      [twice.episodes, twice.policyTurns, twice.endReasons, twice.toolCalls.add, twice.toolSeconds],
      [4, 6, { answered: 2, 'max-turns': 2 }, 2, 0.5],
    );
  });
});
