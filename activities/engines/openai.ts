// A rollout engine behind an OpenAI-compatible completions endpoint: llama.cpp's llama-server
// (tested here), vLLM and SGLang on GPUs. POST /v1/completions with the prompt as token ids, a
// per-request seed and the log-probs of the sampled tokens; GET /health for readiness. Bounded
// answers, a timeout per request, retries with backoff and jitter for what may pass (connection
// refused while a server restarts, 5xx, 408, 429, timeouts), and typed errors (errors.ts) for
// the rest. The HTTP contract is in docs/engines.md#rollout-engines.
import { AttemptError, excerpt, readBody, sleep } from '../http-client.js';
import { EngineError } from './errors.js';
import type { EngineFailureKind } from './errors.js';
import type { Completion, CompletionRequest, FinishReason, RolloutEngine } from './types.js';

export interface OpenAiEngineOptions {
  /** The server's base URL, e.g. http://127.0.0.1:8080 (paths /v1/completions and /health are added). */
  baseUrl: string;
  /** The served model's name: vLLM and SGLang check it, llama.cpp ignores it. */
  model?: string;
  /** Limit per request, from sending to the last byte of the answer. */
  timeoutMs: number;
  /** Extra attempts after the first for failures that may pass (0 = try once). */
  maxRetries: number;
  /** Largest answer read, in bytes; default 16 MiB (a 32k-token completion with log-probs is ~5 MiB). */
  maxResponseBytes?: number;
  /** Backoff before retry n (1-based) is uniform in [d/2, d], d = min(max, initial * 2^(n-1)). */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** Sent with every request (a vLLM --api-key's authorization); never shown in messages. */
  headers?: Record<string, string>;
  /** Sent with every completion request after the standard fields (an engine's own sampling knobs). */
  extraBody?: Record<string, unknown>;
}

export const defaultMaxResponseBytes = 16 * 1024 * 1024;

/** Bytes of an error answer read for its excerpt. */
const errorBodyBytes = 4096;

/** A log-prob at or below this is llama.cpp's stand-in for log(0) (-FLT_MAX): not a probability. */
const zeroProbability = -1e30;

function checkRequest(r: CompletionRequest): void {
  const bad = (field: string, value: unknown, allowed: string) =>
    new EngineError(
      `completion request: ${field} ${JSON.stringify(value)} is invalid; ${allowed}`,
      'rejected',
    );
  const isTokenId = (t: number) => Number.isSafeInteger(t) && t >= 0;
  if (r.promptTokens.length === 0 || !r.promptTokens.every(isTokenId))
    throw bad('promptTokens', r.promptTokens.slice(0, 8), 'expected a non-empty list of token ids');
  if (!Number.isSafeInteger(r.maxTokens) || r.maxTokens < 1)
    throw bad('maxTokens', r.maxTokens, 'expected an integer >= 1');
  if (!Number.isFinite(r.temperature) || r.temperature < 0)
    throw bad('temperature', r.temperature, 'expected a number >= 0');
  if (!(r.topP > 0 && r.topP <= 1)) throw bad('topP', r.topP, 'expected a number in (0, 1]');
  if (!Number.isSafeInteger(r.seed) || r.seed < 0 || r.seed > 0x7fffffff)
    throw bad('seed', r.seed, 'expected an integer in [0, 2^31 - 1]');
  if (r.stopTokenIds && !r.stopTokenIds.every(isTokenId))
    throw bad('stopTokenIds', r.stopTokenIds, 'expected token ids');
}

/**
 * The sampled tokens and their log-probs from a completion's choice, in either form a server
 * writes them: llama.cpp's `logprobs.content: [{ id, logprob }]`, or the OpenAI completions form
 * `logprobs: { tokens, token_logprobs }` with tokens written as "token_id:<id>" (vLLM's
 * return_tokens_as_token_ids).
 */
function sampled(logprobs: unknown): { tokens: number[]; logprobs: number[] } | string {
  if (logprobs === null || typeof logprobs !== 'object')
    return 'has no log-probs ("logprobs" is missing or null)';
  const lp = logprobs as { content?: unknown; tokens?: unknown; token_logprobs?: unknown };
  let tokens: unknown[];
  let values: unknown[];
  if (Array.isArray(lp.content)) {
    tokens = lp.content.map((e) => (e as { id?: unknown } | null)?.id);
    values = lp.content.map((e) => (e as { logprob?: unknown } | null)?.logprob);
  } else if (Array.isArray(lp.tokens) && Array.isArray(lp.token_logprobs)) {
    tokens = lp.tokens.map((t) =>
      typeof t === 'string' && /^token_id:\d+$/.test(t) ? Number(t.slice('token_id:'.length)) : t,
    );
    values = lp.token_logprobs;
  } else {
    return 'has log-probs in neither known form (logprobs.content[].{id,logprob} or logprobs.{tokens,token_logprobs})';
  }
  if (tokens.length !== values.length) return `has ${tokens.length} tokens but ${values.length} log-probs`;
  const badToken = tokens.findIndex((t) => typeof t !== 'number' || !Number.isSafeInteger(t) || t < 0);
  if (badToken >= 0)
    return `token ${badToken} is ${JSON.stringify(tokens[badToken]) ?? 'undefined'}, not a token id`;
  const badValue = values.findIndex(
    (v) => typeof v !== 'number' || !Number.isFinite(v) || v > 1e-6 || v <= zeroProbability,
  );
  if (badValue >= 0)
    return `log-prob ${badValue} is ${JSON.stringify(values[badValue]) ?? 'undefined'}, not the log of a probability`;
  return { tokens: tokens as number[], logprobs: values as number[] };
}

/** A client of an OpenAI-compatible completions server as a RolloutEngine. */
export function openAiEngine(options: OpenAiEngineOptions): RolloutEngine {
  let base: URL;
  try {
    base = new URL(options.baseUrl);
  } catch {
    throw new EngineError(
      `openAiEngine: baseUrl ${JSON.stringify(options.baseUrl)} is not a URL`,
      'rejected',
    );
  }
  if ((base.protocol !== 'http:' && base.protocol !== 'https:') || base.username || base.password)
    throw new EngineError(
      `openAiEngine: baseUrl must be http:// or https:// without user info (credentials go in headers)`,
      'rejected',
    );
  const at = (path: string) => new URL(path, base.href.endsWith('/') ? base : `${base.href}/`);
  const completions = at('v1/completions');
  const health = at('health');
  const endpoint = `${completions.origin}${completions.pathname}`;
  const maxResponseBytes = options.maxResponseBytes ?? defaultMaxResponseBytes;
  const initialBackoffMs = options.initialBackoffMs ?? 200;
  const maxBackoffMs = options.maxBackoffMs ?? 5000;
  const headers = { 'content-type': 'application/json', accept: 'application/json', ...options.headers };
  const secrets = Object.values(options.headers ?? {}).flatMap((v) => [v, v.replace(/^\S+\s+/, '')]);
  const quote = (text: string) =>
    excerpt(
      text,
      secrets.filter((s) => s.trim().length >= 4),
    );

  /** One POST; the body of a 2xx answer, or an AttemptError. */
  async function post(body: string, signal: AbortSignal): Promise<{ status: number; text: string }> {
    const response = await fetch(completions, { method: 'POST', headers, body, signal, redirect: 'manual' });
    const status = response.status;
    if (status >= 300 && status <= 399) {
      await response.body?.cancel();
      throw new AttemptError(
        `HTTP ${status} redirect not followed; set baseUrl to the server itself`,
        'protocol',
        status,
      );
    }
    if (status < 200 || status > 299) {
      const text = await readBody(response, errorBodyBytes, 'truncate');
      const retryable = status >= 500 || status === 408 || status === 429;
      throw new AttemptError(
        `HTTP ${status}: ${quote(text) || quote(response.statusText)}`,
        retryable ? 'unavailable' : 'rejected',
        status,
      );
    }
    return { status, text: await readBody(response, maxResponseBytes, 'fail') };
  }

  async function attempt(
    request: CompletionRequest,
    body: string,
    signal?: AbortSignal,
  ): Promise<Completion> {
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), options.timeoutMs);
    const both = signal ? AbortSignal.any([timeout.signal, signal]) : timeout.signal;
    let answer: { status: number; text: string };
    try {
      answer = await post(body, both);
    } catch (err) {
      if (err instanceof AttemptError || signal?.aborted) throw err;
      if (timeout.signal.aborted)
        throw new AttemptError(`no answer within ${options.timeoutMs} ms`, 'unavailable');
      const cause = (err as Error).cause as Error | undefined;
      throw new AttemptError(
        `request failed: ${quote(cause?.message ?? (err as Error).message)}`,
        'unavailable',
      );
    } finally {
      clearTimeout(timer);
    }
    const broken = (message: string) => new AttemptError(message, 'protocol', answer.status);
    let parsed: unknown;
    try {
      parsed = JSON.parse(answer.text);
    } catch {
      throw broken(`answer is not JSON: ${quote(answer.text)}`);
    }
    const choices = (parsed as { choices?: unknown } | null)?.choices;
    if (!Array.isArray(choices) || choices.length === 0)
      throw broken(`answer has no "choices": ${quote(answer.text)}`);
    const choice = choices[0] as { logprobs?: unknown; finish_reason?: unknown } | null;
    const counted = (parsed as { usage?: { completion_tokens?: unknown } }).usage?.completion_tokens;
    const finish = choice?.finish_reason;
    if (finish !== 'stop' && finish !== 'length')
      throw broken(`finish_reason is ${JSON.stringify(finish) ?? 'missing'}, expected "stop" or "length"`);
    const got = sampled(choice?.logprobs);
    if (typeof got === 'string') throw broken(`the completion ${got}`);
    // An unpatched llama-server leaves out the entry of a token that ends inside a UTF-8
    // character (scripts/llamacpp.sh patches it): the usage count says so.
    if (typeof counted === 'number' && counted !== got.tokens.length)
      throw broken(
        `the completion has log-probs for ${got.tokens.length} tokens but usage counts ${counted} ` +
          '(an unpatched llama-server drops tokens that end inside a UTF-8 character: scripts/llamacpp.sh)',
      );
    if (got.tokens.length > request.maxTokens)
      throw broken(
        `the completion has ${got.tokens.length} tokens, more than max_tokens ${request.maxTokens}`,
      );
    if (got.tokens.length === 0 && finish === 'length')
      throw broken('the completion has no tokens but finish_reason "length"');
    return { tokens: got.tokens, logprobs: got.logprobs, finishReason: finish as FinishReason };
  }

  const notRetried: Record<EngineFailureKind, string> = {
    unavailable: '',
    rejected: '; the server rejected the request, not retried',
    protocol: '; the server broke the rollout engine contract, not retried',
  };

  return {
    kind: 'openai',
    endpoint,
    async complete(request, signal) {
      checkRequest(request);
      const body = JSON.stringify({
        ...(options.model === undefined ? {} : { model: options.model }),
        prompt: request.promptTokens,
        max_tokens: request.maxTokens,
        temperature: request.temperature,
        top_p: request.topP,
        seed: request.seed,
        // One is the fewest a server returns the sampled token's log-prob with (llama.cpp's
        // n_probs 0 returns none).
        logprobs: 1,
        stream: false,
        return_tokens_as_token_ids: true,
        ...(request.ignoreEos ? { ignore_eos: true } : {}),
        ...(request.stopTokenIds ? { stop_token_ids: request.stopTokenIds } : {}),
        ...options.extraBody,
      });
      for (let n = 0; ; n++) {
        try {
          return await attempt(request, body, signal);
        } catch (err) {
          if (!(err instanceof AttemptError)) throw err;
          const attempts = n + 1;
          if (err.kind !== 'unavailable' || n >= options.maxRetries) {
            const tries = attempts === 1 ? '1 attempt' : `${attempts} attempts`;
            throw new EngineError(
              `rollout engine ${endpoint}: ${err.message} (${tries}${notRetried[err.kind]})`,
              err.kind,
              {
                ...(err.status === undefined ? {} : { status: err.status }),
                attempts,
              },
            );
          }
          const cap = Math.min(maxBackoffMs, initialBackoffMs * 2 ** n);
          await sleep(cap / 2 + (Math.random() * cap) / 2, signal);
        }
      }
    },
    async isReady(signal) {
      const timeout = AbortSignal.timeout(Math.min(options.timeoutMs, 5000));
      try {
        const response = await fetch(health, {
          headers,
          redirect: 'manual',
          signal: signal ? AbortSignal.any([timeout, signal]) : timeout,
        });
        await response.body?.cancel();
        return response.status === 200;
      } catch (err) {
        if (signal?.aborted) throw err;
        return false;
      }
    },
  };
}

/** Resolves once `engine` is ready; an `unavailable` EngineError after `timeoutMs`. */
export async function waitReady(
  engine: RolloutEngine,
  timeoutMs: number,
  signal?: AbortSignal,
  intervalMs = 100,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await engine.isReady(signal))) {
    if (Date.now() >= deadline)
      throw new EngineError(
        `rollout engine ${engine.endpoint}: not ready within ${timeoutMs} ms`,
        'unavailable',
      );
    await sleep(intervalMs, signal);
  }
}
