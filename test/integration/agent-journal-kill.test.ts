// Durable episodes under SIGKILL: a process running a chunk of episodes as a rollout worker does
// (test/support/episode-chunk-child.ts: ShardEnvironments with a real MCP server over stdio,
// ShardEpisodes on an OpenAI-compatible server, ChunkJournal in an fs store) is killed with its
// whole process group at a chosen point, then run again on the same journal. The server is a
// scripted fake that answers a request it has answered before with other log-probs, as a real
// server that does not sample bitwise would: the episodes match an uninterrupted run's only if
// no journaled turn was asked again. The MCP server counts its calls with their keys.
//   - killed mid policy turn (after the calculator's result was journaled): the same episodes,
//     no call sent again;
//   - killed after a call's intent, before its outcome, on `charge` (not idempotent): the
//     episodes end `tool-outcome-unknown` and charge ran once per episode, never twice;
//   - the same on `calculator` (idempotent): sent again with the same key, the same episodes.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import type { EpisodeSample } from '../../activities/agents/shard-episodes.js';
import { loadTokenizer, type HfTokenizer } from '../../activities/models/tokenizer.js';
import { chatmlToolsTemplate } from '../fixtures/agent-chat-cases.js';
import type { ChildArgs } from '../support/episode-chunk-child.js';
import { startFakeRolloutServer, type FakeRolloutServer } from '../support/fake-rollout-server.js';
import { spawnGroup } from '../support/process-group.js';
import { pythonReference } from '../support/python-reference.js';

const pyref = pythonReference();
const childScript = fileURLToPath(new URL('../support/episode-chunk-child.js', import.meta.url));
const episodes = 3;

