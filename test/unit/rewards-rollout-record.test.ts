// Parsing rollout JSONL lines: a good line becomes a typed record; every malformed line is a
// non-retryable BadRolloutError naming the source, the line number and the field.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { badInputErrorType } from '../../activities/types.js';
import { BadRolloutError, toApplicationFailure } from '../../activities/rewards/errors.js';
import { parseRolloutLine } from '../../activities/rewards/rollout-record.js';

const good = {
  prompt_id: 12,
  sample_index: 3,
  iteration: 5,
  task: 'reverse',
  prompt: 'rev:abc=',
  prompt_tokens: [35, 30, 39, 14, 17, 18, 19, 13],
  tokens: [19, 18, 17, 1],
  text: 'cba',
  logprobs: [-0.01, -0.2, -0.05, -0.001],
  finish_reason: 'stop',
};
const at = { source: 'campaigns/c1/rollouts/000005/shard-0/chunk-2.jsonl', line: 7 };

function withField(name: string, value: unknown): string {
  return JSON.stringify({ ...good, [name]: value });
}
function without(name: string): string {
  const copy: Record<string, unknown> = { ...good };
  delete copy[name];
  return JSON.stringify(copy);
}

function assertMalformed(line: string, field: string | undefined, pattern: RegExp): void {
  assert.throws(
    () => parseRolloutLine(line, at),
    (err: unknown) => {
      assert.ok(err instanceof BadRolloutError, `expected BadRolloutError, got ${String(err)}`);
      assert.equal(err.type, badInputErrorType);
      assert.equal(err.nonRetryable, true);
      assert.equal(err.location.source, at.source);
      assert.equal(err.location.line, at.line);
      assert.equal(err.location.field, field);
      assert.ok(err.message.startsWith(`malformed rollout: ${at.source} line 7: `), err.message);
      assert.match(err.message, pattern);
      return true;
    },
  );
}

