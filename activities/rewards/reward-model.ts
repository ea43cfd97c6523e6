// Pluggable rewards: a RewardFunction scores a batch of rollout records. Two kinds ship:
// the exact-match verifiers of the built-in tasks, and a client of an HTTP reward model
// (protocol in docs/rewards.md) with batching, a per-request timeout, and retries with
// exponential backoff and jitter for failures that may pass (5xx, 408, 429, network, timeout).
// Its error messages end up in workflow history, so what they quote of the server's answer is
// short, one line, free of control characters and of the configured header values.
import { AttemptError, excerpt, readBody, sleep, type HttpFailureKind } from '../http-client.js';
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
  /** Endpoint that takes POST requests (http or https). Redirects are not followed. */
  url: string;
  /** Limit per request, from sending to the last byte of the response. */
  timeoutMs: number;
  /** Extra attempts after the first for retryable failures (0 = try once). */
  maxRetries: number;
  /** Samples per request at most. */
  batchSize: number;
  /** Sent with every request (e.g. authorization); never logged, and redacted from quoted answers. */
  headers?: Record<string, string>;
  /** Largest response body read, in bytes (after decompression); default 16 MiB. */
  maxResponseBytes?: number;
  /** How to read the model's rewards for the pass rate; default "continuous". */
  kind?: RewardKind;
  /** Backoff before retry n (1-based) is uniform in [d/2, d], d = min(max, initial * 2^(n-1)). */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** Aborts the current request and any wait (e.g. the activity's cancellation signal). */
  signal?: AbortSignal;
}

export const defaultMaxResponseBytes = 16 * 1024 * 1024;

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
  // Rollouts and any credential travel encrypted, unless the server is on this machine.
  const loopback = ['localhost', '[::1]'].includes(url.hostname) || /^127\.\d+\.\d+\.\d+$/.test(url.hostname);
  if (url.protocol === 'http:' && !loopback) {
    throw bad(
      'url',
      `${url.protocol}//${url.host}`,
      'expected https:// (http:// only to a loopback address)',
    );
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
  positiveInt('maxResponseBytes', o.maxResponseBytes ?? 1, 1);
  positiveInt('initialBackoffMs', o.initialBackoffMs ?? 0, 0);
  positiveInt('maxBackoffMs', o.maxBackoffMs ?? 0, 0);
  return url;
}

/**
 * The header values to redact from quoted answers: each value, and its credential without the
 * scheme ("Bearer t0ken" → also "t0ken"). Short values are left alone: redacting "1" would
 * mangle every number.
 */
function secretsOf(headers: Record<string, string>): string[] {
  const values = Object.values(headers).flatMap((v) => [v, v.replace(/^\S+\s+/, '')]);
  return [...new Set(values.map((v) => v.trim()))].filter((v) => v.length >= 4);
}

/** Bytes of an error answer read for its excerpt. */
const errorBodyBytes = 4096;

/**
 * A client of an HTTP reward model: POST `{ samples: [...] }` → `{ rewards: [...] }`, at most
 * `batchSize` samples a request, requests one after another.
 */
