// The rescoring of a foreign engine's completions at the sampling temperature
// (activities/engines/rescore.ts): when it runs, the scorer's input, and the checks of its
// output, on fake scorer output (strings written here) and a fake `moe_hf score --serve` (a shell
// script written here that answers what the test says). The real scorer on real completions of a llama-server:
// test/integration/llamacpp-engine.test.ts and openai-rollout-campaign.test.ts.
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import {
  needsRescoring,
  parseRescored,
  rescoreInput,
  rescoreInvalidErrorType,
  rescoreSamples,
  startRescorer,
} from '../../activities/engines/rescore.js';
import type { RescoredSample } from '../../activities/engines/rescore.js';

const work = mkdtempSync(join(tmpdir(), 'moerl-rescore-'));
after(() => rmSync(work, { recursive: true, force: true }));

const what = 'rollout of iteration 3 shard 1 chunk 2';
const samples: RescoredSample[] = [
  { promptTokens: [5, 6], tokens: [7, 8, 9] },
  { promptTokens: [5, 6], tokens: [] },
  { promptTokens: [10], tokens: [11] },
];
const line = (logprobs: unknown) => JSON.stringify({ logprobs }) + '\n';

/** The RolloutRescoreInvalid `fn` throws, its message matched against `message`. */
function assertInvalid(fn: () => unknown, message: RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof ApplicationFailure);
    assert.equal(err.type, rescoreInvalidErrorType);
    assert.equal(err.nonRetryable, true);
    assert.ok(err.message.startsWith(`${what}: `), err.message);
    assert.match(err.message, message);
    return true;
  });
}

