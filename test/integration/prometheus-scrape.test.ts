// A real Prometheus server (built from its Go modules by scripts/tools.sh, without service
// discovery) scrapes a real worker on 127.0.0.1 every second while the worker runs a real
// campaign; its HTTP API must then hold the moerl_* series with the values the workflow recorded,
// and evaluate every expression of the Grafana dashboard. Opt-in (MOERL_PROMETHEUS=1 or
// PROMETHEUS_PATH): the first build takes many minutes on a fresh Go cache (docs/metrics.md).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { repoRoot } from '../../cli/temporal-tools.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, tinyRealSpec, uniqueTaskQueues, waitFor } from '../support/campaign-harness.js';
import { startMetricsWorker, startRewardModel } from '../support/metrics-worker.js';
import { nativeTools } from '../support/native-tools.js';
import { startPrometheus } from '../support/prometheus.js';
import { dashboardQueries } from '../support/promql.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const tools = nativeTools(['moe_generate', 'moe_reward', 'moe_train']);
const enabled = process.env.MOERL_PROMETHEUS === '1' || Boolean(process.env.PROMETHEUS_PATH);
const skip =
  tools.skip ||
  (!enabled &&
    'set MOERL_PROMETHEUS=1 to build Prometheus into the tools cache and run it (or PROMETHEUS_PATH=<binary>)');

let t: TestEnvironment;
let dir: string;
before(async () => {
  if (skip) return;
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-prometheus-'));
});
after(async () => {
  await t?.teardown();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('a real Prometheus server scrapes a worker', { skip }, () => {
  test('moerl_* series in Prometheus during and after a real campaign; every dashboard expression evaluates', async () => {
    const queues = uniqueTaskQueues();
    const rewardModel = await startRewardModel();
    const worker = await startMetricsWorker({ address: t.address, queues, dir, env: tools.env });
    const prometheus = await startPrometheus(dir, [
      '  - job_name: moerl',
      `    static_configs: [{ targets: ['127.0.0.1:${worker.port}'] }]`,
      '  - job_name: temporal-sdk',
      `    static_configs: [{ targets: ['127.0.0.1:${worker.sdkPort}'] }]`,
    ]).catch(async (err: unknown) => {
      await worker.process.stop(10_000);
      await rewardModel.close();
      throw err;
    });
    try {
      const spec = tinyRealSpec('prometheus', dir, {
        iterations: 2,
        reward: { kind: 'http', url: rewardModel.url },
      });
      const handle = await startCampaign(t.client, spec, queues);

      // During the campaign: Prometheus has scraped a completed rollout shard.
      await waitFor(
        'Prometheus holds rollout tokens',
        async () => ((await prometheus.one('sum(moerl_rollout_tokens_total)')) > 0 ? true : undefined),
        180_000,
        500,
      );
      assert.equal((await handle.describe()).status.name, 'RUNNING', 'scraped while the campaign ran');

      await handle.result();
      const state = await handle.query<CampaignState>('status');
      const campaign = `{campaign="${state.campaignId}"}`;
      // A scrape after the end: the campaign's status gauge says completed.
      await waitFor(
        'Prometheus sees the campaign completed',
        async () =>
          (await prometheus.one(
            `moerl_campaign_status{campaign="${state.campaignId}", status="completed"}`,
          )) === 1
            ? true
            : undefined,
        30_000,
        500,
      );
      const up = await prometheus.query('up');
      assert.deepEqual(
        up.map((s) => [s.metric.job, s.value[1]]).sort(),
        [
          ['moerl', '1'],
          ['temporal-sdk', '1'],
        ],
        'both targets are up',
      );
      assert.equal(await prometheus.one(`moerl_campaign_iteration${campaign}`), spec.iterations);
      assert.equal(
        await prometheus.one(`moerl_campaign_mean_reward${campaign}`),
        state.latestCheckpoint!.meanReward,
      );
      assert.equal(
        await prometheus.one('sum(moerl_rollout_samples_total)'),
        spec.iterations * spec.promptsPerIteration * spec.groupSize,
      );
      assert.equal(
        await prometheus.one('sum(moerl_rollout_tokens_total)'),
        state.recentIterations.reduce((s, it) => s + it.tokens, 0),
      );
      assert.equal(
        await prometheus.one('sum(moerl_stage_duration_seconds_count{stage="update", outcome="ok"})'),
        spec.iterations,
      );
      const names = (await prometheus.query('count by (__name__) ({__name__=~"moerl_.+"})')).map(
        (s) => s.metric.__name__,
      );
      for (const n of [
        'moerl_stage_duration_seconds_bucket',
        'moerl_checkpoint_commit_duration_seconds_count',
      ])
        assert.ok(names.includes(n), `${n} in Prometheus: ${names.join(', ')}`);

      // The dashboard, with "All" selected, against the real query engine.
      const queries = dashboardQueries(join(repoRoot(), 'k8s', 'monitoring', 'grafana-dashboard.json'), '.*');
      let withData = 0;
      for (const q of queries) if ((await prometheus.query(q.expr)).length > 0) withData++;
      for (const q of queries.filter((x) => /Iteration|Mean reward|Status|tokens per second/.test(x.where)))
        assert.ok((await prometheus.query(q.expr)).length > 0, `${q.where} shows data: ${q.expr}`);
      console.log(
        `prometheus: ${names.length} moerl_ series names; ${withData} of ${queries.length} dashboard queries with data`,
      );
    } finally {
      await prometheus.stop();
      await worker.process.stop(10_000);
      await rewardModel.close();
    }
  });
});
