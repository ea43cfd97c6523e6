// Rescoring a foreign engine's completions at the sampling temperature (docs/engines.md,
// "Log-probs and temperature"). An OpenAI-compatible server returns log p of each sampled token
// at temperature 1 (the model's own distribution, before the sampler), while a rollout record's
// `logprobs` is the behaviour log-prob under softmax(logits / T) of the sampling temperature T,
// which the trainers' ratios and truncated importance sampling read. At T != 1 (and T > 0: a
// greedy record carries temperature 1, as moe_generate's) the rollout activity scores each
// chunk's completions once more with the native core on the worker's own copy of the policy:
// `moe_hf score --checkpoint DIR --serve --temperature T --completions`, one process per shard
// that loads the policy once, and one forward per chunk (split by --max-batch-tokens when the
// chunk is long). This file runs it, builds its input and checks its output;
// rollout-generators.ts asks it for each chunk.
import { spawn } from 'node:child_process';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { ApplicationFailure } from '@temporalio/common';
import { toolFailure } from '../native.js';
import type { ToolRun } from '../native.js';

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

export interface RescorerOptions {
  /** The moe_hf binary. */
  moeHf: string;
  /** The policy the chunks were sampled from, as a moerl checkpoint directory. */
  checkpointDir: string;
  temperature: number;
  /** Where the sequences files of the requests are written. */
  workDir: string;
  /** Names the scorer in messages ("rollout of iteration 3 shard 1"). */
  what: string;
  /** Aborting kills the scorer: a request in flight then resolves null. */
  signal: AbortSignal;
}

/** One scorer process for a shard's chunks: the policy loaded once, one forward pass per chunk. */
export interface Rescorer {
  /**
   * Each sample's log-probs under softmax(logits / T); null when aborted. `what` names the chunk.
   * A scorer that exits 2 is bad input (not retried), another failure retryable (the chunk is
   * done again), output that does not fit the chunk RolloutRescoreInvalid.
   */
  score(samples: readonly RescoredSample[], what: string): Promise<number[][] | null>;
  /** Ends the scorer (stdin closed, then SIGKILL after 10 s). */
  close(): Promise<void>;
}

const stderrTailBytes = 4096;

/**
 * Starts `moe_hf score --serve` on the checkpoint: it loads the policy once, then scores the
 * sequences file named by each line written to its stdin (one request at a time).
 */
export function startRescorer(o: RescorerOptions): Rescorer {
  // prettier-ignore
  const child = spawn(o.moeHf, [
    'score', '--checkpoint', o.checkpointDir, '--serve',
    '--temperature', String(o.temperature), '--completions',
    '--max-batch-tokens', String(rescoreBatchTokens),
  ], {
    // One rank, one thread: the shard holds one of the worker's rank slots.
    env: { ...process.env, OPENBLAS_NUM_THREADS: '1' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d: string) => {
    stderr = (stderr + d).slice(-stderrTailBytes);
  });
  // A closed stdin (the scorer gone) is reported by its exit, not as an unhandled error.
  child.stdin.on('error', () => {});
  let lines: string[] = [];
  let pending: {
    what: string;
    resolve: (out: string | null) => void;
    reject: (err: unknown) => void;
  } | null = null;
  let exit: ToolRun | null = null;
  let spawnError: Error | null = null;
  const failure = (what: string): unknown =>
    spawnError ??
    toolFailure(`moe_hf score (${what})`, exit ?? { code: null, signal: null, stderrTail: stderr });
  createInterface({ input: child.stdout }).on('line', (line) => {
    if (line.startsWith('{"ready"')) return;
    if (line.startsWith('{"done"')) {
      const out = lines.join('\n');
      lines = [];
      pending?.resolve(out);
      pending = null;
      return;
    }
    lines.push(line);
  });
  child.on('error', (err) => {
    spawnError = err;
  });
  child.on('close', (code, signal) => {
    exit = { code, signal, stderrTail: stderr.trim() };
    o.signal.removeEventListener('abort', kill);
    if (!pending) return;
    if (o.signal.aborted) pending.resolve(null);
    else pending.reject(failure(pending.what));
    pending = null;
  });
  const kill = () => child.kill('SIGKILL');
  o.signal.addEventListener('abort', kill, { once: true });
  let requests = 0;
  return {
    async score(samples, what) {
      const input = rescoreInput(samples);
      if (input === '') return samples.map(() => []);
      if (o.signal.aborted) return null;
      if (exit || spawnError) throw failure(what);
      const file = join(o.workDir, `rescore-${requests++}.jsonl`);
      await writeFile(file, input);
      const out = await new Promise<string | null>((resolve, reject) => {
        pending = { what, resolve, reject };
        child.stdin.write(`${file}\n`);
      });
      await rm(file, { force: true });
      return out === null ? null : parseRescored(out, samples, what);
    },
    async close() {
      if (exit || spawnError) return;
      const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
      child.stdin.end();
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await closed;
      clearTimeout(timer);
    },
  };
}

export interface Rescoring {
  /** The moe_hf binary. */
  moeHf: string;
  /** The policy the chunk was sampled from, as a moerl checkpoint directory. */
  checkpointDir: string;
  temperature: number;
  samples: readonly RescoredSample[];
  /** Where the sequences file is written. */
  workDir: string;
  /** Names the chunk in messages ("rollout of iteration 3 shard 1 chunk 2"). */
  what: string;
  /** Aborting kills the scorer: the result is then null. */
  signal: AbortSignal;
}

/** One chunk rescored by a scorer of its own (startRescorer): started, asked once, closed. */
export async function rescoreSamples(r: Rescoring): Promise<number[][] | null> {
  if (rescoreInput(r.samples) === '') return r.samples.map(() => []);
  const scorer = startRescorer(r);
  try {
    return await scorer.score(r.samples, r.what);
  } finally {
    await scorer.close();
  }
}