describe('rescoring at the sampling temperature (fake scorer output)', () => {
  it('runs at temperatures other than 1 only; greedy records carry temperature 1', () => {
    assert.equal(needsRescoring(0.7), true);
    assert.equal(needsRescoring(1.3), true);
    assert.equal(needsRescoring(1), false);
    assert.equal(needsRescoring(1 + 1e-12), false, 'float32 1, as moe_generate reads it');
    assert.equal(needsRescoring(0), false);
  });

  it('the input has prompt and completion as one sequence with prompt_len; empty completions left out', () => {
    assert.equal(
      rescoreInput(samples),
      '{"tokens":[5,6,7,8,9],"prompt_len":2}\n{"tokens":[10,11],"prompt_len":1}\n',
    );
  });

  it('parses one line per completion with tokens, an empty completion gets none', () => {
    const out = line([-0.5, -1.25, -3]) + line([-0.125]);
    assert.deepEqual(parseRescored(out, samples, what), [[-0.5, -1.25, -3], [], [-0.125]]);
  });

  it('a line too many or too few names the chunk and the counts', () => {
    assertInvalid(
      () => parseRescored(line([-0.5, -1, -3]), samples, what),
      /printed 1 lines for 2 completions/,
    );
    const three = line([-0.5, -1, -3]) + line([-0.1]) + line([-0.2]);
    assertInvalid(() => parseRescored(three, samples, what), /printed 3 lines for 2 completions/);
  });

  it('a wrong token count names the sample', () => {
    const out = line([-0.5, -1]) + line([-0.125]);
    assertInvalid(() => parseRescored(out, samples, what), /gave 2 log-probs for the 3 tokens of sample 0/);
  });

  it("a non-finite or positive value, or a line that is not the scorer's, is refused", () => {
    for (const [bad, message] of [
      [null, /gave null for token 1 of sample 0/],
      ['NaN', /gave "NaN" for token 1 of sample 0/],
      [0.5, /gave 0.5 for token 1 of sample 0, not the log of a probability/],
    ] as const)
      assertInvalid(() => parseRescored(line([-0.5, bad, -3]) + line([-0.1]), samples, what), message);
    assertInvalid(
      () => parseRescored(line([-0.5, -1, -3]) + '{"logprobs":[-0.1\n', samples, what),
      /a line that is not JSON for sample 2/,
    );
    assertInvalid(
      () => parseRescored(line([-0.5, -1, -3]) + '{"loss":1}\n', samples, what),
      /no "logprobs" array for sample 2/,
    );
  });

  describe('a fake moe_hf score --serve (a script)', () => {
    /**
     * A fake scorer: records its arguments and each start, answers "ready", then for each stdin
     * line saves the file it names and prints `stdout` and "done"; with `code` other than 0 it
     * exits with it at its first request instead (exit 2 with an error line), with `hang` it
     * never answers.
     */
    function fakeMoeHf(stdout: string, code = 0, hang = false): string {
      const path = join(work, `fake-moe_hf-${Math.random().toString(36).slice(2)}`);
      writeFileSync(join(work, 'stdout'), stdout);
      rmSync(join(work, 'starts'), { force: true });
      const onRequest = hang
        ? 'sleep 60'
        : code !== 0
          ? `${code === 2 ? "echo 'moe_hf: error: tools/moe_hf.cc:1: bad input' >&2; " : ''}exit ${code}`
          : `cat ${work}/stdout; echo '{"done":true}'`;
      writeFileSync(
        path,
        `#!/bin/sh\necho "$@" > ${work}/args\necho start >> ${work}/starts\necho '{"ready":true}'\n` +
          `while read file; do cat "$file" >> ${work}/input; ${onRequest}; done\n`,
      );
      chmodSync(path, 0o755);
      rmSync(join(work, 'input'), { force: true });
      return path;
    }
    const options = (moeHf: string, signal = new AbortController().signal) => ({
      moeHf,
      checkpointDir: '/ckpt',
      temperature: 0.7,
      workDir: work,
      what: 'rollout of iteration 3 shard 1',
      signal,
    });
    const run = (moeHf: string, signal = new AbortController().signal) =>
      rescoreSamples({ ...options(moeHf, signal), samples, what });

    it('is started once per shard on the checkpoint at the temperature, and asked once per chunk', async () => {
      const scorer = startRescorer(options(fakeMoeHf(line([-0.5, -1.25, -3]) + line([-0.125]))));
      try {
        for (const k of [0, 1])
          assert.deepEqual(await scorer.score(samples, `${what} ${k}`), [[-0.5, -1.25, -3], [], [-0.125]]);
      } finally {
        await scorer.close();
      }
      assert.equal(
        readFileSync(join(work, 'args'), 'utf8').trim(),
        'score --checkpoint /ckpt --serve --temperature 0.7 --completions --max-batch-tokens 4096',
      );
      assert.equal(readFileSync(join(work, 'starts'), 'utf8'), 'start\n', 'one process for both chunks');
      assert.equal(readFileSync(join(work, 'input'), 'utf8'), rescoreInput(samples).repeat(2));
    });

    it('output that does not fit the chunk is RolloutRescoreInvalid', async () => {
      await assert.rejects(run(fakeMoeHf(line([-0.5]) + line([-0.125]))), (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure);
        assert.equal(err.type, rescoreInvalidErrorType);
        assert.match(err.message, /chunk 2: .*gave 1 log-probs for the 3 tokens of sample 0/);
        return true;
      });
    });

    it('exit 2 is bad input, not retried; another exit is retried; both name the chunk', async () => {
      await assert.rejects(run(fakeMoeHf('', 2)), (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure);
        assert.equal(err.type, 'BadInput');
        assert.equal(err.nonRetryable, true);
        assert.match(
          err.message,
          /^moe_hf score \(rollout of iteration 3 shard 1 chunk 2\) exited with code 2: .*bad input/,
        );
        return true;
      });
      await assert.rejects(run(fakeMoeHf('', 1)), (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure);
        assert.equal(err.type, 'NativeToolFailed');
        assert.equal(err.nonRetryable, false);
        assert.match(err.message, /chunk 2\) exited with code 1/);
        return true;
      });
    });

    it('an abort kills the scorer and the chunk in flight gets no log-probs', async () => {
      const stop = new AbortController();
      const scoring = run(fakeMoeHf('', 0, true), stop.signal);
      setTimeout(() => stop.abort(), 200);
      assert.equal(await scoring, null);
    });

    it('a chunk without tokens asks the scorer nothing', async () => {
      const none = await rescoreSamples({
        ...options(join(work, 'no-such-moe_hf')),
        samples: [{ promptTokens: [1], tokens: [] }],
        what,
      });
      assert.deepEqual(none, [[]]);
    });
  });
});
