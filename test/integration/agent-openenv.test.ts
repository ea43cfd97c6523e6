// OpenEnv environments (activities/agents/openenv-tools.ts) against a real OpenEnv server: the
// guessing game of test/fixtures/openenv/guess_env.py served by openenv's create_app (the
// interpreter of scripts/openenv.sh). The model (a scripted policy: a binary search on the
// environment's hints) is given the environment's action as its one tool; the environment's
// reward and end are the episode's; the same seed plays the same game. A server killed and
// started again mid-episode, and an episode read back from the journal after its worker was
// lost, are driven back through their steps on a new session (reset with the same seed) and
// end as an uninterrupted episode does; a session that answers otherwise ends the episode
// `environment-lost`.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runEpisode, type Episode, type TurnGenerator } from '../../activities/agents/episode.js';
import { ChunkJournal } from '../../activities/agents/journal.js';
import { openEnvTools, type OpenEnvRunner } from '../../activities/agents/openenv-tools.js';
import { ToolCallParser, type ToolSchema } from '../../activities/agents/tool-calls.js';
import { FsStore } from '../../activities/store/fs.js';
import { agentSchema } from '../../workflows/spec-agent.js';
import { openEnvSkip, startOpenEnvServer, type OpenEnvServer } from '../support/openenv-server.js';

const encode = (text: string) => [...text].map((c) => c.charCodeAt(0));
const decode = (ids: readonly number[]) => String.fromCharCode(...ids.filter((id) => id !== 0));

/** A binary search on the hints; `onTurn` runs before turn i is generated (a fault injected there). */
function guesser(onTurn?: (turn: number) => Promise<void>, attempt?: AbortController) {
  let lo = 1;
  let hi = 100;
  let last = 0;
  let turn = 0;
  const follow = (ids: readonly number[]) => {
    const hint = /"hint":"(\w+)"/.exec(decode(ids))?.[1];
    if (hint === 'higher') lo = last + 1;
    if (hint === 'lower') hi = last - 1;
  };
  const action = () => {
    last = Math.floor((lo + hi) / 2);
    return `<tool_call>{"name": "act", "arguments": {"guess": ${last}}}</tool_call>`;
  };
  const policy: TurnGenerator = {
    async generate(appended, _max, signal) {
      await onTurn?.(turn);
      attempt?.signal.throwIfAborted();
      signal.throwIfAborted();
      follow(appended);
      turn++;
      const tokens = [...encode(action()), 0];
      return { tokens, logprobs: tokens.map(() => -0.25), stopped: true };
    },
    replay(appended, generated) {
      follow(appended);
      last = Number(/"guess": (\d+)/.exec(decode(generated.tokens))![1]);
      turn++;
    },
    decode,
  };
  return policy;
}

