// The HTTP reward-model client against a real node:http server on 127.0.0.1: batching,
// per-request timeout, retries with backoff on 5xx / 429 / network errors, no retry on 4xx,
// responses that break the protocol (docs/rewards.md), and what its messages may quote.
import assert from 'node:assert/strict';
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, beforeEach, describe, it } from 'node:test';
import { badInputErrorType } from '../../activities/types.js';
import {
  BadInputError,
  RewardModelError,
  rewardModelProtocolErrorType,
  toApplicationFailure,
} from '../../activities/rewards/errors.js';
import { rewardFunction } from '../../activities/reward.js';
import { excerptChars } from '../../activities/http-client.js';
import {
  httpRewardModel,
  type HttpRewardModelOptions,
  type RewardModelSample,
} from '../../activities/rewards/reward-model.js';
import type { RolloutRecord } from '../../activities/rewards/rollout-record.js';
import { parseCampaignSpec } from '../../workflows/spec.js';

interface SeenRequest {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  samples: RewardModelSample[];
}

/** Answers request number `n` (0-based); the default scores prompt_id * 10 + sample_index. */
type Handler = (req: SeenRequest, res: ServerResponse, n: number) => void;

const reply = (res: ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(typeof body === 'string' ? body : JSON.stringify(body));
};
const scoreAll: Handler = (req, res) =>
  reply(res, 200, { rewards: req.samples.map((s) => s.prompt_id * 10 + s.sample_index) });

function record(promptId: number, sampleIndex: number): RolloutRecord {
  return {
    prompt_id: promptId,
    sample_index: sampleIndex,
    iteration: 2,
    task: 'reverse',
    prompt: `rev:ab${promptId}=`,
    prompt_tokens: [35, 30, 39, 14, 17, 18, 13],
    tokens: [18, 17, 1],
    text: `ba${sampleIndex}`,
    logprobs: [-0.1, -0.2, -0.3],
    finish_reason: 'stop',
  };
}

