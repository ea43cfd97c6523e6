// Item 10 of the long-campaign correctness work: the reward model's credential comes from the
// worker's environment or a file the spec names, never from the spec; the spec section that
// names it, and the response-size limit, are validated with the field named. Issue 34, item 4:
// the operator pairs each secret with the origins it may go to, and bounds the response a spec
// may ask a worker to hold.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { defaultWorkerMaxResponseBytes, rewardFunction } from '../../activities/reward.js';
import { rewardAuthHeaders } from '../../activities/rewards/auth.js';
import { BadInputError } from '../../activities/rewards/errors.js';
import { defaultMaxResponseBytes, httpRewardModel } from '../../activities/rewards/reward-model.js';
import { parseCampaignSpec, SpecError } from '../../workflows/spec.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-rewards-auth-'));
/** The reward model's url in these cases, and the origin the operator pairs the secrets with. */
const url = 'https://rm.example/score';
const rm = 'https://rm.example';
after(() => rmSync(dir, { recursive: true, force: true }));

const specWith = (reward: unknown) =>
  parseCampaignSpec({
    name: 'auth',
    task: { builtin: 'add' },
    model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 },
    iterations: 1,
    promptsPerIteration: 2,
    groupSize: 2,
    rolloutShards: 1,
    chunkSize: 2,
    epWorldSize: 1,
    seed: 1,
    reward,
  });

const problems = (reward: unknown): string => {
  try {
    specWith(reward);
  } catch (err) {
    if (err instanceof SpecError) return err.message;
    throw err;
  }
  assert.fail('the spec was accepted');
};

