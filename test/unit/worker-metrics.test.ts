// The metrics wrapper around a worker's activities, with fake activities in Temporal's mock
// activity environment and a fake server description: outcomes, retries and their reasons,
// failure reasons, rank failures, campaign statuses and the bound on per-campaign gauges. The real activities and a real worker are in
// test/integration/worker-metrics.test.ts.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ApplicationFailure, CancelledFailure, defaultPayloadConverter } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import type { CampaignActivities, CheckpointInput } from '../../activities/types.js';
import { parseWorkerArgs } from '../../workers/main.js';
import { createWorkerMetrics, parsePort, serveMetrics } from '../../workers/metrics.js';
import type { DescribeWorkflow } from '../../workers/metrics.js';

/** Fake activities: each fails with `failure` when it is set, else returns a fixed output. */
function fakeActivities(failure: { current: unknown }): CampaignActivities {
  const maybeFail = () => {
    if (failure.current !== undefined) throw failure.current;
  };
  return {
    prepareInputs: async () => (maybeFail(), { attempt: 1, dataset: null }),
    preparePolicy: async () => (maybeFail(), { attempt: 1 }) as never,
    rolloutShard: async () => (
      maybeFail(),
      {
        attempt: 1,
        shard: 0,
        chunks: 2,
        samples: 4,
        tokens: 30,
        tokensPerSecond: 1,
        chunksRedone: 1,
        episodes: {
          episodes: 4,
          policyTurns: 9,
          endReasons: { answered: 3, 'max-turns': 1 },
          toolCalls: { calculator: 5, '(unknown)': 1 },
          toolErrors: { 'unknown-tool': 1 },
          toolSeconds: 2.5,
          generationSeconds: 4,
        },
      }
    ),
    computeRewards: async () => (maybeFail(), { groups: 8, groupsWithSignal: 5 }) as never,
    updatePolicy: async () =>
      (maybeFail(),
      {
        attempt: 1,
        metrics: { ep_seconds: 0.5, ep_bytes: 1024, mismatch_kl: 3e-13, tis_clip_frac: 0.25 },
      }) as never,
    commitCheckpoint: async () => (maybeFail(), {}) as never,
    exportPolicy: async () => (maybeFail(), {}) as never,
    validationShard: async () => (maybeFail(), {}) as never,
    scoreValidation: async (input) => (
      maybeFail(),
      {
        attempt: 1,
        iteration: input.policy.iteration,
        k: 1,
        prompts: 3,
        meanReward: 0.5,
        passAtK: 2 / 3,
        bySource: {
          a: { prompts: 2, meanReward: 0.75, passAtK: input.policy.iteration === 1 ? 1 : 2 / 3 },
          ...(input.policy.iteration === 1 ? { b: { prompts: 1, meanReward: 0, passAtK: 0 } } : {}),
        },
      }
    ),
  };
}

const commitInput = (campaignId: string, iteration: number) =>
  ({
    campaignId,
    meanReward: 0.25,
    staged: { manifest: { files: [{ bytes: 100 }, { bytes: 23 }] }, iteration },
  }) as unknown as CheckpointInput;

async function waitUntil(ok: () => Promise<boolean>) {
  for (const deadline = Date.now() + 5_000; !(await ok());)
    if (Date.now() > deadline) throw new Error('condition not met in 5 s');
    else await new Promise((r) => setTimeout(r, 10));
}