describe('parseRolloutLine', () => {
  it('parses the documented example', () => {
    assert.deepEqual(parseRolloutLine(JSON.stringify(good), at), good);
  });

  it("keeps an episode's loss mask and rejects one of other values or length", () => {
    const masked = { ...good, loss_mask: [1, 0, 0, 1] };
    assert.deepEqual(parseRolloutLine(JSON.stringify(masked), at).loss_mask, [1, 0, 0, 1]);
    assert.equal(parseRolloutLine(JSON.stringify(good), at).loss_mask, undefined);
    assertMalformed(withField('loss_mask', [1, 0, 2, 1]), 'loss_mask', /element 2 is number 2/);
    assertMalformed(withField('loss_mask', [1, 0, true, 1]), 'loss_mask', /element 2 is boolean/);
    assertMalformed(withField('loss_mask', [1, 0]), 'loss_mask', /"loss_mask" has 2 entries for 4 tokens/);
    assertMalformed(withField('loss_mask', null), 'loss_mask', /must be an array/);
  });

  it('keeps an episode whose turns tile the completion under its mask, and names what is wrong with another', () => {
    const episode = {
      version: 1,
      end_reason: 'answered',
      turns: [
        { role: 'policy', start: 0, end: 1 },
        {
          role: 'environment',
          start: 1,
          end: 3,
          calls: [{ name: 'add', arguments: {}, result: '5', latencyMs: 3 }],
        },
        { role: 'policy', start: 3, end: 4 },
      ],
    };
    const line = (e: unknown, mask: number[] | null = [1, 0, 0, 1]) =>
      JSON.stringify({ ...good, ...(mask ? { loss_mask: mask } : {}), episode: e });
    assert.deepEqual(parseRolloutLine(line(episode), at).episode, episode);
    const turns = episode.turns;
    const cases: [unknown, number[] | null, RegExp][] = [
      [{ ...episode, version: 2 }, [1, 0, 0, 1], /version 2 is not one this moerl reads \(1\)/],
      [episode, null, /an episode needs its loss_mask/],
      [episode, [1, 1, 0, 1], /turn 1 \(environment\): loss_mask\[1\] must be 0/],
      [{ ...episode, end_reason: 'bored' }, [1, 0, 0, 1], /end_reason "bored" is not one of answered/],
      [{ ...episode, turns: [turns[0], turns[2]] }, [1, 0, 0, 1], /turn 1: \[start, end\) must follow/],
      [{ ...episode, turns: turns.slice(0, 2) }, [1, 0, 0, 1], /the turns end at id 3 of 4/],
      [
        { ...episode, turns: [turns[0], { ...turns[1], calls: [{ name: 'add' }] }, turns[2]] },
        [1, 0, 0, 1],
        /turn 1 call 0: name and result must be strings/,
      ],
    ];
    for (const [e, mask, pattern] of cases) assertMalformed(line(e, mask), 'episode', pattern);
  });

  it('accepts a truncated sample without <eos>, and unknown extra fields', () => {
    const line = JSON.stringify({
      ...good,
      tokens: [19, 18],
      logprobs: [-1, -2],
      finish_reason: 'length',
      extra: 1,
    });
    const record = parseRolloutLine(line, at);
    assert.equal(record.finish_reason, 'length');
    assert.deepEqual(record.tokens, [19, 18]);
  });

  it('rejects text that is not JSON, or not an object', () => {
    assertMalformed('{"prompt_id":12,', undefined, /not valid JSON/);
    assertMalformed('', undefined, /not valid JSON/);
    assertMalformed('[1,2]', undefined, /expected a JSON object, got an array/);
    assertMalformed('null', undefined, /expected a JSON object, got null/);
  });

  it('rejects each missing field', () => {
    for (const name of Object.keys(good))
      assertMalformed(without(name), name, new RegExp(`missing field "${name}"`));
  });

  it('rejects ill-typed fields', () => {
    assertMalformed(
      withField('prompt_id', '12'),
      'prompt_id',
      /"prompt_id" must be a non-negative integer, got string "12"/,
    );
    assertMalformed(withField('prompt_id', -1), 'prompt_id', /non-negative integer/);
    assertMalformed(withField('sample_index', 1.5), 'sample_index', /non-negative integer, got number 1.5/);
    assertMalformed(withField('iteration', null), 'iteration', /got null/);
    assertMalformed(withField('task', 3), 'task', /"task" must be a string/);
    assertMalformed(withField('prompt', ['rev:abc=']), 'prompt', /"prompt" must be a string, got an array/);
    assertMalformed(withField('text', {}), 'text', /"text" must be a string, got an object/);
    assertMalformed(withField('tokens', '19,18'), 'tokens', /array of token ids/);
    assertMalformed(withField('tokens', [19, 18.5, 17, 1]), 'tokens', /element 1 is number 18.5/);
    assertMalformed(withField('prompt_tokens', [35, -30]), 'prompt_tokens', /element 1 is number -30/);
    assertMalformed(withField('logprobs', [-0.01, null, -0.05, -0.001]), 'logprobs', /element 1 is null/);
    assertMalformed(withField('finish_reason', 1), 'finish_reason', /must be a string/);
    const huge = JSON.stringify(good).replace('-0.2', '-1e400');
    assertMalformed(huge, 'logprobs', /array of finite numbers; element 1 is number -Infinity/);
  });

  it('rejects an unknown finish_reason', () => {
    assertMalformed(withField('finish_reason', 'eos'), 'finish_reason', /one of "stop", "length", got "eos"/);
  });

  it('rejects logprobs whose length differs from tokens', () => {
    assertMalformed(withField('logprobs', [-0.01, -0.2]), 'logprobs', /2 entries for 4 tokens/);
  });

  it('rejects a "stop" sample whose tokens do not end with <eos>', () => {
    assertMalformed(
      JSON.stringify({ ...good, tokens: [19, 18, 17], logprobs: [-1, -1, -1] }),
      'tokens',
      /<eos>/,
    );
    assertMalformed(JSON.stringify({ ...good, tokens: [], logprobs: [] }), 'tokens', /<eos>/);
  });

  it('becomes a non-retryable BadInput activity failure', () => {
    let failure: unknown;
    try {
      parseRolloutLine('{', at);
    } catch (err) {
      failure = toApplicationFailure(err);
    }
    const f = failure as { type?: string; nonRetryable?: boolean; message?: string };
    assert.equal(f.type, badInputErrorType);
    assert.equal(f.nonRetryable, true);
    assert.match(f.message ?? '', /chunk-2\.jsonl line 7/);
  });
});