describe(
  'durable episodes: a worker SIGKILLed mid-chunk (real MCP server, scripted engine)',
  { skip: pyref.skip },
  () => {
    let dir: string;
    let tokenizer: HfTokenizer;
    let server: FakeRolloutServer;
    let promptTokens: number[];
    /** Times each (prompt, seed) was answered: a second answer has other log-probs. */
    const answered = new Map<string, number>();
    /** Requests with this many tool results in their prompt are held, never answered. */
    let holdAt: number | null = null;
    let held = 0;

    const toolCall = (name: string, args: object) =>
      `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;
    function reply(body: { prompt: number[]; seed: number; max_tokens: number }): string | Promise<string> {
      const results = (tokenizer.decode(body.prompt).match(/<tool_response>/g) ?? []).length;
      if (results === holdAt) {
        held++;
        return new Promise<string>(() => {});
      }
      const key = `${body.prompt.join(',')}|${body.seed}`;
      const times = (answered.get(key) ?? 0) + 1;
      answered.set(key, times);
      const text =
        [toolCall('calculator', { expression: '2+3' }), toolCall('charge', { amount: 5 })][results] ?? 'done';
      const ids = [...tokenizer.encode(text), tokenizer.eosTokenId].slice(0, body.max_tokens);
      return JSON.stringify({
        choices: [
          {
            finish_reason: 'stop',
            logprobs: {
              tokens: ids.map((id) => `token_id:${id}`),
              token_logprobs: ids.map(() => -0.5 - 0.125 * (times - 1)),
            },
          },
        ],
      });
    }

    before(async () => {
      dir = mkdtempSync(join(tmpdir(), 'moerl-journal-kill-'));
      const tokDir = join(dir, 'tokenizer');
      await pyref.run('make_tokenizer.py', [tokDir, '--vocab-size', '4096']);
      writeFileSync(join(tokDir, 'chat_template.jinja'), chatmlToolsTemplate);
      tokenizer = await loadTokenizer(tokDir);
      promptTokens = tokenizer.renderChat([{ role: 'user', content: 'Add 2 and 3, then charge it.' }], {
        addGenerationPrompt: true,
      }).ids;
      server = await startFakeRolloutServer((body) => reply(body as Parameters<typeof reply>[0]));
    });
    after(async () => {
      await server?.close();
      rmSync(dir, { recursive: true, force: true });
    });

    /** Runs the child until it ends, or SIGKILLs its group once `killWhen` holds. */
    async function runChild(
      name: string,
      attempt: number,
      mcpArgs: string[],
      killWhen?: () => boolean,
    ): Promise<{ episodes: EpisodeSample[]; replayed: number } | null> {
      const out = join(dir, `${name}-${attempt}.json`);
      const args: ChildArgs = {
        store: join(dir, 'store'),
        chunkKey: `rollouts/${name}/chunk-0.jsonl`,
        attempt,
        engineUrl: server.url,
        tokenizerDir: join(dir, 'tokenizer'),
        promptTokens,
        episodes,
        mcpArgs,
        out,
      };
      const log = join(dir, `${name}-${attempt}.log`);
      const child = spawnGroup(
        'episode-chunk-child',
        process.execPath,
        [childScript, JSON.stringify(args)],
        log,
      );
      for (const deadline = Date.now() + 60_000; !child.exitReason; await sleep(10)) {
        if (Date.now() > deadline) {
          await child.kill();
          assert.fail(
            `${name}: the child neither ended nor reached its kill point in 60 s; ${readFileSync(log, 'utf8')}`,
          );
        }
        if (killWhen?.()) {
          await child.kill();
          return null;
        }
      }
      assert.equal(child.exitReason, 'code 0', readFileSync(log, 'utf8'));
      return JSON.parse(readFileSync(out, 'utf8')) as { episodes: EpisodeSample[]; replayed: number };
    }

    const callsOf = (file: string) =>
      existsSync(file)
        ? readFileSync(file, 'utf8')
            .trim()
            .split('\n')
            .filter(Boolean)
            .map((l) => JSON.parse(l) as { tool: string; key: string })
        : [];
    const count = (file: string, tool: string) => callsOf(file).filter((c) => c.tool === tool).length;

    /** The episodes but their latencies (a turn or a call made live again takes its own time). */
    const timeless = (samples: EpisodeSample[]) =>
      samples.map((e) => ({
        ...e,
        episode: {
          ...e.episode,
          turns: e.episode.turns.map((t) =>
            t.role === 'environment'
              ? { ...t, calls: t.calls.map((c) => ({ ...c, latencyMs: 0 })) }
              : { ...t, latencyMs: 0 },
          ),
        },
      }));
    let uninterrupted: EpisodeSample[];
    const fresh = (name: string) => {
      answered.clear();
      holdAt = null;
      held = 0;
      const state = join(dir, `${name}-state`);
      mkdirSync(state, { recursive: true });
      return { calls: join(dir, `${name}-calls.jsonl`), state };
    };

    it('an uninterrupted chunk: every episode calls the calculator, then charge, then answers', async () => {
      const { calls } = fresh('whole');
      const run = await runChild('whole', 1, ['--calls-file', calls]);
      uninterrupted = run!.episodes;
      assert.equal(run!.replayed, 0);
      for (const e of uninterrupted) {
        assert.equal(e.episode.end_reason, 'answered');
        assert.equal(e.episode.turns.length, 5);
      }
      assert.equal(count(calls, 'calculator'), episodes);
      assert.equal(count(calls, 'charge'), episodes);
    });

    it('killed mid policy turn: the journaled turns are read back, not asked again; the same episodes', async () => {
      const { calls } = fresh('mid-turn');
      holdAt = 1; // the turn after the calculator's result: its request is in flight at the kill
      assert.equal(await runChild('mid-turn', 1, ['--calls-file', calls], () => held === episodes), null);
      holdAt = null;
      const run = await runChild('mid-turn', 2, ['--calls-file', calls]);
      assert.ok(run!.replayed > 0);
      assert.deepEqual(timeless(run!.episodes), timeless(uninterrupted));
      assert.equal(count(calls, 'calculator'), episodes, 'no call sent again');
      assert.equal(count(calls, 'charge'), episodes);
    });

    it('killed between the intent and the outcome of a non-idempotent call: tool-outcome-unknown, never sent twice', async () => {
      const { calls, state } = fresh('charge');
      const mcpArgs = ['--calls-file', calls, '--hang-once', 'charge', '--state-dir', state];
      assert.equal(await runChild('charge', 1, mcpArgs, () => count(calls, 'charge') === episodes), null);
      const run = await runChild('charge', 2, mcpArgs);
      assert.equal(count(calls, 'charge'), episodes, 'each episode charged once');
      for (const [i, e] of run!.episodes.entries()) {
        assert.equal(e.episode.end_reason, 'tool-outcome-unknown');
        const want = uninterrupted[i]!;
        const chargeTurn = want.episode.turns[2]!;
        assert.deepEqual(
          e.tokens,
          want.tokens.slice(0, chargeTurn.end),
          'the turns up to the charge, as journaled',
        );
        const last = e.episode.turns.at(-1)!;
        assert.ok(last.role === 'environment' && last.calls[0]?.error === 'outcome-unknown');
      }
    });

    it('killed between the intent and the outcome of an idempotent call: sent again with its key; the same episodes', async () => {
      const { calls, state } = fresh('calculator');
      const mcpArgs = ['--calls-file', calls, '--hang-once', 'calculator', '--state-dir', state];
      assert.equal(
        await runChild('calculator', 1, mcpArgs, () => count(calls, 'calculator') === episodes),
        null,
      );
      const run = await runChild('calculator', 2, mcpArgs);
      assert.deepEqual(timeless(run!.episodes), timeless(uninterrupted));
      const keys = callsOf(calls)
        .filter((c) => c.tool === 'calculator')
        .map((c) => c.key);
      assert.equal(keys.length, 2 * episodes);
      assert.deepEqual(
        keys.slice(episodes).sort(),
        keys.slice(0, episodes).sort(),
        'the same keys as the lost calls',
      );
      assert.equal(new Set(keys).size, episodes, 'a key per episode');
      assert.equal(count(calls, 'charge'), episodes);
    });
  },
);
