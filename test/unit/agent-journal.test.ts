// The turn journal (activities/agents/journal.ts) on the fs store, its episodes scripted (fakes:
// a character-per-id policy and tools): an episode read back whole generates and calls nothing
// and is the episode it was; one cut off mid-turn (its attempt aborted, as a worker shutting
// down or lost) goes on live from its first turn not journaled, with the same result as one
// never cut; a call sent before the cut and not answered is sent again, with its key, only to an
// idempotent tool, and otherwise ends the episode `tool-outcome-unknown`. Segments are checked
// by their checksum; one that fails ends the replay there.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  runEpisode,
  type Episode,
  type ToolRunner,
  type TurnGenerator,
} from '../../activities/agents/episode.js';
import {
  ChunkJournal,
  chunkJournalPrefix,
  parseSegment,
  segmentText,
} from '../../activities/agents/journal.js';
import { ToolCallParser, type ToolSchema } from '../../activities/agents/tool-calls.js';
import { FsStore } from '../../activities/store/fs.js';

const root = mkdtempSync(join(tmpdir(), 'moerl-journal-'));
after(() => rmSync(root, { recursive: true, force: true }));
const store = new FsStore(root);

const encode = (text: string) => [...text].map((c) => c.charCodeAt(0));
const decode = (ids: readonly number[]) => String.fromCharCode(...ids.filter((id) => id !== 0));
const tools: ToolSchema[] = ['add', 'charge'].map((name) => ({
  type: 'function',
  function: { name, parameters: { type: 'object', properties: { n: { type: 'number' } } } },
}));
const parser = new ToolCallParser(tools, 'hermes');
const call = (name: string, n: number) =>
  `<tool_call>{"name": "${name}", "arguments": {"n": ${n}}}</tool_call>`;
const limits = { maxTurns: 8, maxTokens: 10_000, contextLength: 20_000, toolCallMs: 5000, episodeMs: 60_000 };

/** A policy whose turn i is script[i], unless `crashAt` (a turn) aborts `attempt` there. */
function policyOf(script: string[], attempt: AbortController, crashAt?: number) {
  const generated: number[] = [];
  const replayed: number[] = [];
  let turn = 0;
  const policy: TurnGenerator = {
    async generate(_ids, _max, signal) {
      if (turn === crashAt) attempt.abort(new Error('the worker is lost'));
      signal.throwIfAborted();
      generated.push(turn);
      const tokens = [...encode(script[turn++] ?? 'done'), 0];
      return { tokens, logprobs: tokens.map((_, i) => -(i + 1) / 100), stopped: true };
    },
    replay() {
      replayed.push(turn++);
    },
    decode,
  };
  return { policy, generated, replayed };
}

/** Tools that count their calls with their keys; `crashOn` (a tool name) aborts `attempt` mid-call. */
function toolsOf(attempt: AbortController, opts: { crashOn?: string; idempotent?: boolean } = {}) {
  const calls: { name: string; key?: string }[] = [];
  const runner: ToolRunner = {
    idempotent: (name) => name === 'add' || opts.idempotent === true,
    async call(name, args, _signal, key) {
      calls.push({ name, ...(key !== undefined ? { key } : {}) });
      if (name === opts.crashOn) {
        attempt.abort(new Error('the worker is lost'));
        return new Promise<string>(() => {});
      }
      return `${name}:${(args.n as number) * 2}`;
    },
  };
  return { runner, calls };
}

const script = [`${call('add', 1)}`, `${call('charge', 5)}`, 'the answer'];

async function attemptOf(
  chunkKey: string,
  attemptNo: number,
  opts: { crashAt?: number; crashOn?: string; idempotent?: boolean } = {},
) {
  const attempt = new AbortController();
  const journal = await ChunkJournal.open(store, chunkKey, attemptNo);
  const policy = policyOf(script, attempt, opts.crashAt);
  const tools = toolsOf(attempt, opts);
  let clock = 1000 * attemptNo;
  const episode = await runEpisode([1, 2, 3], {
    policy: policy.policy,
    parser,
    tools: tools.runner,
    renderEnvironmentTurn: (messages) => encode(messages.map((m) => `[${m.content}]`).join('')),
    limits,
    signal: attempt.signal,
    now: () => (clock += 7),
    journal: journal.episode(0, 0),
    callKey: (turn, c) => `key-${turn}-${c}`,
  }).catch((err: unknown) => {
    if (!attempt.signal.aborted) throw err;
    return null;
  });
  return { episode, policy, tools, journal };
}

const sameEpisode = (a: Episode, b: Episode) => {
  assert.deepEqual(a.tokens, b.tokens);
  assert.deepEqual(a.logprobs, b.logprobs);
  assert.deepEqual(a.lossMask, b.lossMask);
  assert.deepEqual(a.record, b.record);
};

