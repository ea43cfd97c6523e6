// Pluggable rewards: a RewardFunction scores a batch of rollout records. Two kinds ship:
// the exact-match verifiers of the built-in tasks, and a client of an HTTP reward model
// (protocol in docs/rewards.md) with batching, a per-request timeout, and retries with
// exponential backoff and jitter for failures that may pass (5xx, 408, 429, network, timeout).
import { BadInputError, BadRolloutError, RewardModelError } from './errors.js';
import type { RolloutRecord } from './rollout-record.js';
import { isTaskName, taskNames, verify } from './verifiers.js';

/**
 * How rewards are read: "binary" rewards are 0 or 1 and a sample passes at reward >= 1;
 * "continuous" rewards are any real number and a sample passes at reward > 0.5.
 */
export type RewardKind = 'binary' | 'continuous';

export interface RewardFunction {
  /** Shown in logs and metrics, e.g. "verifier:add" or "http:https://rm.example/score". */
  readonly name: string;
  readonly kind: RewardKind;
  /** One finite reward per record, in the order of `batch`. */
  score(batch: readonly RolloutRecord[]): Promise<number[]>;
}

/** The exact-match verifier of a built-in task (docs/tasks.md) as a RewardFunction. */
export function verifierReward(task: string): RewardFunction {
  if (!isTaskName(task)) {
    throw new BadInputError(`unknown task ${JSON.stringify(task)}; known tasks: ${taskNames.join(', ')}`);
  }
  return {
    name: `verifier:${task}`,
    kind: 'binary',
    score: async (batch) =>
      batch.map((record) => {
        if (record.task !== task) {
          throw new BadRolloutError(
            `rollout of prompt ${record.prompt_id} sample ${record.sample_index} is for task ` +
              `${JSON.stringify(record.task)}, but the campaign's verifier is for ${JSON.stringify(task)}`,
            {
              field: 'task',
              task: record.task,
              prompt: record.prompt,
              prompt_id: record.prompt_id,
              sample_index: record.sample_index,
            },
          );
        }
        try {
          return verify(task, record);
        } catch (err) {
          if (!(err instanceof BadRolloutError)) throw err;
          throw err.at(`prompt ${record.prompt_id} sample ${record.sample_index}`, {
            prompt_id: record.prompt_id,
            sample_index: record.sample_index,
          });
        }
      }),
  };
}

