// The TypeScript verifiers against docs/tasks.md, and against the native moe_reward on
// rollouts from the native moe_generate (skipped when the native tools are not built).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { badInputErrorType } from '../../activities/types.js';
import { BadRolloutError } from '../../activities/rewards/errors.js';
import { verifierReward } from '../../activities/rewards/reward-model.js';
import { parseRolloutLine, type RolloutRecord } from '../../activities/rewards/rollout-record.js';
import { nativeTools } from '../support/native-tools.js';
import { formatRewardsJsonl, scoreRollouts } from '../../activities/rewards/score.js';
import { expectedAnswer, taskNames, verify } from '../../activities/rewards/verifiers.js';

const stop = (prompt: string, text: string) => ({ prompt, text, finish_reason: 'stop' });
const length = (prompt: string, text: string) => ({ prompt, text, finish_reason: 'length' });

function assertBadPrompt(task: string, prompt: string): void {
  assert.throws(
    () => expectedAnswer(task, prompt),
    (err: unknown) => {
      assert.ok(err instanceof BadRolloutError, `expected BadRolloutError, got ${String(err)}`);
      assert.equal(err.type, badInputErrorType);
      assert.equal(err.nonRetryable, true);
      assert.equal(err.location.task, task);
      assert.equal(err.location.prompt, prompt);
      assert.ok(err.message.includes(task) && err.message.includes(JSON.stringify(prompt)), err.message);
      return true;
    },
    `${task} ${JSON.stringify(prompt)} should be rejected`,
  );
}

describe('expectedAnswer and verify', () => {
  it('add: the sum without leading zeros; operands may carry leading zeros', () => {
    assert.equal(expectedAnswer('add', '47+815='), '862');
    assert.equal(expectedAnswer('add', '0+0='), '0');
    assert.equal(expectedAnswer('add', '007+003='), '10');
    assert.equal(expectedAnswer('add', '999999999+999999999='), '1999999998');
    assert.equal(verify('add', stop('47+815=', '862')), 1);
    assert.equal(verify('add', stop('47+815=', '863')), 0);
    assert.equal(verify('add', stop('47+815=', '0862')), 0, 'leading zero is wrong');
    assert.equal(verify('add', stop('47+815=', '862 ')), 0, 'no trimming');
    assert.equal(verify('add', stop('47+815=', '')), 0);
    assert.equal(verify('add', length('47+815=', '862')), 0, 'a truncated sample scores 0');
  });

  it('sort: the digits ascending', () => {
    assert.equal(expectedAnswer('sort', 'sort:3912='), '1239');
    assert.equal(expectedAnswer('sort', 'sort:0090='), '0009');
    assert.equal(expectedAnswer('sort', 'sort:='), '');
    assert.equal(verify('sort', stop('sort:3912=', '1239')), 1);
    assert.equal(verify('sort', stop('sort:0090=', '0009')), 1, 'leading zeros belong to the answer');
    assert.equal(verify('sort', stop('sort:0090=', '9')), 0);
    assert.equal(verify('sort', stop('sort:3912=', '9321')), 0);
    assert.equal(verify('sort', stop('sort:=', '')), 1);
    assert.equal(verify('sort', length('sort:3912=', '1239')), 0);
  });

  it('reverse: the letters in reverse order', () => {
    assert.equal(expectedAnswer('reverse', 'rev:abcd='), 'dcba');
    assert.equal(expectedAnswer('reverse', 'rev:='), '');
    assert.equal(verify('reverse', stop('rev:abcd=', 'dcba')), 1);
    assert.equal(verify('reverse', stop('rev:abcd=', 'abcd')), 0);
    assert.equal(verify('reverse', stop('rev:abcd=', 'DCBA')), 0, 'no case folding');
    assert.equal(verify('reverse', length('rev:abcd=', 'dcba')), 0);
  });

  it('rejects prompts not in the task format as bad input', () => {
    for (const p of [
      '47+815',
      '+815=',
      '47+=',
      '47=',
      '4a+1=',
      '1234567890+1=',
      '1+2+3=',
      ' 1+2=',
      '1+2= ',
      '-1+2=',
    ]) {
      assertBadPrompt('add', p);
    }
    for (const p of ['sort:3912', 'sort3912=', 'sort:39a=', 'sort:1 2=', 'rev:12=', 'SORT:12=']) {
      assertBadPrompt('sort', p);
    }
    for (const p of ['rev:abc', 'rev:aBc=', 'rev:ab1=', 'reverse:abc=', 'sort:abc=', '']) {
      assertBadPrompt('reverse', p);
    }
    // verify rejects them too, whatever the finish reason.
    assert.throws(() => verify('add', length('47+', '')), BadRolloutError);
  });

  it('rejects an unknown task, naming the known ones', () => {
    assert.throws(
      () => expectedAnswer('addition', '1+2='),
      /unknown task "addition"; known tasks: add, sort, reverse/,
    );
    assert.deepEqual([...taskNames], ['add', 'sort', 'reverse']);
  });
});