describe('item 10: reward model auth', () => {
  it('reads the secret from the named environment variable, with the scheme', () => {
    const auth = { header: 'authorization', scheme: 'Bearer', secretEnv: 'MOERL_REWARD_TOKEN' };
    const allow = { MOERL_REWARD_SECRET_ENVS: `MOERL_REWARD_TOKEN=${rm}, K=${rm}` };
    assert.deepEqual(rewardAuthHeaders(auth, url, { ...allow, MOERL_REWARD_TOKEN: 'tok-1' }), {
      authorization: 'Bearer tok-1',
    });
    assert.deepEqual(rewardAuthHeaders({ header: 'x-api-key', secretEnv: 'K' }, url, { ...allow, K: 'k2' }), {
      'x-api-key': 'k2',
    });
    assert.deepEqual(rewardAuthHeaders(undefined, url, {}), {});
  });

  it('reads the secret from the named file, without its trailing line break', () => {
    const file = join(dir, 'token');
    writeFileSync(file, 'file-t0ken\n');
    const auth = { header: 'authorization', scheme: 'Bearer', secretFile: file };
    assert.deepEqual(rewardAuthHeaders(auth, url, { MOERL_REWARD_SECRET_FILES: `${file}=${rm}` }), {
      authorization: 'Bearer file-t0ken',
    });
    assert.deepEqual(
      rewardAuthHeaders(auth, url, { MOERL_REWARD_SECRET_FILES: `/nonexistent/=${rm},${dir}/=${rm}` }),
      {
        authorization: 'Bearer file-t0ken',
      },
    );
  });

  it('fails as bad input naming the variable or file, never the secret', () => {
    const empty = join(dir, 'empty');
    writeFileSync(empty, '');
    const twoLines = join(dir, 'two-lines');
    writeFileSync(twoLines, 'line-one-s3cret\nline-two\n');
    const envs = { MOERL_REWARD_SECRET_ENVS: `RM_TOKEN=${rm},T=${rm}` };
    const files = { MOERL_REWARD_SECRET_FILES: `${dir}/=${rm}` };
    const cases: [Parameters<typeof rewardAuthHeaders>, RegExp][] = [
      [
        [{ header: 'authorization', secretEnv: 'RM_TOKEN' }, url, envs],
        /environment variable RM_TOKEN is not set/,
      ],
      [
        [{ header: 'authorization', secretEnv: 'RM_TOKEN' }, url, { ...envs, RM_TOKEN: '' }],
        /RM_TOKEN is not set/,
      ],
      [
        [{ header: 'authorization', secretFile: join(dir, 'missing') }, url, files],
        /cannot read secret file .*missing.*ENOENT/,
      ],
      [[{ header: 'authorization', secretFile: empty }, url, files], /secret file .*empty is empty/],
      [
        [{ header: 'authorization', secretFile: twoLines }, url, files],
        /holds a line break or another control character/,
      ],
      [
        [{ header: 'authorization', secretEnv: 'T' }, url, { ...envs, T: 'ab\r\nx-evil: 1' }],
        /T holds a line break/,
      ],
    ];
    for (const [args, pattern] of cases) {
      assert.throws(
        () => rewardAuthHeaders(...args),
        (err: unknown) => {
          assert.ok(err instanceof BadInputError);
          assert.equal(err.nonRetryable, true);
          assert.match(err.message, /^reward model auth: /);
          assert.match(err.message, pattern);
          assert.ok(!/s3cret|evil/.test(err.message), err.message);
          return true;
        },
      );
    }
  });

  it("a spec names only the variables and files the worker's operator allows (untrusted spec)", () => {
    // Before: any variable or readable file of the worker went to the URL the spec chose.
    const worker = {
      TEMPORAL_API_KEY: 'temporal-s3cret',
      RM_TOKEN: 'ok',
      MOERL_REWARD_SECRET_ENVS: `RM_TOKEN=${rm}`,
    };
    assert.throws(
      () => rewardAuthHeaders({ header: 'authorization', secretEnv: 'TEMPORAL_API_KEY' }, url, worker),
      (e: Error) =>
        e instanceof BadInputError &&
        /TEMPORAL_API_KEY is not one this worker allows \(MOERL_REWARD_SECRET_ENVS=RM_TOKEN=https:\/\/rm.example\)/.test(
          e.message,
        ) &&
        !e.message.includes('temporal-s3cret'),
    );
    assert.throws(
      () => rewardAuthHeaders({ header: 'a', secretEnv: 'RM_TOKEN' }, url, {}),
      /not one this worker allows/,
    );
    const secrets = join(dir, 'secrets');
    mkdirSync(secrets, { recursive: true });
    writeFileSync(join(secrets, 'rm'), 'rm-t0ken');
    const outside = join(dir, 'sa-token');
    writeFileSync(outside, 'service-account-s3cret');
    symlinkSync(outside, join(secrets, 'link'));
    const files = { MOERL_REWARD_SECRET_FILES: `${secrets}/=${rm}` };
    assert.deepEqual(rewardAuthHeaders({ header: 'a', secretFile: join(secrets, 'rm') }, url, files), {
      a: 'rm-t0ken',
    });
    for (const escape of [outside, join(secrets, '..', 'sa-token'), join(secrets, 'link'), '/etc/hostname'])
      assert.throws(
        () => rewardAuthHeaders({ header: 'a', secretFile: escape }, url, files),
        /is not one this worker allows \(MOERL_REWARD_SECRET_FILES=/,
        escape,
      );
  });

  it("an allowed secret goes only to the origins the operator paired it with, never to the spec's choice", () => {
    // Before: RM_TOKEN allowed meant RM_TOKEN sent to whatever url the spec named.
    const worker = {
      RM_TOKEN: 'rm-s3cret',
      MOERL_REWARD_SECRET_ENVS: `RM_TOKEN=${rm}, RM_TOKEN=https://rm-b.example:8443`,
    };
    const auth = { header: 'authorization', scheme: 'Bearer', secretEnv: 'RM_TOKEN' };
    for (const to of [url, 'https://rm.example:443/other', 'https://rm-b.example:8443/v2/score'])
      assert.deepEqual(rewardAuthHeaders(auth, to, worker), { authorization: 'Bearer rm-s3cret' }, to);
    for (const to of [
      'https://attacker.example/score',
      'http://rm.example/score',
      'https://rm.example:8443/score',
      'https://rm-b.example/score',
      'https://rm.example.attacker.example/score',
    ])
      assert.throws(
        () => rewardAuthHeaders(auth, to, worker),
        (e: Error) =>
          e instanceof BadInputError &&
          e.message.includes(
            `environment variable RM_TOKEN may go to ${rm}, https://rm-b.example:8443 only (MOERL_REWARD_SECRET_ENVS), not to ${new URL(to).origin}`,
          ) &&
          !e.message.includes('rm-s3cret'),
        to,
      );
    const secrets = join(dir, 'paired');
    mkdirSync(secrets, { recursive: true });
    writeFileSync(join(secrets, 'rm'), 'file-s3cret');
    const files = { MOERL_REWARD_SECRET_FILES: `${secrets}/=${rm}` };
    const fileAuth = { header: 'a', secretFile: join(secrets, 'rm') };
    assert.deepEqual(rewardAuthHeaders(fileAuth, url, files), { a: 'file-s3cret' });
    assert.throws(
      () => rewardAuthHeaders(fileAuth, 'https://attacker.example/x', files),
      /secret file .*paired\/rm may go to https:\/\/rm.example only \(MOERL_REWARD_SECRET_FILES\), not to https:\/\/attacker.example/,
    );
    // The operator's entries: each pairs a secret with a bare http(s) origin, or is named.
    for (const [setting, pattern] of [
      ['RM_TOKEN', /entry "RM_TOKEN" names no origin/],
      ['RM_TOKEN=rm.example', /entry "RM_TOKEN=rm.example" has "rm.example", not an origin/],
      ['RM_TOKEN=https://rm.example/score', /has "https:\/\/rm.example\/score", not an http\(s\) origin/],
      ['RM_TOKEN=ftp://rm.example', /not an http\(s\) origin/],
      ['RM_TOKEN=https://u:p@rm.example', /not an http\(s\) origin/],
    ] as const)
      assert.throws(
        () => rewardAuthHeaders(auth, url, { RM_TOKEN: 'x', MOERL_REWARD_SECRET_ENVS: setting }),
        (e: Error) =>
          e instanceof BadInputError &&
          pattern.test(e.message) &&
          e.message.includes('pairs each secret with the origin it may go to'),
        setting,
      );
  });

  it("a spec's maxResponseBytes past what the worker reads is bad input naming the worker's setting", () => {
    // Before: a spec could make each worker hold a 1 GiB response (1.1 GiB RSS for one request).
    const gib = specWith({ kind: 'http', url, maxResponseBytes: 1024 ** 3 });
    const signal = new AbortController().signal;
    assert.throws(
      () => rewardFunction(gib, signal, {}),
      (e: Error) =>
        e instanceof BadInputError &&
        e.message ===
          `reward.maxResponseBytes ${1024 ** 3} is more than this worker reads from a reward model (${defaultWorkerMaxResponseBytes} bytes, MOERL_REWARD_MAX_RESPONSE_BYTES, the worker operator's setting); lower it in the spec, or raise the setting`,
    );
    assert.doesNotThrow(() =>
      rewardFunction(gib, signal, { MOERL_REWARD_MAX_RESPONSE_BYTES: String(1024 ** 3) }),
    );
    assert.doesNotThrow(() => rewardFunction(specWith({ kind: 'http', url }), signal, {}));
    assert.throws(
      () => rewardFunction(gib, signal, { MOERL_REWARD_MAX_RESPONSE_BYTES: '1GiB' }),
      /^Error: MOERL_REWARD_MAX_RESPONSE_BYTES="1GiB" is not a positive whole number of bytes$/,
    );
  });

  it('sends rollouts and credentials over https only, http only to a loopback address', () => {
    const options = { timeoutMs: 1000, maxRetries: 0, batchSize: 1 };
    assert.throws(
      () => httpRewardModel({ ...options, url: 'http://rm.example.com/score' }),
      /url "http:\/\/rm.example.com" is invalid; expected https:\/\/ \(http:\/\/ only to a loopback address\)/,
    );
    for (const url of [
      'https://rm.example.com/score',
      'http://127.0.0.1:9/score',
      'http://localhost:9/s',
      'http://[::1]:9/s',
    ])
      assert.doesNotThrow(() => httpRewardModel({ ...options, url }), url);
  });

  it('the spec names the variable or the file, exactly one, and has no place for the secret', () => {
    const http = { kind: 'http', url: 'https://rm.example/score' };
    const spec = specWith({ ...http, auth: { header: 'authorization', scheme: 'Bearer', secretEnv: 'RM' } });
    assert.equal(spec.reward.kind, 'http');
    if (spec.reward.kind === 'http') {
      assert.deepEqual(spec.reward.auth, { header: 'authorization', scheme: 'Bearer', secretEnv: 'RM' });
      assert.equal(spec.reward.maxResponseBytes, defaultMaxResponseBytes);
    }
    const exactlyOne = /reward\.auth: .*needs exactly one of secretEnv and secretFile/;
    assert.match(problems({ ...http, auth: { header: 'authorization' } }), exactlyOne);
    assert.match(
      problems({ ...http, auth: { header: 'a', secretEnv: 'A', secretFile: '/run/a' } }),
      exactlyOne,
    );
    assert.match(
      problems({ ...http, auth: { header: 'authorization', secret: 'tok', secretEnv: 'A' } }),
      /reward\.auth: unknown field\(s\) "secret"/,
    );
    assert.match(
      problems({ ...http, auth: { header: 'bad header:', secretEnv: 'A' } }),
      /reward\.auth\.header: .*must be an HTTP header name/,
    );
    assert.match(
      problems({ ...http, auth: { header: 'Content-Type', secretEnv: 'A' } }),
      /reward\.auth\.header: .*is a header the client sets itself/,
    );
    assert.match(
      problems({ ...http, auth: { header: 'authorization', scheme: 'Bearer x', secretEnv: 'A' } }),
      /reward\.auth\.scheme: .*must be one word/,
    );
    assert.match(
      problems({ ...http, auth: { header: 'authorization', secretEnv: 'MY-TOKEN' } }),
      /reward\.auth\.secretEnv: .*must be an environment variable name/,
    );
    assert.match(problems({ ...http, maxResponseBytes: 0 }), /reward\.maxResponseBytes: got 0/);
  });
});
