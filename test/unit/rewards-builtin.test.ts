// The built-in verifiers that run without a subprocess, and how RewardFunctions picks one per
// data_source: answer extraction (\boxed nesting, ####), exact and normalised match, a
// multiple-choice letter, regex extraction, JSON Schema, the weighted format reward, and the
// errors for a bad spec or an unknown data source.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  choiceLetter,
  completionJson,
  hashAnswer,
  lastBoxed,
  normaliseAnswer,
} from '../../activities/rewards/builtin.js';
import { BadInputError } from '../../activities/rewards/errors.js';
import { RewardFunctions } from '../../activities/rewards/functions.js';

describe('answer extraction', () => {
  it('takes the last \\boxed{...} with nested braces balanced', () => {
    assert.equal(lastBoxed('so \\boxed{\\frac{1}{\\sqrt{2}}}.'), '\\frac{1}{\\sqrt{2}}');
    assert.equal(lastBoxed('\\boxed{1} or rather \\boxed{2}'), '2');
    assert.equal(lastBoxed('\\boxed{\\boxed{5}}'), '\\boxed{5}');
    assert.equal(lastBoxed('\\boxed{\\{1, 2\\}}'), '\\{1, 2\\}');
    assert.equal(lastBoxed('\\fbox{7}'), '7');
    assert.equal(lastBoxed('\\boxed 5 is it'), '5');
    assert.equal(lastBoxed('\\boxed{3} then \\boxed{4'), '3', 'an unclosed box does not count');
    assert.equal(lastBoxed('no box'), null);
  });

  it('takes the answer after the last #### up to the end of its line', () => {
    assert.equal(hashAnswer('48 + 24 = 72\n#### 72'), '72');
    assert.equal(hashAnswer('#### 1\n#### 1,234 \nthanks'), '1,234');
    assert.equal(hashAnswer('#### \n'), null);
    assert.equal(hashAnswer('no answer'), null);
  });

  it('normalises case, white space, a final period and surrounding quotes or $', () => {
    assert.equal(normaliseAnswer('  The  Eiffel\nTower. '), 'the eiffel tower');
    assert.equal(normaliseAnswer('"Paris"'), 'paris');
    assert.equal(normaliseAnswer('$42$'), '42');
    assert.equal(normaliseAnswer('ｆｕｌｌ'), 'full');
  });

  it('finds the chosen letter of a multiple-choice answer', () => {
    assert.equal(choiceLetter('I think the answer is (C).', 'ABCD'), 'C');
    assert.equal(choiceLetter('Answer: b', 'ABCD'), 'B');
    assert.equal(choiceLetter('so \\boxed{D}', 'ABCD'), 'D');
    assert.equal(choiceLetter('B) Paris', 'ABCD'), 'B');
    assert.equal(choiceLetter('(A)', 'ABCD'), 'A');
    assert.equal(choiceLetter('answer is E', 'ABCD'), null, 'E is not a choice');
    assert.equal(choiceLetter('Absolutely sure', 'ABCD'), null);
  });

  it('finds the JSON of a completion: a fenced block, the whole text, or the outer braces', () => {
    assert.deepEqual(completionJson('Here:\n```json\n{"a": 1}\n```\nDone.'), { a: 1 });
    assert.deepEqual(completionJson(' [1, 2] '), [1, 2]);
    assert.deepEqual(completionJson('The object is {"b": [true]} as asked.'), { b: [true] });
    assert.equal(completionJson('no json {here'), undefined);
  });
});

