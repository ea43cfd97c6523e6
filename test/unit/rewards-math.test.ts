// The math verifier against math-verify itself: each row of the table is scored by moerl's
// verifier (its own \boxed / #### extraction, then math-verify in the pool) and, independently,
// by math-verify alone on the whole completion (parse of the boxed ground truth, parse of the
// completion, verify). The expected column is what math-verify 0.9.0 says; both must agree with
// it. Needs the reward Python environment (scripts/reward-python.sh, a setup step).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, describe, it } from 'node:test';
import { RewardFunctions } from '../../activities/rewards/functions.js';
import { resolveRewardPython } from '../../activities/rewards/sandbox.js';

/** [completion, ground truth, math-verify's verdict] */
const table: [string, string, 0 | 1][] = [
  // fractions and decimals
  ['The answer is \\boxed{\\frac{1}{2}}', '0.5', 1],
  ['\\boxed{\\dfrac{3}{4}}', '\\frac34', 1],
  ['\\boxed{-\\frac{2}{3}}', '-2/3', 1],
  ['\\boxed{1.5}', '\\frac{3}{2}', 1],
  ['\\boxed{\\frac{1}{3}}', '0.333333', 1],
  ['\\boxed{\\frac{1}{3}}', '0.33', 0],
  ['\\boxed{3.0}', '3', 1],
  ['\\boxed{\\frac{\\frac{1}{2}}{2}}', '\\frac14', 1],
  // LaTeX: roots, powers, constants, logs, sets, intervals, matrices, expressions
  ['\\boxed{\\sqrt{2}/2}', '\\frac{\\sqrt2}{2}', 1],
  ['\\boxed{2\\sqrt{3}}', '\\sqrt{12}', 1],
  ['\\boxed{2^{10}}', '1024', 1],
  ['\\boxed{\\pi}', '3.14159265', 1],
  ['\\boxed{\\log_2 8}', '3', 1],
  ['\\boxed{\\infty}', '\\infty', 1],
  ['\\boxed{e^{i\\pi}}', '-1', 0],
  ['\\boxed{\\{1,2\\}}', '\\{2,1\\}', 1],
  ['\\boxed{[0,1)}', '[0,1)', 1],
  ['\\boxed{[0,1]}', '[0,1)', 0],
  ['\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}', '\\begin{pmatrix}1\\\\2\\end{pmatrix}', 1],
  ['\\boxed{x^2+2x+1}', '(x+1)^2', 1],
  ['\\boxed{x=3}', '3', 1],
  // units, currency, percent, thousands separators, text
  ['\\boxed{10\\text{ cm}}', '10', 1],
  ['\\boxed{5 \\text{ meters}}', '5', 1],
  ['\\boxed{90^\\circ}', '90', 1],
  ['\\boxed{\\$18}', '18', 1],
  ['\\boxed{50\\%}', '0.5', 1],
  ['\\boxed{1,000}', '1000', 1],
  ['\\boxed{\\text{(B)}}', 'B', 1],
  // \boxed nesting and position: the last box counts. (math-verify alone reads
  // "\boxed{1}, then \boxed{2}" as the set {1, 2}; moerl takes the last box, so these rows have
  // no comma between the boxes and both readings agree.)
  ['\\boxed{\\boxed{5}}', '5', 1],
  ['first \\boxed{1} then finally \\boxed{2}', '2', 1],
  ['first \\boxed{2} then finally \\boxed{1}', '2', 0],
  ['\\boxed 7', '7', 1],
  // GSM8K's #### form
  ['Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48+24 = 72 clips.\n#### 72', '72', 1],
  ['#### 71', '72', 0],
  // wrong or missing answers
  ['\\boxed{3}', '4', 0],
  ['no answer here', '3', 0],
];

const python = resolveRewardPython();

/** math-verify alone: verify(parse("\boxed{gt}"), parse(completion)) for every row, in one process. */
function mathVerifyVerdicts(rows: typeof table): number[] {
  const script = [
    'import json, sys',
    'from math_verify import parse, verify',
    'rows = json.load(sys.stdin)',
    'print(json.dumps([int(verify(parse("\\\\boxed{" + gt + "}"), parse(text))) for text, gt, _ in rows]))',
  ].join('\n');
  const out = execFileSync(python, ['-c', script], { input: JSON.stringify(rows), encoding: 'utf8' });
  return JSON.parse(out) as number[];
}

describe('math verifier', () => {
  const rewards = new RewardFunctions({ default: { kind: 'math' } }, { math: { python, processes: 2 } });
  after(() => rewards.close());

  it(`the table's expectations are what math-verify says (${table.length} pairs)`, () => {
    assert.ok(table.length >= 30);
    const verdicts = mathVerifyVerdicts(table);
    table.forEach(([text, gt, expected], i) =>
      assert.equal(verdicts[i], expected, `math-verify on ${JSON.stringify(text)} vs ${JSON.stringify(gt)}`),
    );
  });

  it('moerl scores every pair as math-verify does, with no failures', async () => {
    const batch = await rewards.scoreBatch(
      table.map(([text, gt]) => ({ dataSource: 'math', solutionStr: text, groundTruth: gt })),
    );
    assert.equal(batch.failures.count, 0, JSON.stringify(batch.failures));
    table.forEach(([text, gt, expected], i) =>
      assert.equal(
        batch.results[i]?.score,
        expected,
        `moerl on ${JSON.stringify(text)} vs ${JSON.stringify(gt)}`,
      ),
    );
  });

  it('a ground truth in GSM8K form (#### answer) or boxed is reduced to its answer', async () => {
    assert.equal((await rewards.score('gsm8k', 'so \\boxed{72}', 'She sold 72.\n#### 72')).score, 1);
    assert.equal((await rewards.score('math', 'so \\boxed{72}', '\\boxed{72}')).score, 1);
  });

  it('a format reward adds its weight to a correct or a wrong answer', async () => {
    const formatted = new RewardFunctions(
      { default: { kind: 'math', format: { pattern: '^<think>[\\s\\S]*</think>', weight: 0.1 } } },
      { math: { python, processes: 1 } },
    );
    try {
      assert.equal((await formatted.score('m', '<think>easy</think> \\boxed{4}', '4')).score, 1.1);
      assert.equal((await formatted.score('m', '<think>hm</think> \\boxed{5}', '4')).score, 0.1);
      assert.equal((await formatted.score('m', '\\boxed{4}', '4')).score, 1);
    } finally {
      formatted.close();
    }
  });
});
