// The worker program as users start it, with --metrics-port and --sdk-metrics-port, runs a real
// small campaign; /metrics is scraped while it runs and after, and read by Prometheus's own
// parser and linter. The counters must agree with what the workflow recorded.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import { openStore } from '../../activities/store/index.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import type { CampaignState } from '../../workflows/types.js';
import {
  rolloutChunksStored,
  spawnRolloutWorker,
  startCampaign,
  tinyRealSpec,
  uniqueTaskQueues,
  waitFor,
  withWorkers,
} from '../support/campaign-harness.js';
import { nativeTools } from '../support/native-tools.js';
import { startMetricsWorker, startRewardModel } from '../support/metrics-worker.js';
import { parseExposition } from '../support/promparse.js';
import { dashboardQueries, parsePromQL } from '../support/promql.js';
import type { Exposition, MetricFamily } from '../support/promparse.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const tools = nativeTools(['moe_generate', 'moe_reward', 'moe_train']);
const dashboardPath = join(repoRoot(), 'k8s', 'monitoring', 'grafana-dashboard.json');

let t: TestEnvironment;
let dir: string;
before(async () => {
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-worker-metrics-'));
});
after(async () => {
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

type Scrape = Exposition & { text: string };

async function scrape(url: string): Promise<Scrape> {
  const res = await fetch(url);
  assert.equal(res.status, 200, `GET ${url}`);
  assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  return { ...(await parseExposition(text)), text };
}

/**
 * The series names a query may select in a scrape: each family's TYPE line counts (a counter no
 * event has touched yet has no samples), a histogram by its _bucket, _sum and _count series.
 */
function selectableNames(s: Scrape): Set<string> {
  const names = new Set<string>();
  for (const [, name, type] of s.text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    const suffixes =
      type === 'histogram'
        ? ['_bucket', '_sum', '_count']
        : type === 'summary'
          ? ['', '_sum', '_count']
          : [''];
    for (const suffix of suffixes) names.add(name! + suffix);
  }
  return names;
}

function family(e: Exposition, name: string): MetricFamily {
  const f = e.families.find((x) => x.name === name);
  assert.ok(f, `${name} is exported`);
  return f;
}

const labelsOf = (m: MetricFamily['metric'][number]) =>
  Object.fromEntries((m.label ?? []).map((l) => [l.name, l.value]));

/** Sum of the counter or gauge samples of `name` whose labels include `labels` (0: none yet). */
function sumOf(e: Exposition, name: string, labels: Record<string, string> = {}): number {
  return (e.families.find((x) => x.name === name)?.metric ?? [])
    .filter((m) => Object.entries(labels).every(([k, v]) => labelsOf(m)[k] === v))
    .reduce((sum, m) => sum + (m.counter?.value ?? m.gauge?.value ?? 0), 0);
}

/** The same, for a metric that must be exported. */
function total(e: Exposition, name: string, labels: Record<string, string> = {}): number {
  family(e, name);
  return sumOf(e, name, labels);
}

/** Observations and their sum in the histogram `name` whose labels include `labels`. */
function observed(e: Exposition, name: string, labels: Record<string, string>) {
  let count = 0;
  let sum = 0;
  for (const m of family(e, name).metric)
    if (Object.entries(labels).every(([k, v]) => labelsOf(m)[k] === v)) {
      count += Number(m.histogram?.sampleCount ?? 0);
      sum += m.histogram?.sampleSum ?? 0;
    }
  return { count, sum };
}

describe('worker metrics', { skip: tools.skip }, () => {
  test('moerl-worker --metrics-port: activity, rollout, checkpoint and update metrics during and after a real campaign', async () => {
    const queues = uniqueTaskQueues();
    // Held: the first iteration's rewards wait until the scrape below has been taken.
    const rewardModel = await startRewardModel({ held: true });
    const worker = await startMetricsWorker({ address: t.address, queues, dir, env: tools.env });
    const { url, sdkPort } = worker;
    try {
      // Rewards that differ within every group, so each update takes optimizer steps (an
      // untrained policy's exact-match rewards are all 0, and GRPO then has nothing to learn).
      const spec = tinyRealSpec('metrics', dir, {
        iterations: 2,
        reward: { kind: 'http', url: rewardModel.url },
      });
      const handle = await startCampaign(t.client, spec, queues);

      // During the campaign: the first rollout shard is counted as soon as it completes.
      const during = await waitFor(
        'a rollout shard counted in /metrics',
        async () => {
          const e = await scrape(url);
          return e.families.some((f) => f.name === 'moerl_rollout_tokens_total' && total(e, f.name) > 0)
            ? e
            : undefined;
        },
        180_000,
        250,
      );
      assert.equal((await handle.describe()).status.name, 'RUNNING', 'scraped while the campaign ran');
      assert.ok(total(during, 'moerl_activity_attempts_total', { stage: 'rollout' }) >= 1);
      rewardModel.release();

      await handle.result();
      const state = await handle.query<CampaignState>('status');
      const e = await scrape(url);

      // Names follow the conventions Prometheus's linter checks (`_total` counters, base units).
      const ours = e.families.filter((f) => f.name.startsWith('moerl_'));
      assert.deepEqual(
        e.problems.filter((p) => p.metric.startsWith('moerl_')),
        [],
        'promlint finds nothing in the moerl_ metrics',
      );
      for (const f of ours) {
        if (f.type === 'COUNTER') assert.match(f.name, /_total$/);
        if (f.name.endsWith('_duration_seconds')) assert.equal(f.type, 'HISTOGRAM', f.name);
      }

      // Every attempt is counted once and timed once, by stage.
      for (const stage of ['prepare', 'rollout', 'reward', 'update', 'checkpoint']) {
        const attempts = total(e, 'moerl_activity_attempts_total', { stage });
        assert.ok(attempts >= 1, `${stage} attempts (${attempts})`);
        const all = observed(e, 'moerl_stage_duration_seconds', { stage });
        assert.equal(all.count, attempts, `${stage}: one duration per attempt`);
        const ok = observed(e, 'moerl_stage_duration_seconds', { stage, outcome: 'ok' });
        assert.ok(ok.count >= 1 && ok.sum > 0, `${stage} succeeded at least once, in ${ok.sum} s`);
      }
      assert.ok(total(e, 'moerl_activity_attempts_total', { stage: 'rollout' }) >= 2 * spec.rolloutShards);
      assert.ok(total(e, 'moerl_activity_attempts_total', { stage: 'update' }) >= spec.iterations);
      // Retries are the attempts beyond the first that the workflow saw, each with its reason.
      const retried = Object.values(state.retries).reduce((s, n) => s + n, 0);
      assert.equal(sumOf(e, 'moerl_activity_retries_total'), retried);
      assert.equal(sumOf(e, 'moerl_activity_retries_total', { reason: 'unknown' }), 0);

      // The rollout counters add up to what the workflow recorded per iteration.
      const tokens = state.recentIterations.reduce((s, it) => s + it.tokens, 0);
      const samples = state.recentIterations.reduce((s, it) => s + it.samples, 0);
      assert.ok(tokens > 0);
      assert.equal(total(e, 'moerl_rollout_tokens_total'), tokens);
      assert.equal(total(e, 'moerl_rollout_samples_total'), samples);
      assert.equal(samples, spec.iterations * spec.promptsPerIteration * spec.groupSize);
      assert.equal(
        total(e, 'moerl_rollout_chunks_redone_total'),
        state.recentIterations.reduce((s, it) => s + it.chunksRedone, 0),
      );

      // Checkpoints: at least the bytes of the latest one were committed; the campaign gauges.
      assert.ok(state.latestCheckpoint);
      assert.ok(total(e, 'moerl_checkpoint_commit_bytes_total') > 0);
      const commits = observed(e, 'moerl_checkpoint_commit_duration_seconds', {});
      assert.equal(
        commits.count,
        observed(e, 'moerl_stage_duration_seconds', { stage: 'checkpoint', outcome: 'ok' }).count,
      );
      assert.ok(commits.sum > 0);
      assert.equal(total(e, 'moerl_campaign_iteration', { campaign: state.campaignId }), spec.iterations);
      assert.equal(
        total(e, 'moerl_campaign_mean_reward', { campaign: state.campaignId }),
        state.latestCheckpoint.meanReward,
      );
      // The status gauge reads the server: the finished campaign shows completed, and only that.
      const statuses = await waitFor(
        'moerl_campaign_status shows the campaign completed',
        async () => {
          const now = await scrape(url);
          return sumOf(now, 'moerl_campaign_status', { campaign: state.campaignId, status: 'completed' }) ===
            1
            ? now
            : undefined;
        },
        30_000,
        500,
      );
      assert.equal(total(statuses, 'moerl_campaign_status', { campaign: state.campaignId }), 1);

      // EP figures of the latest update: those its trainer reported; 2 ranks exchange tokens.
      const last = state.recentIterations.at(-1)!.trainMetrics;
      assert.ok(
        last.ep_bytes !== undefined && last.ep_bytes > 0,
        `the update trained and reported ep_bytes: ${JSON.stringify(last)}`,
      );
      assert.equal(total(e, 'moerl_update_ep_bytes'), last.ep_bytes);
      assert.equal(total(e, 'moerl_update_ep_seconds'), last.ep_seconds);
      assert.ok(total(e, 'moerl_update_ep_seconds') <= total(e, 'moerl_update_step_seconds'));
      assert.equal(total(e, 'moerl_train_job_rank_failures_total'), 0);

      // Node's standard process metrics keep their standard names.
      assert.ok(total(e, 'process_cpu_seconds_total') > 0);

      // The Temporal SDK's own metrics, on their own port, in the same conventions.
      const sdk = await scrape(`http://127.0.0.1:${sdkPort}/metrics`);
      const sdkNames = sdk.families.map((f) => f.name);
      assert.ok(
        sdkNames.some((n) => n.startsWith('temporal_') && n.endsWith('_total')),
        `Temporal SDK counters: ${sdkNames.join(', ')}`,
      );
      // The Grafana dashboard reads only metrics these two ports serve, in valid PromQL.
      const served = new Set([...selectableNames(e), ...selectableNames(sdk)]);
      const queries = dashboardQueries(dashboardPath);
      assert.ok(queries.length >= 20, `${queries.length} dashboard queries`);
      const parsed = await parsePromQL(queries.map((q) => q.expr));
      const dashboardMetrics = new Set<string>();
      parsed.forEach((p, i) => {
        assert.equal(p.error, undefined, `${queries[i]!.where}: ${p.expr}`);
        assert.ok(p.metrics.length > 0, `${queries[i]!.where} reads a metric`);
        for (const m of p.metrics) {
          assert.ok(served.has(m), `${queries[i]!.where} reads ${m}, which the worker does not serve`);
          dashboardMetrics.add(m);
        }
      });
      // And it shows every moerl_ family the worker serves.
      for (const f of ours)
        assert.ok(
          [...dashboardMetrics].some((m) => m === f.name || m.startsWith(`${f.name}_`)),
          `the dashboard shows ${f.name}`,
        );
      console.log(
        `worker metrics: ${ours.length} moerl_ families, ${sdk.families.length} SDK families; ` +
          `rollout ${tokens} tokens, ${samples} samples; rollout attempt time ` +
          `${observed(e, 'moerl_stage_duration_seconds', { stage: 'rollout' }).sum.toFixed(2)} s`,
      );
    } finally {
      await worker.process.stop(10_000);
      await rewardModel.close();
    }
    assert.equal(worker.process.exitReason, 'code 0', 'the worker shuts down cleanly on SIGTERM');
  });

  test('a rollout worker lost without notice (SIGKILL): its shards retried on a metrics worker count reason HeartbeatTimeout', async () => {
    const stop = new AbortController();
    const env = { ...process.env, ...tools.env, MOERL_CACHE_DIR: join(dir, 'cache-lost') };
    const queues = uniqueTaskQueues();
    // Big enough that the rollout is still running when its worker is killed.
    const spec = tinyRealSpec('lost-worker', dir, {
      model: { layers: 2, hidden: 128, heads: 4, experts: 8, topK: 2, contextLength: 32 },
      promptsPerIteration: 128,
      groupSize: 8,
      orchestration: { rolloutHeartbeatSeconds: 2 },
    });
    const store = openStore(spec.store);
    const state = await withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(workerActivityDeps(stop.signal, env)),
      async () => {
        // The only rollout worker at first, sharing the cache of this process's workers.
        const first = spawnRolloutWorker({ address: t.address, queues, dir, name: 'lost', env });
        const killFirst = () => {
          try {
            process.kill(-first.pid!, 'SIGKILL'); // the node is gone, with every process on it
          } catch {
            // gone already
          }
        };
        let second: Awaited<ReturnType<typeof startMetricsWorker>> | undefined;
        try {
          const handle = await startCampaign(t.client, spec, queues);
          await waitFor(
            'the rollout under way on the first worker',
            async () => ((await rolloutChunksStored(store, handle.workflowId, 1)) >= 2 ? true : undefined),
            120_000,
            20,
          );
          killFirst();
          second = await startMetricsWorker({
            address: t.address,
            queues,
            dir,
            env,
            roles: ['rollout'],
            name: 'second',
          });
          await handle.result();
          const state = await handle.query<CampaignState>('status');
          const url = second.url;
          const e = await waitFor(
            'every retry counted',
            async () => {
              const now = await scrape(url);
              return sumOf(now, 'moerl_activity_retries_total') >= state.retries.rollout ? now : undefined;
            },
            30_000,
            250,
          );
          return { state, e };
        } finally {
          killFirst();
          await second?.process.stop(10_000);
        }
      },
      queues,
      ['control', 'train'],
    );
    const retried = state.state.retries.rollout;
    assert.ok(retried >= 1, "the killed worker's shards were retried");
    assert.equal(
      sumOf(state.e, 'moerl_activity_retries_total', { stage: 'rollout', reason: 'HeartbeatTimeout' }),
      retried,
      'every rollout retry is counted as a heartbeat timeout',
    );
    assert.equal(sumOf(state.e, 'moerl_activity_retries_total'), retried);
    console.log(`lost worker: ${retried} rollout retries, all reason HeartbeatTimeout`);
  });
});