describe('RewardFunctions with built-in verifiers', () => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string' }, age: { type: 'integer', minimum: 0 } },
    required: ['name', 'age'],
    additionalProperties: false,
  };
  const rewards = new RewardFunctions({
    default: { kind: 'match' },
    bySource: {
      exact: { kind: 'match', normalise: false },
      mmlu: { kind: 'choice', letters: 'ABCD' },
      tagged: { kind: 'regex', pattern: '<answer>(.*?)</answer>' },
      person: { kind: 'json-schema', schema },
      perRow: { kind: 'json-schema' },
      formatted: { kind: 'match', format: { pattern: '^<think>[\\s\\S]*</think>', weight: 0.25 } },
    },
  });
  const score = async (source: string, text: string, truth: unknown) =>
    (await rewards.score(source, text, truth)).score;

  it('exact and normalised match; a list of accepted answers', async () => {
    assert.equal(await score('any', ' Paris. ', 'paris'), 1);
    assert.equal(await score('any', 'Lyon', ['Paris', 'lyon']), 1);
    assert.equal(await score('any', 'Rome', 'Paris'), 0);
    assert.equal(await score('exact', 'Paris', 'Paris'), 1);
    assert.equal(await score('exact', 'paris', 'Paris'), 0);
    assert.equal(await score('any', '42', 42), 1, 'a numeric ground truth compares as its JSON text');
  });

  it('multiple choice compares letters', async () => {
    assert.equal(await score('mmlu', 'The answer is (B).', 'B'), 1);
    assert.equal(await score('mmlu', 'The answer is (B).', '(b)'), 1);
    assert.equal(await score('mmlu', 'The answer is (C).', 'B'), 0);
    assert.equal(await score('mmlu', 'no idea', 'B'), 0);
  });

  it('regex takes the last match (its first group) and compares it normalised', async () => {
    assert.equal(await score('tagged', '<answer>x</answer> no, <answer> Blue </answer>', 'blue'), 1);
    assert.equal(await score('tagged', 'Blue', 'blue'), 0, 'no match scores 0');
  });

  it('JSON Schema: from the spec, or each row ground truth as its schema', async () => {
    assert.equal(await score('person', '```json\n{"name": "Ada", "age": 36}\n```', null), 1);
    assert.equal(await score('person', '{"name": "Ada", "age": -1}', null), 0);
    assert.equal(await score('person', '{"name": "Ada"}', null), 0);
    assert.equal(await score('person', 'not json', null), 0);
    assert.equal(await score('perRow', '{"n": 3}', JSON.stringify({ type: 'object', required: ['n'] })), 1);
    assert.equal(await score('perRow', '{"m": 3}', { type: 'object', required: ['n'] }), 0);
    const bad = await rewards.score('perRow', '{}', { type: 'no-such-type' });
    assert.equal(bad.score, 0);
    assert.equal(bad.failure?.reason, 'exception');
    assert.match(bad.failure?.message ?? '', /^ground truth is not a valid JSON Schema/);
  });

  it('the format reward adds its weight to the verifier score', async () => {
    assert.equal(
      await score('formatted', '<think>hmm</think> paris', 'paris'),
      0.25,
      'the whole text is compared: no match, but the format',
    );
    assert.equal(await score('formatted', '<think>hmm</think>', 'x'), 0.25);
    assert.equal(await score('formatted', 'x', 'x'), 1);
  });

  it('a batch counts nothing as failed when every verifier answered', async () => {
    const batch = await rewards.scoreBatch([
      { dataSource: 'mmlu', solutionStr: 'A', groundTruth: 'A' },
      { dataSource: 'exact', solutionStr: 'a', groundTruth: 'A' },
    ]);
    assert.deepEqual(
      batch.results.map((r) => r.score),
      [1, 0],
    );
    assert.deepEqual(batch.failures, { count: 0, byReason: {} });
    assert.deepEqual(batch.allFailing, []);
  });

  it('a data source without a choice and without a default is bad input', async () => {
    const only = new RewardFunctions({ bySource: { a: { kind: 'match' } } });
    await assert.rejects(
      only.score('b', 'x', 'x'),
      (err: unknown) =>
        err instanceof BadInputError && /no reward function for data_source "b"/.test(err.message),
    );
  });

  it('a bad regex or schema in the spec fails at construction, naming its field', () => {
    assert.throws(
      () => new RewardFunctions({ bySource: { s: { kind: 'regex', pattern: '(' } } }),
      (err: unknown) =>
        err instanceof BadInputError && /^bySource\.s\.pattern: "\(" is not a valid regex/.test(err.message),
    );
    assert.throws(
      () => new RewardFunctions({ default: { kind: 'json-schema', schema: { type: 'nope' } } }),
      (err: unknown) =>
        err instanceof BadInputError && /^default\.schema is not a valid JSON Schema/.test(err.message),
    );
    assert.throws(
      () => new RewardFunctions({ default: { kind: 'match', format: { pattern: '[', weight: 1 } } }),
      (err: unknown) => err instanceof BadInputError && /^default\.format\.pattern/.test(err.message),
    );
  });
});