/** A fake server: describes every workflow with `answer` (or fails when it is an Error). */
function fakeDescribe(answer: () => unknown): DescribeWorkflow {
  return async () => {
    const a = answer();
    if (a instanceof Error) throw a;
    return a as Awaited<ReturnType<DescribeWorkflow>>;
  };
}

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
    await new MockActivityEnvironment({ attempt: 1 }).run(a.computeRewards, {} as never);

    failure.current = ApplicationFailure.create({
      type: 'TrainerRankFailed',
      message: 'update: rank 1 of 2 exited with code 3 (job j)',
    });
    await assert.rejects(new MockActivityEnvironment({ attempt: 2 }).run(a.updatePolicy, {} as never));
    failure.current = ApplicationFailure.create({ type: 'SomethingNew', message: 'x' });
    await assert.rejects(new MockActivityEnvironment({ attempt: 3 }).run(a.updatePolicy, {} as never));
    failure.current = new CancelledFailure('cancelled');
    await assert.rejects(new MockActivityEnvironment({ attempt: 1 }).run(a.rolloutShard, {} as never));

    assert.equal(await value(m, 'moerl_activity_attempts_total', { stage: 'update' }), 3);
    // Without a server to ask, a retry's reason is unknown.
    await waitUntil(async () => (await value(m, 'moerl_activity_retries_total')) === 2);
    assert.equal(await value(m, 'moerl_activity_retries_total', { stage: 'update', reason: 'unknown' }), 2);
    assert.equal(
      await value(m, 'moerl_activity_failures_total', { stage: 'update', reason: 'TrainerRankFailed' }),
      1,
    );
    assert.equal(await value(m, 'moerl_activity_failures_total', { stage: 'update', reason: 'other' }), 1);
    assert.equal(await value(m, 'moerl_train_job_rank_failures_total', { stage: 'update' }), 1);
    assert.equal(await value(m, 'moerl_train_job_rank_failures_total', { stage: 'prepare' }), 0);
    const count = (stage: string, outcome: string) =>
      value(m, 'moerl_stage_duration_seconds', { stage, outcome, le: '+Inf' });
    assert.equal(await count('update', 'ok'), 1);
    assert.equal(await count('update', 'failed'), 2);
    assert.equal(await count('rollout', 'cancelled'), 1);
    assert.equal(await value(m, 'moerl_rollout_tokens_total'), 30);
    assert.equal(await value(m, 'moerl_rollout_samples_total'), 4);
    assert.equal(await value(m, 'moerl_rollout_chunks_redone_total'), 1);
    assert.equal(await value(m, 'moerl_rollout_episodes_total', { end_reason: 'answered' }), 3);
    assert.equal(await value(m, 'moerl_rollout_episodes_total', { end_reason: 'max-turns' }), 1);
    assert.equal(await value(m, 'moerl_rollout_episode_turns_total'), 9);
    assert.equal(await value(m, 'moerl_reward_groups_total', { signal: 'yes' }), 5);
    assert.equal(await value(m, 'moerl_reward_groups_total', { signal: 'no' }), 3);
    assert.equal(await value(m, 'moerl_rollout_tool_calls_total', { tool: 'calculator' }), 5);
    assert.equal(await value(m, 'moerl_rollout_tool_errors_total', { error: 'unknown-tool' }), 1);
    assert.equal(await value(m, 'moerl_rollout_tool_seconds_total'), 2.5);
    assert.equal(await value(m, 'moerl_rollout_generation_seconds_total'), 4);
    assert.equal(await value(m, 'moerl_update_ep_seconds'), 0.5);
    assert.equal(await value(m, 'moerl_update_ep_bytes'), 1024);
    assert.equal(await value(m, 'moerl_update_mismatch_kl'), 3e-13);
    assert.equal(await value(m, 'moerl_update_tis_clip_fraction'), 0.25);
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

  test('validation gauges: the latest checkpoint per campaign and data_source, a source no longer scored dropped', async () => {
    const m = createWorkerMetrics();
    const a = m.instrument(fakeActivities({ current: undefined }));
    const score = (campaignId: string, iteration: number) =>
      new MockActivityEnvironment().run(a.scoreValidation, {
        campaignId,
        policy: { iteration },
      } as never);
    await score('c1', 1);
    assert.equal(await value(m, 'moerl_validation_iteration', { campaign: 'c1' }), 1);
    assert.equal(await value(m, 'moerl_validation_mean_reward', { campaign: 'c1', data_source: '' }), 0.5);
    assert.equal(await value(m, 'moerl_validation_pass_at_k', { campaign: 'c1', data_source: 'a' }), 1);
    assert.equal(await value(m, 'moerl_validation_pass_at_k', { campaign: 'c1', data_source: 'b' }), 0);
    await score('c1', 2);
    const sources = (await m.registry.getSingleMetric('moerl_validation_mean_reward')!.get()).values.map(
      (v) => v.labels.data_source,
    );
    assert.deepEqual(sources.sort(), ['', 'a'], 'source b is gone with checkpoint 1');
    assert.equal(await value(m, 'moerl_validation_pass_at_k', { campaign: 'c1', data_source: 'a' }), 2 / 3);
    for (let c = 0; c < 70; c++) await score(`x${c}`, 3);
    const campaigns = new Set(
      (await m.registry.getSingleMetric('moerl_validation_mean_reward')!.get()).values.map(
        (v) => v.labels.campaign,
      ),
    );
    assert.equal(campaigns.size, 64);
    assert.ok(!campaigns.has('c1') && campaigns.has('x69'), 'the campaign validated longest ago is dropped');
  });

  test('fake server: a retry counts under how the server says the previous attempt ended', async () => {
    let lastFailure: unknown = { timeoutFailureInfo: { timeoutType: 4 } };
    const m = createWorkerMetrics(
      fakeDescribe(() =>
        lastFailure instanceof Error
          ? lastFailure
          : { pendingActivities: [{ activityId: '7', attempt: 2, lastFailure }] },
      ),
    );
    const a = m.instrument(fakeActivities({ current: undefined }));
    const retry = (activityId = '7') =>
      new MockActivityEnvironment({
        attempt: 2,
        activityId,
        workflowExecution: { workflowId: 'c1', runId: 'r1' },
      }).run(a.rolloutShard, {} as never);
    const retries = (reason: string) =>
      value(m, 'moerl_activity_retries_total', { stage: 'rollout', reason });

    await retry();
    await waitUntil(async () => (await retries('HeartbeatTimeout')) === 1);
    lastFailure = { message: 'SIGTERM', applicationFailureInfo: { type: 'WorkerShuttingDown' } };
    await retry();
    await waitUntil(async () => (await retries('WorkerShuttingDown')) === 1);
    lastFailure = { message: 'x', applicationFailureInfo: { type: 'SomethingNew' } };
    await retry();
    await waitUntil(async () => (await retries('other')) === 1);
    // Another activity's record, or no answer: unknown.
    await retry('8');
    lastFailure = new Error('unavailable');
    await retry();
    await waitUntil(async () => (await retries('unknown')) === 2);
    assert.equal(await value(m, 'moerl_activity_retries_total'), 5);
    // A first attempt is no retry and asks nothing.
    await new MockActivityEnvironment({ attempt: 1 }).run(a.rolloutShard, {} as never);
    assert.equal(await value(m, 'moerl_activity_retries_total'), 5);
  });

  test('fake server: campaign status from the search attribute while running, the execution status after', async () => {
    let described = 0;
    let answer: { status: number; attribute?: string } = { status: 1, attribute: 'paused' };
    const m = createWorkerMetrics(
      fakeDescribe(() => {
        described++;
        const indexedFields = answer.attribute
          ? { CampaignStatus: defaultPayloadConverter.toPayload(answer.attribute) }
          : {};
        return { workflowExecutionInfo: { status: answer.status, searchAttributes: { indexedFields } } };
      }),
    );
    const a = m.instrument(fakeActivities({ current: undefined }));
    await new MockActivityEnvironment().run(a.commitCheckpoint, commitInput('c1', 1));
    const status = async (campaigns = 1) => {
      const values = (await m.registry.getSingleMetric('moerl_campaign_status')!.get()).values;
      const on = values.filter((v) => v.value === 1).map((v) => `${v.labels.campaign}:${v.labels.status}`);
      assert.equal(values.length, 7 * campaigns, 'one series per campaign and status');
      return on;
    };
    assert.deepEqual(await status(), ['c1:paused']);
    // Read again only after the refresh interval: a scrape does not describe every campaign.
    answer = { status: 5 };
    assert.deepEqual(await status(), ['c1:paused']);
    assert.equal(described, 1);
    // A new campaign is read at the next scrape.
    await new MockActivityEnvironment().run(a.commitCheckpoint, commitInput('c2', 1));
    assert.deepEqual((await status(2)).sort(), ['c1:terminated', 'c2:terminated']);
    answer = { status: 2, attribute: 'cancelled' };
    await new MockActivityEnvironment().run(a.commitCheckpoint, commitInput('c3', 1));
    assert.ok((await status(3)).includes('c3:cancelled'));
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
      demandIntervalMs: 10_000,
    });
    assert.deepEqual(
      parseWorkerArgs(['--metrics-port', '9464', '--metrics-host', '0.0.0.0'], {
        MOERL_SDK_METRICS_PORT: '9465',
      }).metrics,
      { port: 9464, sdkPort: 9465, host: '0.0.0.0', demandIntervalMs: 10_000 },
    );
    assert.throws(
      () => parseWorkerArgs([], { MOERL_METRICS_PORT: 'x' }),
      /MOERL_METRICS_PORT\) must be a port number/,
    );
  });
});