describe('httpRewardModel', () => {
  let server: Server;
  let base: string;
  let handler: Handler;
  let seen: SeenRequest[];

  before(async () => {
    server = createServer((req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (chunk: string) => (body += chunk));
      req.on('end', () => {
        const parsed = JSON.parse(body) as { samples: RewardModelSample[] };
        const request = {
          method: req.method ?? '',
          url: req.url ?? '',
          headers: req.headers,
          samples: parsed.samples,
        };
        seen.push(request);
        handler(request, res, seen.length - 1);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });
  beforeEach(() => {
    seen = [];
    handler = scoreAll;
  });

  const options = (extra: Partial<HttpRewardModelOptions> = {}): HttpRewardModelOptions => ({
    url: `${base}/score`,
    timeoutMs: 2000,
    maxRetries: 2,
    batchSize: 4,
    initialBackoffMs: 5,
    maxBackoffMs: 20,
    ...extra,
  });

  it('sends batches of at most batchSize and returns rewards in input order', async () => {
    const model = httpRewardModel(options({ batchSize: 2, headers: { authorization: 'Bearer t0ken' } }));
    const batch = [record(1, 0), record(1, 1), record(2, 0), record(2, 1), record(3, 0)];
    assert.deepEqual(await model.score(batch), [10, 11, 20, 21, 30]);
    assert.deepEqual(
      seen.map((r) => r.samples.length),
      [2, 2, 1],
    );
    const first = seen[0] as SeenRequest;
    assert.equal(first.method, 'POST');
    assert.equal(first.url, '/score');
    assert.equal(first.headers['content-type'], 'application/json');
    assert.equal(first.headers.authorization, 'Bearer t0ken');
    assert.deepEqual(first.samples[1], {
      prompt: 'rev:ab1=',
      completion: 'ba1',
      prompt_id: 1,
      sample_index: 1,
      task: 'reverse',
      finish_reason: 'stop',
    });
    assert.equal(model.kind, 'continuous');
    assert.equal(model.name, `http:${base}/score`);
  });

  it('sends nothing for an empty batch', async () => {
    assert.deepEqual(await httpRewardModel(options()).score([]), []);
    assert.equal(seen.length, 0);
  });

  it('times out a request that does not answer and retries it', async () => {
    const stalled: ServerResponse[] = [];
    handler = (req, res, n) => (n === 0 ? stalled.push(res) : scoreAll(req, res, n));
    const started = Date.now();
    const rewards = await httpRewardModel(options({ timeoutMs: 150 })).score([record(4, 0), record(4, 1)]);
    assert.deepEqual(rewards, [40, 41]);
    assert.equal(seen.length, 2);
    assert.ok(Date.now() - started >= 140, 'the first attempt waited for its timeout');
    for (const res of stalled) res.destroy();
  });

  it('gives up after maxRetries timeouts with a retryable error', async () => {
    const stalled: ServerResponse[] = [];
    handler = (_req, res) => stalled.push(res);
    await assert.rejects(
      httpRewardModel(options({ timeoutMs: 80, maxRetries: 1 })).score([record(1, 0)]),
      (err: unknown) => {
        assert.ok(err instanceof RewardModelError);
        assert.equal(err.nonRetryable, false);
        assert.equal(err.details.attempts, 2);
        assert.match(err.message, /batch 1 of 1: no response within 80 ms \(2 attempts\)/);
        return true;
      },
    );
    assert.equal(seen.length, 2);
    for (const res of stalled) res.destroy();
  });

  it('retries a 500 and succeeds', async () => {
    handler = (req, res, n) => (n === 0 ? reply(res, 500, 'overloaded') : scoreAll(req, res, n));
    assert.deepEqual(await httpRewardModel(options()).score([record(5, 0)]), [50]);
    assert.equal(seen.length, 2);
  });

  it('retries 503 and 429 with growing backoff, then fails retryably', async () => {
    handler = (_req, res, n) => reply(res, n % 2 === 0 ? 503 : 429, { error: 'busy' });
    const started = Date.now();
    const model = httpRewardModel(options({ maxRetries: 2, initialBackoffMs: 40, maxBackoffMs: 1000 }));
    await assert.rejects(model.score([record(1, 0)]), (err: unknown) => {
      assert.ok(err instanceof RewardModelError);
      assert.equal(err.type, 'RewardModelError');
      assert.equal(err.nonRetryable, false);
      assert.equal(err.details.status, 503);
      assert.equal(err.details.attempts, 3);
      assert.match(err.message, /HTTP 503: \{"error":"busy"\} \(3 attempts\)/);
      return true;
    });
    assert.equal(seen.length, 3);
    // Waits are at least half their cap: 20 ms, then 40 ms.
    assert.ok(Date.now() - started >= 55, `backoff too short: ${Date.now() - started} ms`);
  });

  it('does not retry a 400 and says why, as bad input', async () => {
    handler = (_req, res) => reply(res, 400, { error: 'sample 0: completion too long' });
    const model = httpRewardModel(
      options({ url: `${base}/score?token=s3cret`, headers: { authorization: 'Bearer s3cret' } }),
    );
    await assert.rejects(model.score([record(1, 0), record(1, 1)]), (err: unknown) => {
      assert.ok(err instanceof RewardModelError);
      assert.equal(err.type, badInputErrorType);
      assert.equal(err.nonRetryable, true);
      assert.equal(err.details.status, 400);
      assert.equal(err.details.attempts, 1);
      assert.match(err.message, /^reward model http:\/\/127\.0\.0\.1:\d+\/score: batch 1 of 1: HTTP 400: /);
      assert.match(err.message, /completion too long/);
      assert.match(err.message, /not retried/);
      assert.ok(!err.message.includes('s3cret'), 'credentials must not appear in messages');
      const failure = toApplicationFailure(err) as { type: string; nonRetryable: boolean };
      assert.equal(failure.type, badInputErrorType);
      assert.equal(failure.nonRetryable, true);
      return true;
    });
    assert.equal(seen.length, 1);
  });

  it('item 4: a 2xx with a malformed body is a non-retryable protocol failure, asked once', async () => {
    const cases: [unknown, RegExp][] = [
      [{ rewards: [1, null] }, /reward 1 is null, not a finite number/],
      [{ rewards: [1, '0.5'] }, /reward 1 is "0.5", not a finite number/],
      [{ rewards: [1] }, /batch 1 of 1: response has 1 rewards for 2 samples/],
      [{ scores: [1, 1] }, /response has no "rewards" array/],
      ['<html>oops</html>', /response is not JSON: <html>oops<\/html>/],
    ];
    for (const [body, pattern] of cases) {
      seen = [];
      handler = (_req, res) => reply(res, 200, body);
      await assert.rejects(httpRewardModel(options()).score([record(1, 0), record(1, 1)]), (err: unknown) => {
        assert.ok(err instanceof RewardModelError);
        assert.equal(err.nonRetryable, true);
        assert.equal(err.type, rewardModelProtocolErrorType);
        assert.equal(err.details.status, 200);
        assert.match(err.message, pattern);
        assert.match(err.message, /\(1 attempt; the server broke the reward-model protocol, not retried\)$/);
        const failure = toApplicationFailure(err) as { type: string; nonRetryable: boolean };
        assert.equal(failure.type, rewardModelProtocolErrorType);
        assert.equal(failure.nonRetryable, true, 'the activity must not retry it either');
        return true;
      });
      assert.equal(seen.length, 1, `${JSON.stringify(body)} was asked once`);
    }
  });

  it('item 10: a response over maxResponseBytes is cut off and fails clearly, declared or streamed', async () => {
    const big = JSON.stringify({ rewards: [1, 1], padding: 'x'.repeat(5000) });
    const streamed: Handler = (_req, res) => {
      // No content-length: chunked, so only counting the bytes read can notice.
      res.writeHead(200, { 'content-type': 'application/json' });
      for (let i = 0; i < big.length; i += 1000) res.write(big.slice(i, i + 1000));
      res.end();
    };
    const declared: Handler = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(big) });
      res.end(big);
    };
    for (const [how, h, pattern] of [
      ['streamed', streamed, /response body of more than 4096 bytes exceeds the limit of 4096 bytes/],
      ['declared', declared, new RegExp(`response body of ${big.length} bytes exceeds the limit of 4096`)],
    ] as const) {
      seen = [];
      handler = h;
      const model = httpRewardModel(options({ maxResponseBytes: 4096 }));
      await assert.rejects(model.score([record(1, 0), record(1, 1)]), (err: unknown) => {
        assert.ok(err instanceof RewardModelError, how);
        assert.equal(err.nonRetryable, true, how);
        assert.equal(err.type, rewardModelProtocolErrorType, how);
        assert.match(err.message, pattern, how);
        assert.match(err.message, /\(maxResponseBytes\)/, how);
        return true;
      });
      assert.equal(seen.length, 1, how);
    }
    handler = (req, res) => reply(res, 200, { rewards: req.samples.map(() => 1), padding: 'x'.repeat(4000) });
    assert.deepEqual(await httpRewardModel(options({ maxResponseBytes: 4096 })).score([record(1, 0)]), [1]);
  });

  it('item 10: a redirect is not followed; the error names the status and the Location', async () => {
    handler = (req, res, n) => {
      if (req.url !== '/score') return scoreAll(req, res, n);
      res.writeHead(307, { location: `${base}/elsewhere?token=s3cret` });
      res.end();
    };
    const model = httpRewardModel(options({ headers: { authorization: 'Bearer t0ken-abc' } }));
    await assert.rejects(model.score([record(1, 0)]), (err: unknown) => {
      assert.ok(err instanceof RewardModelError);
      assert.equal(err.nonRetryable, true);
      assert.equal(err.details.status, 307);
      assert.equal(err.details.attempts, 1);
      assert.match(err.message, new RegExp(`HTTP 307 redirect to ${base}/elsewhere not followed`));
      assert.ok(!err.message.includes('s3cret'), "the Location's query is not shown");
      return true;
    });
    assert.deepEqual(
      seen.map((r) => r.url),
      ['/score'],
      'the samples and the credential went nowhere else',
    );
  });

  it('item 10: quoted answers are short, one line, free of control characters and of the request headers', async () => {
    const secret = 't0ken-Zq81';
    handler = (req, res) =>
      reply(
        res,
        403,
        `denied\n\u001b[31mred\u001b[0m\r\u202eevil\u0000 you sent authorization: ${String(req.headers.authorization)}` +
          ` (key ${secret}) ${'y'.repeat(3000)}`,
      );
    const model = httpRewardModel(options({ headers: { authorization: `Bearer ${secret}` } }));
    await assert.rejects(model.score([record(1, 0)]), (err: unknown) => {
      assert.ok(err instanceof RewardModelError);
      const quoted = /HTTP 403: (.*) \(1 attempt;/.exec(err.message)?.[1] ?? '';
      assert.ok(quoted.startsWith('denied [31mred [0m evil you sent authorization: [redacted]'), quoted);
      assert.ok(!err.message.includes(secret), 'the secret is redacted, with or without its scheme');
      assert.ok(!/[\p{Cc}\p{Cf}]/u.test(err.message), 'no control or formatting characters');
      assert.ok(quoted.length <= excerptChars + 3, `quoted ${quoted.length} characters`);
      assert.ok(quoted.endsWith('...'));
      return true;
    });
  });

  it("item 10: the spec's auth header carries a secret from the worker environment, never the spec", async () => {
    const spec = parseCampaignSpec({
      name: 'auth',
      task: { builtin: 'reverse' },
      model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 },
      iterations: 1,
      promptsPerIteration: 2,
      groupSize: 2,
      rolloutShards: 1,
      chunkSize: 2,
      epWorldSize: 1,
      seed: 1,
      reward: {
        kind: 'http',
        url: `${base}/score`,
        auth: { header: 'authorization', scheme: 'Bearer', secretEnv: 'MOERL_REWARD_TOKEN' },
      },
    });
    assert.ok(!JSON.stringify(spec).includes('env-t0ken'));
    const reward = rewardFunction(spec, new AbortController().signal, {
      MOERL_REWARD_SECRET_ENVS: `MOERL_REWARD_TOKEN=${new URL(base).origin}`,
      MOERL_REWARD_TOKEN: 'env-t0ken',
    });
    assert.deepEqual(await reward.score([record(3, 1)]), [31]);
    assert.equal(seen[0]?.headers.authorization, 'Bearer env-t0ken');
    assert.throws(
      () =>
        rewardFunction(spec, new AbortController().signal, {
          MOERL_REWARD_SECRET_ENVS: `MOERL_REWARD_TOKEN=${new URL(base).origin}`,
        }),
      /reward model auth: environment variable MOERL_REWARD_TOKEN is not set on this worker/,
    );
  });

  it('retries network errors (nothing listening), then fails retryably', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    await assert.rejects(
      httpRewardModel(options({ url: `http://127.0.0.1:${port}/score`, maxRetries: 1 })).score([
        record(1, 0),
      ]),
      (err: unknown) => {
        assert.ok(err instanceof RewardModelError);
        assert.equal(err.nonRetryable, false);
        assert.equal(err.details.attempts, 2);
        assert.match(err.message, /request failed: .*ECONNREFUSED/);
        return true;
      },
    );
  });

  it('stops waiting when its signal aborts', async () => {
    handler = (_req, res) => reply(res, 500, 'down');
    const abort = new AbortController();
    const model = httpRewardModel(
      options({ initialBackoffMs: 10_000, maxBackoffMs: 10_000, signal: abort.signal }),
    );
    const started = Date.now();
    setTimeout(() => abort.abort(new Error('activity cancelled')), 50);
    await assert.rejects(model.score([record(1, 0)]), /activity cancelled/);
    assert.ok(Date.now() - started < 5000);
  });

  it('validates its options, naming the field', () => {
    assert.throws(() => httpRewardModel(options({ batchSize: 0 })), BadInputError);
    assert.throws(
      () => httpRewardModel(options({ batchSize: 0 })),
      /batchSize 0 is invalid; expected an integer >= 1/,
    );
    assert.throws(() => httpRewardModel(options({ timeoutMs: 1.5 })), /timeoutMs 1.5 is invalid/);
    assert.throws(() => httpRewardModel(options({ maxRetries: -1 })), /maxRetries -1 is invalid/);
    assert.throws(() => httpRewardModel(options({ maxResponseBytes: 0 })), /maxResponseBytes 0 is invalid/);
    assert.throws(() => httpRewardModel(options({ url: 'ftp://host/x' })), /url "ftp:\/\/host" is invalid/);
    assert.throws(() => httpRewardModel(options({ url: 'not a url' })), /url "not a url" is invalid/);
    assert.throws(
      () => httpRewardModel(options({ url: 'http://user:pw@127.0.0.1/score' })),
      (err: unknown) =>
        err instanceof BadInputError && /user info/.test(err.message) && !err.message.includes('pw'),
    );
  });
});
