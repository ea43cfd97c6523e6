// Rescoring a foreign engine's completions at the sampling temperature (docs/engines.md,
// "Log-probs and temperature"). An OpenAI-compatible server returns log p of each sampled token
// at temperature 1 (the model's own distribution, before the sampler), while a rollout record's
// `logprobs` is the behaviour log-prob under softmax(logits / T) of the sampling temperature T,
// which the trainers' ratios and truncated importance sampling read. At T != 1 (and T > 0: a
// greedy record carries temperature 1, as moe_generate's) the rollout activity scores each
// chunk's completions once more with the native core on the worker's own copy of the policy:
// `moe_hf score --checkpoint DIR --temperature T --completions`, one process and one forward per
// chunk (split by --max-batch-tokens when the chunk is long). This file builds its input and
// checks its output; rollout-generators.ts runs it.
import { writeFile } from 'node:fs/promises';
import { ApplicationFailure } from '@temporalio/common';
import { runTool, toolFailure } from '../native.js';

/** Type of a rescoring whose output does not fit the chunk (a count, a value): not retried. */
export const rescoreInvalidErrorType = 'RolloutRescoreInvalid';

/**
 * Padded tokens per forward of the rescoring (`--max-batch-tokens`): bounds the logits the
 * scorer holds to this many rows of the vocabulary (4096 x 151936 float32 = 2.3 GiB for
 * Qwen3's vocabulary); a chunk of the tests' model is one forward.
 */
export const rescoreBatchTokens = 4096;

/** Whether the log-probs of a completion sampled at `temperature` differ from the engine's (T = 1). */
export function needsRescoring(temperature: number): boolean {
  return temperature > 0 && Math.fround(temperature) !== 1;
}

/** One completion to rescore: its prompt and sampled tokens. */
export interface RescoredSample {
  promptTokens: readonly number[];
  tokens: readonly number[];
}

/**
 * moe_hf score's sequences file: one line per completion with at least one token (one without
 * tokens has nothing to score and is left out), prompt and completion as one sequence.
 */
export function rescoreInput(samples: readonly RescoredSample[]): string {
  return samples
    .filter((s) => s.tokens.length > 0)
    .map(
      (s) =>
        JSON.stringify({ tokens: [...s.promptTokens, ...s.tokens], prompt_len: s.promptTokens.length }) +
        '\n',
    )
    .join('');
}

/**
 * The log-probs of each sample's tokens from moe_hf score's stdout (one `{"logprobs":[...]}`
 * line per sequence of rescoreInput, in order; a sample without tokens gets []). Anything else
 * (a line too many or too few, a count that is not the sample's tokens, a value that is not the
 * finite log of a probability) throws a non-retryable RolloutRescoreInvalid naming `what` (the
 * chunk) and the sample.
 */
export function parseRescored(stdout: string, samples: readonly RescoredSample[], what: string): number[][] {
  const bad = (message: string) =>
    ApplicationFailure.create({
      type: rescoreInvalidErrorType,
      nonRetryable: true,
      message: `${what}: the rescoring at the sampling temperature (moe_hf score) ${message}`,
    });
  const lines = stdout.split('\n').filter((l) => l.trim() !== '');
  const scored = samples.filter((s) => s.tokens.length > 0).length;
  if (lines.length !== scored)
    throw bad(`printed ${lines.length} lines for ${scored} completions with tokens`);
  let next = 0;
  return samples.map((s, i) => {
    if (s.tokens.length === 0) return [];
    const line = lines[next++]!;
    let values: unknown;
    try {
      values = (JSON.parse(line) as { logprobs?: unknown } | null)?.logprobs;
    } catch {
      throw bad(`printed a line that is not JSON for sample ${i}: ${line.slice(0, 200)}`);
    }
    if (!Array.isArray(values))
      throw bad(`printed no "logprobs" array for sample ${i}: ${line.slice(0, 200)}`);
    if (values.length !== s.tokens.length)
      throw bad(`gave ${values.length} log-probs for the ${s.tokens.length} tokens of sample ${i}`);
    const at = values.findIndex((v) => typeof v !== 'number' || !Number.isFinite(v) || v > 1e-6);
    if (at >= 0)
      throw bad(
        `gave ${JSON.stringify(values[at]) ?? 'undefined'} for token ${at} of sample ${i}, not the log of a probability`,
      );
    return values as number[];
  });
}

export interface Rescoring {
  /** The moe_hf binary. */
  moeHf: string;
  /** The policy the chunk was sampled from, as a moerl checkpoint directory. */
  checkpointDir: string;
  temperature: number;
  samples: readonly RescoredSample[];
  /** The sequences file to write. */
  inputFile: string;
  /** Names the chunk in messages ("rollout of iteration 3 shard 1 chunk 2"). */
  what: string;
  /** Aborting kills the scorer: the result is then null. */
  signal: AbortSignal;
}

/**
 * Each sample's log-probs under softmax(logits / T) by the native scorer; null when aborted. A
 * scorer that exits 2 is bad input (not retried), another failure retryable (the chunk is done
 * again), output that does not fit the chunk RolloutRescoreInvalid.
 */
export async function rescoreSamples(r: Rescoring): Promise<number[][] | null> {
  const input = rescoreInput(r.samples);
  if (input === '') return r.samples.map(() => []);
  await writeFile(r.inputFile, input);
  let stdout = '';
  const run = await runTool(
    r.moeHf,
    // prettier-ignore
    [
      'score', '--checkpoint', r.checkpointDir, '--sequences', r.inputFile,
      '--temperature', String(r.temperature), '--completions',
      '--max-batch-tokens', String(rescoreBatchTokens),
    ],
    {
      // One rank, one thread: the shard holds one of the worker's rank slots.
      env: { OPENBLAS_NUM_THREADS: '1' },
      signal: r.signal,
      onRecord: (rec) => {
        stdout += JSON.stringify(rec) + '\n';
      },
    },
  );
  if (r.signal.aborted) return null;
  if (run.code !== 0) throw toolFailure(`moe_hf score (${r.what})`, run);
  return parseRescored(stdout, r.samples, r.what);
}