describe('OpenEnv environments (a real OpenEnv server)', { skip: openEnvSkip }, () => {
  let dir: string;
  let server: OpenEnvServer;
  let tools: ToolSchema[];
  let runner: OpenEnvRunner;
  let parser: ToolCallParser;
  const limits = {
    maxTurns: 12,
    maxTokens: 100_000,
    contextLength: 200_000,
    toolCallMs: 60_000,
    episodeMs: 120_000,
  };

  const play = (
    seed: number,
    opts: { policy?: TurnGenerator; journal?: ChunkJournal; signal?: AbortSignal } = {},
  ) => {
    const session = runner.episode(seed);
    return runEpisode(encode('Guess my number.'), {
      policy: opts.policy ?? guesser(),
      parser,
      tools: session,
      renderEnvironmentTurn: (messages) => encode(messages.map((m) => m.content).join('\n')),
      limits,
      ...(opts.signal ? { signal: opts.signal } : {}),
      ...(opts.journal ? { journal: opts.journal.episode(0, 0), callKey: (t, c) => `${t}/${c}` } : {}),
    }).finally(() => session.close());
  };
  const sameGame = (a: Episode, b: Episode) => {
    assert.deepEqual(a.tokens, b.tokens);
    assert.deepEqual(a.record.end_reason, b.record.end_reason);
    assert.equal(a.record.environment_reward, b.record.environment_reward);
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-openenv-'));
    server = await startOpenEnvServer('guess_env:app', join(dir, 'server.log'));
    const spec = agentSchema.parse({ default: { kind: 'openenv', url: server.url } }).default!;
    assert.equal(spec.kind, 'openenv');
    ({ tools, runner } = await openEnvTools(spec as Extract<typeof spec, { kind: 'openenv' }>, {
      connectMs: 30_000,
    }));
    parser = new ToolCallParser(tools, 'hermes');
  });
  after(async () => {
    await runner?.close();
    await server?.process.stop(2000);
    rmSync(dir, { recursive: true, force: true });
  });

  it("gives the model the environment's action as its tool, without the metadata every action has", () => {
    assert.equal(tools.length, 1);
    const params = tools[0]!.function.parameters as {
      properties: Record<string, unknown>;
      required: string[];
    };
    assert.equal(tools[0]!.function.name, 'act');
    assert.deepEqual(Object.keys(params.properties), ['guess']);
    assert.deepEqual(params.required, ['guess']);
    const bad = parser.parse('<tool_call>{"name": "act", "arguments": {"guess": 500}}</tool_call>');
    assert.equal(bad.errors[0]?.kind, 'bad-arguments', "the action's own bounds are checked");
  });

  it("plays an episode to the environment's end: its reward is the episode's; the same seed, the same game", async () => {
    const first = await play(7);
    assert.equal(first.record.end_reason, 'environment-done');
    assert.equal(first.record.environment_reward, 1);
    const steps = first.record.turns.flatMap((t) => (t.role === 'environment' ? t.calls : []));
    assert.ok(steps.length >= 2 && steps.at(-1)!.done === true && steps.at(-1)!.reward === 1);
    assert.match(steps.at(-1)!.result, /"hint":"correct"/);
    assert.ok(!steps.at(-1)!.result.includes('metadata'));
    sameGame(await play(7), first);
    assert.notDeepEqual((await play(8)).tokens, first.tokens, 'another seed, another game');
  });

  it('a server killed mid-episode and started again: the episode is driven back through its steps and ends as it would have', async () => {
    const uninterrupted = await play(11);
    const policy = guesser(async (turn) => {
      if (turn !== 2) return;
      await server.process.kill();
      // Started again a little later: the step in between waits for it.
      setTimeout(() => {
        void startOpenEnvServer('guess_env:app', join(dir, 'server-2.log'), server.port).then(
          (s) => (server = s),
        );
      }, 300);
    });
    const resumed = await play(11, { policy });
    sameGame(resumed, uninterrupted);
  });

  it('an episode read back from the journal after its worker was lost goes on in a new session; another game is refused', async () => {
    const store = new FsStore(join(dir, 'store'));
    const uninterrupted = await play(23);
    const attempt = new AbortController();
    const lost = guesser(async (turn) => {
      if (turn === 3) attempt.abort(new Error('the worker is lost'));
    }, attempt);
    const first = await ChunkJournal.open(store, 'c/chunk-0.jsonl', 1);
    await assert.rejects(play(23, { policy: lost, journal: first, signal: attempt.signal }));
    const resumed = await play(23, { journal: await ChunkJournal.open(store, 'c/chunk-0.jsonl', 2) });
    sameGame(resumed, uninterrupted);

    // A journal cut off mid-game, read back by a session of another seed: its steps observe
    // another game, and the episode cannot go on.
    const cutAttempt = new AbortController();
    const cut = guesser(async (turn) => {
      if (turn === 3) cutAttempt.abort(new Error('the worker is lost'));
    }, cutAttempt);
    const journal = await ChunkJournal.open(store, 'c/chunk-1.jsonl', 1);
    await assert.rejects(play(23, { policy: cut, journal, signal: cutAttempt.signal }));
    const other = await play(31, { journal: await ChunkJournal.open(store, 'c/chunk-1.jsonl', 2) });
    assert.equal(other.record.end_reason, 'environment-lost');
    const last = other.record.turns.at(-1)!;
    assert.ok(last.role === 'environment' && last.calls[0]?.error === 'environment-lost');
    assert.match(last.calls[0]!.result, /sent again to a new session, observed/);
  });
});
