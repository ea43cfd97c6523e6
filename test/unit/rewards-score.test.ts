// Scoring a rollout source: rows in input order, statistics and pass rate, errors that name
// the line, and the rewards JSONL read by the native `moe_train grpo` (skipped when not built).
import assert from 'node:assert/strict';
import { createReadStream, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, it } from 'node:test';
import { BadRolloutError } from '../../activities/rewards/errors.js';
import { verifierReward, type RewardFunction } from '../../activities/rewards/reward-model.js';
import type { RolloutRecord } from '../../activities/rewards/rollout-record.js';
import { nativeTools } from '../support/native-tools.js';
import {
  formatRewardsJsonl,
  groupsWithSignal,
  passes,
  scoreRollouts,
} from '../../activities/rewards/score.js';
import { overlongPenalty, policyTokens } from '../../activities/rewards/overlong.js';

function line(promptId: number, sampleIndex: number, prompt: string, text: string, finish = 'stop'): string {
  const tokens = finish === 'stop' ? [...Array.from(text, () => 2), 1] : Array.from(text, () => 2);
  return JSON.stringify({
    prompt_id: promptId,
    sample_index: sampleIndex,
    iteration: 1,
    task: 'add',
    prompt,
    prompt_tokens: Array.from(prompt, () => 2),
    tokens,
    text,
    logprobs: tokens.map(() => -0.5),
    finish_reason: finish,
  });
}

// Two groups of two: prompt 7 gets one right answer, prompt 3 none.
const lines = [
  line(7, 0, '1+2=', '3'),
  line(7, 1, '1+2=', '03'),
  line(3, 0, '40+2=', '42', 'length'),
  line(3, 1, '40+2=', '24'),
];

/** A continuous reward that returns fixed values, recording the batches it saw. */
function fixedReward(values: number[]): RewardFunction & { batches: RolloutRecord[][] } {
  const batches: RolloutRecord[][] = [];
  return {
    name: 'fixed',
    kind: 'continuous',
    batches,
    score: async (batch) => {
      batches.push([...batch]);
      return values.slice(0, batch.length);
    },
  };
}

describe("DAPO's overlong penalty", () => {
  const o = { maxTokens: 20, bufferTokens: 8, penalty: 1 };
  it('is 0 up to L_max - L_cache, then falls linearly to -penalty at L_max', () => {
    assert.deepEqual(
      [0, 12, 13, 16, 20].map((n) => overlongPenalty(n, o)),
      [0, 0, -1 / 8, -0.5, -1],
    );
    assert.equal(overlongPenalty(16, { ...o, penalty: 0.5 }), -0.25);
    // a buffer longer than L_max starts at 0 tokens
    assert.equal(overlongPenalty(5, { ...o, bufferTokens: 40 }), -5 / 40);
  });

  it("counts an episode's own tokens, not its environment's", () => {
    assert.equal(policyTokens({ tokens: [1, 2, 3, 4], loss_mask: [1, 0, 0, 1] }), 2);
    assert.equal(policyTokens({ tokens: [1, 2, 3] }), 3);
  });

  it('shapes the rows the trainer reads; the statistics stay the task rewards', async () => {
    // 2, 3, 2 and 3 tokens (the cut one has no <eos>); the penalty starts after 1
    const shaping = { maxTokens: 3, bufferTokens: 2, penalty: 0.5 };
    const plain = await scoreRollouts(lines, 'chunk-0.jsonl', verifierReward('add'));
    const shaped = await scoreRollouts(lines, 'chunk-0.jsonl', verifierReward('add'), { overlong: shaping });
    assert.deepEqual(
      shaped.rows.map((r) => r.reward),
      plain.rows.map((r, i) => r.reward + [-0.25, -0.5, -0.25, -0.5][i]!),
    );
    assert.deepEqual(shaped.taskRows, plain.rows);
    assert.deepEqual(shaped.stats, plain.stats);
  });
});

describe('groupsWithSignal', () => {
  it("counts the prompt groups whose rewards, as float32, are not all equal (dynamic sampling's filter)", () => {
    const rows = (promptId: number, rewards: number[]) =>
      rewards.map((reward, i) => ({ prompt_id: promptId, sample_index: i, reward }));
    assert.deepEqual(
      groupsWithSignal([
        ...rows(1, [1, 0, 1]),
        ...rows(2, [0.5, 0.5, 0.5]),
        ...rows(3, [0.1, 0.1 + 1e-9]), // equal once rounded to float32, as the trainer reads them
        ...rows(4, [-0.25, 0.75]),
      ]),
      { groups: 4, withSignal: 2 },
    );
    assert.deepEqual(groupsWithSignal([]), { groups: 0, withSignal: 0 });
  });
});