const { bin, skip, run, env } = nativeTools(['moe_train', 'moe_generate', 'moe_reward']);

describe('agreement with the native moe_reward', { skip }, () => {
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-rewards-native-'));
    await run(bin('moe_train'), ['init', '--out', join(dir, 'init'), '--seed', '3'], { env });
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  async function generate(checkpoint: string, task: string, out: string, flags: string[]): Promise<string> {
    const args = ['--checkpoint', checkpoint, '--task', task, '--out-dir', out, '--num-prompts', '12'];
    await run(
      bin('moe_generate'),
      [...args, '--samples', '4', '--chunk-size', '12', '--seed', '5', ...flags],
      { env },
    );
    return join(out, 'chunk-0.jsonl');
  }

  /** Scores `file` with moe_reward and with the TS verifier; both rewards files must be byte-equal. */
  async function compare(task: string, file: string): Promise<number[]> {
    const nativeOut = `${file}.native-rewards.jsonl`;
    const { stdout } = await run(bin('moe_reward'), ['--rollouts', file, '--out', nativeOut], { env });
    const lines = readFileSync(file, 'utf8').split('\n');
    const scored = await scoreRollouts(lines, file, verifierReward(task));
    assert.equal(
      formatRewardsJsonl(scored.rows),
      readFileSync(nativeOut, 'utf8'),
      `${task}: rewards files differ`,
    );
    const summary = JSON.parse(stdout) as { samples: number; mean_reward: number; accuracy: number };
    assert.equal(scored.stats.samples, summary.samples);
    assert.ok(Math.abs(scored.stats.meanReward - summary.mean_reward) < 1e-6);
    assert.ok(Math.abs(scored.stats.passRate - summary.accuracy) < 1e-6);
    return scored.rows.map((r) => r.reward);
  }

  it('a fresh policy at temperature 3: same reward for every sample of every task', async () => {
    for (const task of taskNames) {
      const file = await generate(join(dir, 'init'), task, join(dir, `fresh-${task}`), [
        '--temperature',
        '3',
        '--max-new-tokens',
        '4',
      ]);
      const records = readFileSync(file, 'utf8')
        .trim()
        .split('\n')
        .map((l, i) => parseRolloutLine(l, { source: file, line: i + 1 }));
      assert.ok(
        records.some((r) => r.finish_reason === 'length'),
        `${task}: no truncated sample`,
      );
      await compare(task, file);
    }
  });

  it('hand-edited samples (right, wrong, leading zero, truncated) of native prompts', async () => {
    for (const task of taskNames) {
      const file = await generate(join(dir, 'init'), task, join(dir, `edited-${task}`), [
        '--max-new-tokens',
        '2',
      ]);
      const records = readFileSync(file, 'utf8')
        .trim()
        .split('\n')
        .map((l, i) => parseRolloutLine(l, { source: file, line: i + 1 }));
      const edited = records.map((r: RolloutRecord, i) => {
        const answer = expectedAnswer(task, r.prompt);
        const text = [answer, `0${answer}`, `${answer}9`, answer][i % 4] as string;
        const finish = i % 4 === 3 ? 'length' : 'stop';
        // tokens must keep the documented shape: "stop" ends with <eos> (1); logprobs match tokens.
        const tokens = finish === 'stop' ? [...Array.from(text, () => 2), 1] : Array.from(text, () => 2);
        return { ...r, text, tokens, logprobs: tokens.map(() => -1), finish_reason: finish };
      });
      const editedFile = join(dir, `edited-${task}.jsonl`);
      writeFileSync(editedFile, edited.map((r) => JSON.stringify(r)).join('\n') + '\n');
      const rewards = await compare(task, editedFile);
      assert.deepEqual(
        rewards,
        edited.map((_, i) => (i % 4 === 0 ? 1 : 0)),
      );
    }
  });

  it('a briefly fine-tuned policy (sort, 60 SFT steps): mixed rewards, identical', async () => {
    const sft = join(dir, 'sft');
    await run(
      bin('moe_train'),
      [
        'sft',
        '--checkpoint',
        join(dir, 'init'),
        '--out',
        sft,
        '--task',
        'sort',
        '--steps',
        '60',
        '--batch-size',
        '32',
        '--lr',
        '3e-3',
      ],
      { env },
    );
    const file = await generate(sft, 'sort', join(dir, 'sft-sort'), [
      '--temperature',
      '0.7',
      '--max-new-tokens',
      '10',
    ]);
    const rewards = await compare('sort', file);
    assert.ok(rewards.includes(1) && rewards.includes(0), `expected both outcomes, got ${rewards.join('')}`);
  });
});
