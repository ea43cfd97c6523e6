// The metrics wrapper around a worker's activities, with fake activities in Temporal's mock
// activity environment: outcomes, retries, failure reasons, rank failures and the bound on
// per-campaign gauges. The real activities and a real worker are in
// test/integration/worker-metrics.test.ts.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ApplicationFailure, CancelledFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import type { CampaignActivities, CheckpointInput } from '../../activities/types.js';
import { parseWorkerArgs } from '../../workers/main.js';
import { createWorkerMetrics, parsePort, serveMetrics } from '../../workers/metrics.js';

/** Fake activities: each fails with `failure` when it is set, else returns a fixed output. */
function fakeActivities(failure: { current: unknown }): CampaignActivities {
  const maybeFail = () => {
    if (failure.current !== undefined) throw failure.current;
  };
  return {
    preparePolicy: async () => (maybeFail(), { attempt: 1 }) as never,
    rolloutShard: async () => (
      maybeFail(),
      { attempt: 1, shard: 0, chunks: 2, samples: 4, tokens: 30, tokensPerSecond: 1, chunksRedone: 1 }
    ),
    computeRewards: async () => (maybeFail(), {}) as never,
    updatePolicy: async () =>
      (maybeFail(), { attempt: 1, metrics: { ep_seconds: 0.5, ep_bytes: 1024 } }) as never,
    commitCheckpoint: async () => (maybeFail(), {}) as never,
  };
}

const commitInput = (campaignId: string, iteration: number) =>
  ({
    campaignId,
    meanReward: 0.25,
    staged: { manifest: { files: [{ bytes: 100 }, { bytes: 23 }] }, iteration },
  }) as unknown as CheckpointInput;

async function value(
  m: ReturnType<typeof createWorkerMetrics>,
  name: string,
  labels: Record<string, string> = {},
) {
  const metric = await m.registry.getSingleMetric(name)!.get();
  return metric.values
    .filter((v) => Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want))
    .reduce((s, v) => s + v.value, 0);
}

describe('worker metrics wrapper (fake activities)', () => {
  test('counts attempts, retries, outcomes and failure reasons; rollout and update figures from outputs', async () => {
    const m = createWorkerMetrics();
    const failure: { current: unknown } = { current: undefined };
    const a = m.instrument(fakeActivities(failure));
    await new MockActivityEnvironment({ attempt: 1 }).run(a.rolloutShard, {} as never);
    await new MockActivityEnvironment({ attempt: 1 }).run(a.updatePolicy, {} as never);

    failure.current = ApplicationFailure.create({
      type: 'TrainerRankFailed',
      message: 'update: rank 1 of 2 exited with code 3 (job j)',
    });
    await assert.rejects(new MockActivityEnvironment({ attempt: 2 }).run(a.updatePolicy, {} as never));
    failure.current = ApplicationFailure.create({ type: 'SomethingNew', message: 'x' });
    await assert.rejects(new MockActivityEnvironment({ attempt: 3 }).run(a.updatePolicy, {} as never));
    failure.current = new CancelledFailure('cancelled');
    await assert.rejects(new MockActivityEnvironment({ attempt: 1 }).run(a.rolloutShard, {} as never));

    assert.equal(
      await value(m, 'moerl_activity_attempts_total', { activity: 'updatePolicy', retry: 'false' }),
      1,
    );
    assert.equal(
      await value(m, 'moerl_activity_attempts_total', { activity: 'updatePolicy', retry: 'true' }),
      2,
    );
    assert.equal(
      await value(m, 'moerl_activity_failures_total', {
        activity: 'updatePolicy',
        reason: 'TrainerRankFailed',
      }),
      1,
    );
    assert.equal(
      await value(m, 'moerl_activity_failures_total', { activity: 'updatePolicy', reason: 'other' }),
      1,
    );
    assert.equal(await value(m, 'moerl_train_job_rank_failures_total'), 1);
    const count = (activity: string, outcome: string) =>
      value(m, 'moerl_activity_duration_seconds', { activity, outcome, le: '+Inf' });
    assert.equal(await count('updatePolicy', 'ok'), 1);
    assert.equal(await count('updatePolicy', 'failed'), 2);
    assert.equal(await count('rolloutShard', 'cancelled'), 1);
    assert.equal(await value(m, 'moerl_rollout_tokens_total'), 30);
    assert.equal(await value(m, 'moerl_rollout_samples_total'), 4);
    assert.equal(await value(m, 'moerl_rollout_chunks_redone_total'), 1);
    assert.equal(await value(m, 'moerl_update_ep_seconds'), 0.5);
    assert.equal(await value(m, 'moerl_update_ep_bytes'), 1024);
  });

  test('checkpoint bytes add up; per-campaign gauges keep at most 64 campaigns, the latest ones', async () => {
    const m = createWorkerMetrics();
    const a = m.instrument(fakeActivities({ current: undefined }));
    for (let c = 0; c < 70; c++)
      await new MockActivityEnvironment().run(a.commitCheckpoint, commitInput(`c${c}`, c + 1));
    assert.equal(await value(m, 'moerl_checkpoint_commit_bytes_total'), 70 * 123);
    const iterations = (await m.registry.getSingleMetric('moerl_campaign_iteration')!.get()).values;
    assert.equal(iterations.length, 64);
    assert.ok(!iterations.some((v) => v.labels.campaign === 'c0'), 'the oldest campaign is dropped');
    assert.equal(await value(m, 'moerl_campaign_iteration', { campaign: 'c69' }), 70);
    assert.equal(await value(m, 'moerl_campaign_mean_reward', { campaign: 'c69' }), 0.25);
  });

  test('serves /metrics on 127.0.0.1 and answers 404 elsewhere; ports are checked', async () => {
    const m = createWorkerMetrics();
    const server = await serveMetrics(m.registry, 0, '127.0.0.1');
    try {
      const res = await fetch(server.url);
      assert.equal(res.status, 200);
      assert.match(await res.text(), /# TYPE moerl_activity_attempts_total counter/);
      assert.equal((await fetch(server.url.replace('/metrics', '/other'))).status, 404);
    } finally {
      await server.close();
    }
    assert.equal(parsePort('9464', '--metrics-port'), 9464);
    assert.throws(
      () => parsePort('http', '--metrics-port'),
      /--metrics-port must be a port number 0\.\.65535, got "http"/,
    );
    assert.throws(() => parsePort('70000', '--metrics-port'), /got "70000"/);
    assert.deepEqual(parseWorkerArgs([], {}).metrics, {
      port: undefined,
      sdkPort: undefined,
      host: '127.0.0.1',
    });
    assert.deepEqual(
      parseWorkerArgs(['--metrics-port', '9464', '--metrics-host', '0.0.0.0'], {
        MOERL_SDK_METRICS_PORT: '9465',
      }).metrics,
      { port: 9464, sdkPort: 9465, host: '0.0.0.0' },
    );
    assert.throws(
      () => parseWorkerArgs([], { MOERL_METRICS_PORT: 'x' }),
      /MOERL_METRICS_PORT\) must be a port number/,
    );
  });
});