describe('the turn journal (fs store; scripted policy and tools: fakes)', () => {
  it('an episode journaled whole is read back: nothing generated, nothing called, the same episode', async () => {
    const whole = await attemptOf('c/whole.jsonl', 1);
    assert.equal(whole.episode?.record.end_reason, 'answered');
    assert.deepEqual(whole.tools.calls, [
      { name: 'add', key: 'key-0-0' },
      { name: 'charge', key: 'key-1-0' },
    ]);
    const again = await attemptOf('c/whole.jsonl', 2);
    assert.deepEqual(again.policy.generated, []);
    assert.deepEqual(again.policy.replayed, [0, 1, 2]);
    assert.deepEqual(again.tools.calls, []);
    assert.equal(again.journal.stats.replayed, 3 + 2 * 2, 'three turns, two intents, two outcomes');
    sameEpisode(again.episode!, whole.episode!);
  });

  it('cut mid policy turn: goes on from that turn, the calls before it not sent again', async () => {
    const uncut = await attemptOf('c/uncut.jsonl', 1);
    const cut = await attemptOf('c/mid-turn.jsonl', 1, { crashAt: 2 });
    assert.equal(cut.episode, null);
    const resumed = await attemptOf('c/mid-turn.jsonl', 2);
    assert.deepEqual(resumed.policy.replayed, [0, 1]);
    assert.deepEqual(resumed.policy.generated, [2]);
    assert.deepEqual(resumed.tools.calls, []);
    // The latencies are the first attempt's: the record is the same as the uncut one's.
    sameEpisode(resumed.episode!, uncut.episode!);
    const keys: string[] = [];
    for await (const o of store.list(chunkJournalPrefix('c/mid-turn.jsonl'))) keys.push(o.key);
    assert.ok(
      keys.at(-1)!.endsWith('/000002-000000-a2.jsonl'),
      `the second attempt writes second: ${keys.join(' ')}`,
    );
  });

  it("a call sent but not answered: a non-idempotent tool's ends the episode, an idempotent one's is sent again with its key", async () => {
    const cut = await attemptOf('c/intent.jsonl', 1, { crashOn: 'charge' });
    assert.equal(cut.episode, null);
    assert.deepEqual(
      cut.tools.calls.map((c) => c.name),
      ['add', 'charge'],
    );
    const unknown = await attemptOf('c/intent.jsonl', 2);
    assert.deepEqual(unknown.tools.calls, [], 'charge is not called twice');
    assert.equal(unknown.episode?.record.end_reason, 'tool-outcome-unknown');
    const last = unknown.episode!.record.turns.at(-1)!;
    assert.ok(last.role === 'environment' && last.calls[0]?.error === 'outcome-unknown');
    assert.equal(last.start, last.end, 'no environment ids: the episode ends on the call');

    await attemptOf('c/intent-idem.jsonl', 1, { crashOn: 'charge' });
    const resent = await attemptOf('c/intent-idem.jsonl', 2, { idempotent: true });
    assert.deepEqual(
      resent.tools.calls,
      [{ name: 'charge', key: 'key-1-0' }],
      'the same key as the lost call',
    );
    assert.equal(resent.episode?.record.end_reason, 'answered');
    assert.deepEqual(resent.policy.generated, [2]);
  });

  it('each attempt writes after the ones before; a segment that fails its checksum ends the replay there', async () => {
    await attemptOf('c/bad.jsonl', 1, { crashAt: 2 });
    const keys: string[] = [];
    for await (const o of store.list(chunkJournalPrefix('c/bad.jsonl'))) keys.push(o.key);
    assert.ok(keys.length >= 2 && keys.every((k) => /\/000001-\d{6}-a1\.jsonl$/.test(k)), keys.join(' '));
    // A changed byte in the last segment (charge's outcome): charge is known sent, not answered.
    const lastKey = keys.sort().at(-1)!;
    const text = (await store.get(lastKey)).toString('utf8');
    await store.put(lastKey, text.replace('"n":', '"m":'));
    const resumed = await attemptOf('c/bad.jsonl', 2);
    assert.match(resumed.journal.stats.unreadable[0]!, /checksum does not match/);
    assert.equal(resumed.episode?.record.end_reason, 'tool-outcome-unknown');
    assert.deepEqual(resumed.tools.calls, []);
    const after2: string[] = [];
    for await (const o of store.list(chunkJournalPrefix('c/bad.jsonl'))) after2.push(o.key);
    assert.deepEqual(after2.length, keys.length, 'a read-back episode that ends at once writes nothing');
    await resumed.journal.remove();
    const left: string[] = [];
    for await (const o of store.list(chunkJournalPrefix('c/bad.jsonl'))) left.push(o.key);
    assert.deepEqual(left, []);
  });

  it('segments round-trip and refuse a cut or changed text', () => {
    const lines = [
      {
        episode: '0/1',
        entry: {
          kind: 'policy' as const,
          turn: 0,
          elapsedMs: 5,
          tokens: [1],
          logprobs: [-1],
          stopped: true,
          latencyMs: 3,
        },
      },
    ];
    const text = segmentText(lines);
    assert.deepEqual(parseSegment(text), lines);
    assert.match(parseSegment(text.slice(0, -20)) as string, /checksum/);
    assert.match(parseSegment(text.replace('-1', '-2')) as string, /checksum does not match/);
  });
});