export interface HttpRewardModelOptions {
  /** Endpoint that takes POST requests (http or https). */
  url: string;
  /** Limit per request, from sending to the last byte of the response. */
  timeoutMs: number;
  /** Extra attempts after the first for retryable failures (0 = try once). */
  maxRetries: number;
  /** Samples per request at most. */
  batchSize: number;
  /** Sent with every request (e.g. authorization); never logged or put in error messages. */
  headers?: Record<string, string>;
  /** How to read the model's rewards for the pass rate; default "continuous". */
  kind?: RewardKind;
  /** Backoff before retry n (1-based) is uniform in [d/2, d], d = min(max, initial * 2^(n-1)). */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** Aborts the current request and any wait (e.g. the activity's cancellation signal). */
  signal?: AbortSignal;
}

/** One sample as sent to the reward model. */
export interface RewardModelSample {
  prompt: string;
  completion: string;
  prompt_id: number;
  sample_index: number;
  task: string;
  finish_reason: string;
}

function checkOptions(o: HttpRewardModelOptions): URL {
  const bad = (field: string, value: unknown, allowed: string) =>
    new BadInputError(`httpRewardModel: ${field} ${JSON.stringify(value)} is invalid; ${allowed}`);
  let url: URL;
  try {
    url = new URL(o.url);
  } catch {
    throw bad('url', o.url, 'expected an absolute http:// or https:// URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw bad('url', `${url.protocol}//${url.host}`, 'expected an http:// or https:// URL');
  }
  if (url.username !== '' || url.password !== '') {
    // fetch refuses such URLs; credentials belong in `headers`, which are never shown.
    throw new BadInputError('httpRewardModel: url must not carry user info; send credentials in headers');
  }
  const positiveInt = (field: string, value: number, min: number) => {
    if (!Number.isSafeInteger(value) || value < min) throw bad(field, value, `expected an integer >= ${min}`);
  };
  positiveInt('timeoutMs', o.timeoutMs, 1);
  positiveInt('maxRetries', o.maxRetries, 0);
  positiveInt('batchSize', o.batchSize, 1);
  positiveInt('initialBackoffMs', o.initialBackoffMs ?? 0, 0);
  positiveInt('maxBackoffMs', o.maxBackoffMs ?? 0, 0);
  return url;
}

/** A failure of one attempt; `retryable` says whether another attempt may succeed. */
class AttemptError extends Error {
  constructor(
    message: string,
    readonly retryable: boolean,
    readonly status?: number,
  ) {
    super(message);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function excerpt(text: string): string {
  const oneLine = text.replace(/\s+/g, ' ').trim();
  return oneLine.length > 200 ? `${oneLine.slice(0, 200)}...` : oneLine;
}

/**
 * A client of an HTTP reward model: POST `{ samples: [...] }` → `{ rewards: [...] }`, at most
 * `batchSize` samples a request, requests one after another.
 */
export function httpRewardModel(options: HttpRewardModelOptions): RewardFunction {
  const url = checkOptions(options);
  // Credentials may sit in the URL's user info or query; messages show origin and path only.
  const shownUrl = `${url.origin}${url.pathname}`;
  const initialBackoffMs = options.initialBackoffMs ?? 200;
  const maxBackoffMs = options.maxBackoffMs ?? 5000;
  const headers = { 'content-type': 'application/json', accept: 'application/json', ...options.headers };

  async function attempt(samples: RewardModelSample[]): Promise<number[]> {
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), options.timeoutMs);
    const signal = options.signal ? AbortSignal.any([timeout.signal, options.signal]) : timeout.signal;
    try {
      let response: Response;
      let body: string;
      try {
        response = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ samples }), signal });
        body = await response.text();
      } catch (err) {
        if (options.signal?.aborted) throw err;
        if (timeout.signal.aborted)
          throw new AttemptError(`no response within ${options.timeoutMs} ms`, true);
        const cause = (err as Error).cause as Error | undefined;
        throw new AttemptError(`request failed: ${cause?.message ?? (err as Error).message}`, true);
      }
      const status = response.status;
      if (status < 200 || status > 299) {
        const retryable = status >= 500 || status === 408 || status === 429;
        throw new AttemptError(`HTTP ${status}: ${excerpt(body) || response.statusText}`, retryable, status);
      }
      // A 2xx answer that breaks the protocol is a server bug: asking again would not fix it.
      let parsed: unknown;
      try {
        parsed = JSON.parse(body);
      } catch {
        throw new AttemptError(`response is not JSON: ${excerpt(body)}`, false, status);
      }
      const rewards = (parsed as { rewards?: unknown } | null)?.rewards;
      if (!Array.isArray(rewards)) {
        throw new AttemptError(`response has no "rewards" array: ${excerpt(body)}`, false, status);
      }
      if (rewards.length !== samples.length) {
        throw new AttemptError(
          `response has ${rewards.length} rewards for ${samples.length} samples`,
          false,
          status,
        );
      }
      const bad = rewards.findIndex((r) => typeof r !== 'number' || !Number.isFinite(r));
      if (bad >= 0) {
        throw new AttemptError(
          `reward ${bad} is ${JSON.stringify(rewards[bad])}, not a finite number`,
          false,
          status,
        );
      }
      return rewards as number[];
    } finally {
      clearTimeout(timer);
    }
  }

  async function scoreBatch(samples: RewardModelSample[], label: string): Promise<number[]> {
    for (let n = 0; ; n++) {
      try {
        return await attempt(samples);
      } catch (err) {
        if (!(err instanceof AttemptError)) throw err;
        const attempts = n + 1;
        const last = !err.retryable || n >= options.maxRetries;
        if (last) {
          const nonRetryable =
            err.status !== undefined && err.status >= 400 && err.status <= 499 && !err.retryable;
          const tries = attempts === 1 ? '1 attempt' : `${attempts} attempts`;
          throw new RewardModelError(
            `reward model ${shownUrl}: ${label}: ${err.message} (${tries}` +
              `${nonRetryable ? '; the server rejected the request, not retried' : ''})`,
            { ...(err.status === undefined ? {} : { status: err.status }), attempts, nonRetryable },
          );
        }
        const cap = Math.min(maxBackoffMs, initialBackoffMs * 2 ** n);
        await sleep(cap / 2 + (Math.random() * cap) / 2, options.signal);
      }
    }
  }

  return {
    name: `http:${shownUrl}`,
    kind: options.kind ?? 'continuous',
    async score(batch) {
      const rewards: number[] = [];
      const batches = Math.ceil(batch.length / options.batchSize);
      for (let b = 0; b < batches; b++) {
        const slice = batch.slice(b * options.batchSize, (b + 1) * options.batchSize);
        const samples = slice.map((r) => ({
          prompt: r.prompt,
          completion: r.text,
          prompt_id: r.prompt_id,
          sample_index: r.sample_index,
          task: r.task,
          finish_reason: r.finish_reason,
        }));
        rewards.push(...(await scoreBatch(samples, `batch ${b + 1} of ${batches}`)));
      }
      return rewards;
    },
  };
}