describe('scoreRollouts', () => {
  it('returns rows in input order with binary statistics and per-group statistics', async () => {
    const { rows, stats } = await scoreRollouts(lines, 'chunk-0.jsonl', verifierReward('add'), {
      perGroup: true,
    });
    assert.deepEqual(rows, [
      { prompt_id: 7, sample_index: 0, reward: 1 },
      { prompt_id: 7, sample_index: 1, reward: 0 },
      { prompt_id: 3, sample_index: 0, reward: 0 },
      { prompt_id: 3, sample_index: 1, reward: 0 },
    ]);
    assert.equal(stats.samples, 4);
    assert.equal(stats.meanReward, 0.25);
    assert.ok(Math.abs(stats.stdReward - Math.sqrt(0.1875)) < 1e-12);
    assert.equal(stats.passRate, 0.25);
    assert.deepEqual(stats.perGroup, [
      { prompt_id: 7, samples: 2, meanReward: 0.5, stdReward: 0.5, passRate: 0.5 },
      { prompt_id: 3, samples: 2, meanReward: 0, stdReward: 0, passRate: 0 },
    ]);
  });

  it('continuous rewards pass above 0.5, binary ones at 1', async () => {
    const reward = fixedReward([0.5, 0.51, 2, -1]);
    const { stats } = await scoreRollouts(lines, 'chunk-0.jsonl', reward);
    assert.equal(stats.passRate, 0.5);
    assert.equal(stats.perGroup, undefined);
    assert.equal(reward.batches.length, 1);
    assert.equal(passes(0.99, 'binary'), false);
    assert.equal(passes(1, 'binary'), true);
    assert.equal(passes(0.5, 'continuous'), false);
  });

  it('skips blank lines but counts them in line numbers', async () => {
    const withBlank = [lines[0] as string, '', lines[1] as string, '{"prompt_id":', ''];
    await assert.rejects(scoreRollouts(withBlank, 'chunk-1.jsonl', verifierReward('add')), (err: unknown) => {
      assert.ok(err instanceof BadRolloutError);
      assert.equal(err.location.line, 4);
      assert.match(err.message, /^malformed rollout: chunk-1\.jsonl line 4: not valid JSON/);
      return true;
    });
    const { rows } = await scoreRollouts(
      ['', lines[0] as string, '  ', ''],
      'chunk-1.jsonl',
      verifierReward('add'),
    );
    assert.equal(rows.length, 1);
  });

  it('reads an async iterable of lines (a file through readline)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'moerl-rewards-score-'));
    try {
      const file = join(dir, 'chunk-0.jsonl');
      writeFileSync(file, lines.join('\n') + '\n');
      const input = createInterface({ input: createReadStream(file), crlfDelay: Infinity });
      const { rows } = await scoreRollouts(input, file, verifierReward('add'));
      assert.deepEqual(
        rows.map((r) => r.reward),
        [1, 0, 0, 0],
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('rejects a sample seen twice, naming both lines', async () => {
    await assert.rejects(
      scoreRollouts([...lines, lines[2] as string], 'chunk-0.jsonl', verifierReward('add')),
      /chunk-0\.jsonl line 5: prompt 3 sample 0 already appeared on line 3/,
    );
  });

  it('names the line of a sample whose prompt does not fit its task', async () => {
    const bad = [lines[0] as string, line(9, 0, '1+x=', '1')];
    await assert.rejects(scoreRollouts(bad, 'chunk-0.jsonl', verifierReward('add')), (err: unknown) => {
      assert.ok(err instanceof BadRolloutError);
      assert.equal(err.nonRetryable, true);
      assert.equal(err.location.line, 2);
      assert.equal(err.location.prompt, '1+x=');
      assert.match(
        err.message,
        /chunk-0\.jsonl line 2: prompt 9 sample 0: add prompt "1\+x=" must look like A\+B=/,
      );
      return true;
    });
  });

  it('rejects rollouts of another task than the verifier', async () => {
    await assert.rejects(
      scoreRollouts(lines, 'chunk-0.jsonl', verifierReward('sort')),
      /chunk-0\.jsonl line 1: rollout of prompt 7 sample 0 is for task "add", but the campaign's verifier is for "sort"/,
    );
    assert.throws(() => verifierReward('addition'), /unknown task "addition"/);
  });

  it('rejects a reward function that returns too few or non-finite rewards', async () => {
    await assert.rejects(
      scoreRollouts(lines, 's', fixedReward([1, 1])),
      /returned 2 rewards for 4 samples of s/,
    );
    await assert.rejects(
      scoreRollouts(lines, 's', fixedReward([1, NaN, 1, 1])),
      /returned NaN for sample 1 of s/,
    );
  });

  it('an empty source scores nothing', async () => {
    const reward = fixedReward([]);
    const { rows, stats } = await scoreRollouts([], 'empty.jsonl', reward);
    assert.deepEqual(rows, []);
    assert.deepEqual(stats, { samples: 0, meanReward: 0, stdReward: 0, passRate: 0 });
    assert.equal(reward.batches.length, 0);
  });
});

describe('formatRewardsJsonl', () => {
  it('writes the documented line format', () => {
    const text = formatRewardsJsonl([
      { prompt_id: 12, sample_index: 3, reward: 1 },
      { prompt_id: 12, sample_index: 4, reward: 0 },
      { prompt_id: 0, sample_index: 0, reward: -0.125 },
    ]);
    assert.equal(
      text,
      '{"prompt_id":12,"sample_index":3,"reward":1}\n' +
        '{"prompt_id":12,"sample_index":4,"reward":0}\n' +
        '{"prompt_id":0,"sample_index":0,"reward":-0.125}\n',
    );
    assert.equal(formatRewardsJsonl([]), '');
  });

  it('refuses non-finite rewards and non-integer ids', () => {
    assert.throws(
      () => formatRewardsJsonl([{ prompt_id: 1, sample_index: 0, reward: Infinity }]),
      /not finite/,
    );
    assert.throws(() => formatRewardsJsonl([{ prompt_id: 1.5, sample_index: 0, reward: 1 }]), /integers/);
  });
});

const { bin, skip, run, env } = nativeTools(['moe_train', 'moe_generate']);

describe('moe_train grpo reads formatRewardsJsonl output', { skip }, () => {
  let dir: string;
  let rollouts: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-rewards-grpo-'));
    await run(bin('moe_train'), ['init', '--out', join(dir, 'init'), '--seed', '4'], { env });
    await run(
      bin('moe_generate'),
      ['--checkpoint', join(dir, 'init'), '--task', 'reverse', '--out-dir', join(dir, 'rollouts')].concat([
        '--num-prompts',
        '4',
        '--samples',
        '4',
        '--chunk-size',
        '4',
        '--temperature',
        '2',
        '--max-new-tokens',
        '6',
      ]),
      { env },
    );
    rollouts = join(dir, 'rollouts', 'chunk-0.jsonl');
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  // Continuous rewards that differ within each group, so GRPO takes a real step.
  const reward: RewardFunction = {
    name: 'by-sample-index',
    kind: 'continuous',
    score: async (batch) => batch.map((r) => r.sample_index * 0.25 - 0.1),
  };

  it('trains one step, reporting our mean reward', async () => {
    const { rows, stats } = await scoreRollouts(readFileSync(rollouts, 'utf8').split('\n'), rollouts, reward);
    const rewardsFile = join(dir, 'rewards.jsonl');
    writeFileSync(rewardsFile, formatRewardsJsonl(rows));
    const metricsFile = join(dir, 'metrics.jsonl');
    await run(
      bin('moe_train'),
      ['grpo', '--checkpoint', join(dir, 'init'), '--out', join(dir, 'next'), '--rollouts', rollouts].concat([
        '--rewards',
        rewardsFile,
        '--metrics',
        metricsFile,
      ]),
      { env },
    );
    const metrics = JSON.parse(readFileSync(metricsFile, 'utf8').trim().split('\n')[0] as string) as {
      mean_reward: number;
      groups: number;
      skipped_groups: number;
    };
    assert.ok(
      Math.abs(metrics.mean_reward - stats.meanReward) < 1e-6,
      `${metrics.mean_reward} vs ${stats.meanReward}`,
    );
    assert.equal(metrics.groups, 4);
    assert.equal(metrics.skipped_groups, 0);
    assert.ok(existsSync(join(dir, 'next', 'manifest.json')));
  });

  it('exits 2 (bad input) when a sample has no reward', async () => {
    const { rows } = await scoreRollouts(readFileSync(rollouts, 'utf8').split('\n'), rollouts, reward);
    const rewardsFile = join(dir, 'rewards-short.jsonl');
    writeFileSync(rewardsFile, formatRewardsJsonl(rows.slice(1)));
    const args = [
      'grpo',
      '--checkpoint',
      join(dir, 'init'),
      '--out',
      join(dir, 'short'),
      '--rollouts',
      rollouts,
    ];
    await assert.rejects(
      run(bin('moe_train'), [...args, '--rewards', rewardsFile], { env }),
      (err: unknown) => {
        const e = err as { code?: number; stderr?: string };
        assert.equal(e.code, 2);
        assert.match(e.stderr ?? '', /no reward for prompt 0 sample 0/);
        return true;
      },
    );
  });
});