export function httpRewardModel(options: HttpRewardModelOptions): RewardFunction {
  const url = checkOptions(options);
  // Credentials may sit in the URL's query; messages show origin and path only.
  const shownUrl = `${url.origin}${url.pathname}`;
  const initialBackoffMs = options.initialBackoffMs ?? 200;
  const maxBackoffMs = options.maxBackoffMs ?? 5000;
  const maxResponseBytes = options.maxResponseBytes ?? defaultMaxResponseBytes;
  const headers = { 'content-type': 'application/json', accept: 'application/json', ...options.headers };
  const secrets = secretsOf(options.headers ?? {});
  const quote = (text: string) => excerpt(text, secrets);

  /** Where a redirect pointed, as origin and path (a query may carry a token). */
  function redirectTarget(location: string | null): string {
    if (location === null) return 'without a Location header';
    try {
      const target = new URL(location, url);
      return `to ${quote(`${target.origin}${target.pathname}`)}`;
    } catch {
      return `to an invalid Location ${JSON.stringify(quote(location))}`;
    }
  }

  /** Sends one request; the body of a 2xx answer, or an AttemptError for any other answer. */
  async function request(
    samples: RewardModelSample[],
    signal: AbortSignal,
  ): Promise<{ status: number; body: string }> {
    const response = await fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify({ samples }),
      signal,
      // A redirect would send the samples and the credentials to wherever the server says.
      redirect: 'manual',
    });
    const status = response.status;
    if (status >= 300 && status <= 399) {
      await response.body?.cancel();
      throw new AttemptError(
        `HTTP ${status} redirect ${redirectTarget(response.headers.get('location'))} not followed; ` +
          'set url to the endpoint itself',
        'protocol',
        status,
      );
    }
    if (status < 200 || status > 299) {
      const body = await readBody(response, errorBodyBytes, 'truncate');
      const retryable = status >= 500 || status === 408 || status === 429;
      throw new AttemptError(
        `HTTP ${status}: ${quote(body) || quote(response.statusText)}`,
        retryable ? 'unavailable' : 'rejected',
        status,
      );
    }
    return { status, body: await readBody(response, maxResponseBytes, 'fail') };
  }

  async function attempt(samples: RewardModelSample[]): Promise<number[]> {
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), options.timeoutMs);
    const signal = options.signal ? AbortSignal.any([timeout.signal, options.signal]) : timeout.signal;
    let answer: { status: number; body: string };
    try {
      answer = await request(samples, signal);
    } catch (err) {
      if (err instanceof AttemptError || options.signal?.aborted) throw err;
      if (timeout.signal.aborted)
        throw new AttemptError(`no response within ${options.timeoutMs} ms`, 'unavailable');
      const cause = (err as Error).cause as Error | undefined;
      throw new AttemptError(
        `request failed: ${quote(cause?.message ?? (err as Error).message)}`,
        'unavailable',
      );
    } finally {
      clearTimeout(timer);
    }
    // A 2xx answer that breaks the protocol is a server bug: asking again would not fix it.
    const { status, body } = answer;
    const broken = (message: string) => new AttemptError(message, 'protocol', status);
    let parsed: unknown;
    try {
      parsed = JSON.parse(body);
    } catch {
      throw broken(`response is not JSON: ${quote(body)}`);
    }
    const rewards = (parsed as { rewards?: unknown } | null)?.rewards;
    if (!Array.isArray(rewards)) throw broken(`response has no "rewards" array: ${quote(body)}`);
    if (rewards.length !== samples.length)
      throw broken(`response has ${rewards.length} rewards for ${samples.length} samples`);
    const bad = rewards.findIndex((r) => typeof r !== 'number' || !Number.isFinite(r));
    if (bad >= 0)
      throw broken(
        `reward ${bad} is ${quote(JSON.stringify(rewards[bad]) ?? 'undefined')}, not a finite number`,
      );
    return rewards as number[];
  }

  const notRetried: Record<HttpFailureKind, string> = {
    unavailable: '',
    rejected: '; the server rejected the request, not retried',
    protocol: '; the server broke the reward-model protocol, not retried',
  };

  async function scoreBatch(samples: RewardModelSample[], label: string): Promise<number[]> {
    for (let n = 0; ; n++) {
      try {
        return await attempt(samples);
      } catch (err) {
        if (!(err instanceof AttemptError)) throw err;
        const attempts = n + 1;
        if (err.kind !== 'unavailable' || n >= options.maxRetries) {
          const tries = attempts === 1 ? '1 attempt' : `${attempts} attempts`;
          throw new RewardModelError(
            `reward model ${shownUrl}: ${label}: ${err.message} (${tries}${notRetried[err.kind]})`,
            {
              ...(err.status === undefined ? {} : { status: err.status }),
              attempts,
              nonRetryable: err.kind !== 'unavailable',
              protocol: err.kind === 'protocol',
            },
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
