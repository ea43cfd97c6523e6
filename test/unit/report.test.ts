// moerl report's formulas on a hand-made history (docs/report.md, "Formulas"): waiting time,
// pool busy time as a union of intervals, costs, interruption losses, EP share; and the prices'
// bad-input errors.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, describe, it } from 'node:test';
import { CliError, UsageError } from '../../cli/errors.js';
import { historyFromRecords, type ActivityRecord, type CampaignRecords } from '../../cli/history.js';
import type { ReportSource } from '../../cli/report/collect.js';
import { parse, View } from 'vega';
import { compile } from 'vega-lite';
import { charts } from '../../cli/report/charts.js';
import { buildReport, iterationsCsv } from '../../cli/report/index.js';
import { unionSeconds } from '../../cli/report/economics.js';
import { prometheusBase, readFleet } from '../../cli/report/fleet.js';
import { resolvePrices } from '../../cli/report/prices.js';
import { testSpec } from '../support/campaign-harness.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-report-unit-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const spec = testSpec({ iterations: 1, rolloutShards: 2, orchestration: { rolloutHeartbeatSeconds: 5 } });
const s = (x: number) => x * 1000; // seconds → ms since the campaign started (at 0)

function act(
  p: Partial<ActivityRecord> & Pick<ActivityRecord, 'activity' | 'stage' | 'iteration'>,
): ActivityRecord {
  return {
    activityId: String(Math.random()),
    runId: 'run-1',
    scheduledAt: 0,
    startedAt: 0,
    closedAt: 0,
    outcome: 'completed',
    attempts: 1,
    failures: [],
    heartbeatTimeouts: 0,
    result: {},
    ...p,
  };
}

const checkpoint = (iteration: number, removed: string[] = []) => ({
  checkpoint: { campaignId: 'c', iteration, key: `k${iteration}`, manifestSha256: 'x', meanReward: 0.5 },
  removed,
  attempt: 1,
});

// prepare 0-10 s, commit 10-11; iteration 1: shard 0 10 s of 10 chunks, shard 1 interrupted
// (heartbeat timeout, restarted at 20 s, 2 chunks redone), reward, update, commit.
const activities: ActivityRecord[] = [
  act({ activity: 'preparePolicy', stage: 'prepare', iteration: 0, scheduledAt: 0, closedAt: s(10) }),
  act({
    activity: 'commitCheckpoint',
    stage: 'checkpoint',
    iteration: 0,
    scheduledAt: s(10),
    closedAt: s(11),
    result: checkpoint(0),
  }),
  act({
    activity: 'rolloutShard',
    stage: 'rollout',
    iteration: 1,
    shard: 0,
    scheduledAt: s(12),
    startedAt: s(12),
    closedAt: s(22),
    result: {
      shard: 0,
      chunks: 10,
      samples: 8,
      tokens: 1000,
      tokensPerSecond: 100,
      chunksRedone: 0,
      attempt: 1,
    },
  }),
  act({
    activity: 'rolloutShard',
    stage: 'rollout',
    iteration: 1,
    shard: 1,
    scheduledAt: s(12),
    startedAt: s(20),
    closedAt: s(30),
    attempts: 2,
    heartbeatTimeouts: 1,
    failures: ['attempt 1: activity Heartbeat timeout'],
    result: {
      shard: 1,
      chunks: 10,
      samples: 8,
      tokens: 800,
      tokensPerSecond: 100,
      chunksRedone: 2,
      attempt: 2,
    },
  }),
  act({
    activity: 'computeRewards',
    stage: 'reward',
    iteration: 1,
    scheduledAt: s(30),
    closedAt: s(31),
    result: { meanReward: 0.5, stdReward: 0.1, passRate: 0.25, attempt: 1 },
  }),
  act({
    activity: 'updatePolicy',
    stage: 'update',
    iteration: 1,
    scheduledAt: s(31),
    closedAt: s(41),
    result: { metrics: { loss: 1 }, attempt: 1 },
  }),
  act({
    activity: 'commitCheckpoint',
    stage: 'checkpoint',
    iteration: 1,
    scheduledAt: s(45),
    closedAt: s(46),
    result: checkpoint(1, ['k0']),
  }),
];
const records: CampaignRecords = {
  campaignId: 'c',
  runSpans: [
    {
      runId: 'run-1',
      startedAt: new Date(0).toISOString(),
      lastEventAt: new Date(s(50)).toISOString(),
      closedAs: 'completed',
    },
  ],
  activities,
  changes: [],
  signals: [],
  input: { campaignId: 'c', spec, taskQueues: { control: 'c', rollout: 'r', train: 't' } },
};
// the mismatch figures are the first step's (the later one's include the policy's own drift)
const steps = [
  { tokens: 300, seconds: 4, ep_seconds: 1, ep_bytes: 10, loss: 1, expert_load_layers: [[0.5, 0.5]] },
  { tokens: 300, seconds: 6, ep_seconds: 2, ep_bytes: 20, loss: 3, expert_load_layers: [[0.7, 0.3]] },
].map((step, i) => ({ ...step, mismatch_kl: [2e-13, 5e-3][i], tis_clip_frac: [0.1, 0.3][i] }));
const source: ReportSource = {
  records,
  history: historyFromRecords(records),
  spec,
  store: 'fs:x',
  trainSteps: new Map([[1, steps]]),
  metricsMissing: [],
  updatesSkipped: [],
  readAt: s(50),
};

describe('report formulas', () => {
  it('union of intervals', () => {
    assert.equal(
      unionSeconds([
        [0, 1000],
        [500, 2000],
        [3000, 4000],
        [3500, 3600],
      ]),
      3,
    );
    assert.equal(unionSeconds([]), 0);
  });

  it('per iteration, pools, costs, interruptions and EP share from a known history', () => {
    const prices = resolvePrices({ rolloutPrice: '36', trainPrice: '72', trainNodes: '2' }, spec);
    const r = buildReport(source, prices, null);
    const it = r.iterations[0]!;
    assert.equal(r.iterations.length, 1);
    assert.deepEqual(it.stageSeconds, { rollout: 18, reward: 1, update: 10, checkpoint: 1 });
    assert.equal(it.waitingSeconds, 35 - 30, 'span 11 s → 46 s minus the stages');
    assert.deepEqual(
      [it.retries, it.failures, it.heartbeatTimeouts, it.tokens, it.chunksRedone],
      [1, 1, 1, 1800, 2],
    );
    assert.deepEqual(it.train?.expertLoadLayers, [[0.6, 0.4]]);
    assert.deepEqual([it.train?.loss, it.train?.tokens, it.train?.seconds], [2, 600, 10]);
    assert.deepEqual([it.train?.mismatchKl, it.train?.tisClipFrac], [2e-13, 0.1]);
    assert.deepEqual(
      r.header.checkpointsKept.map((c) => c.iteration),
      [1],
      'retention removed checkpoint 0',
    );

    const e = r.economics;
    assert.equal(e.wallSeconds, 50);
    assert.equal(e.pools.rollout.busySeconds, 19, 'rollout 12-30 s and reward 30-31 s');
    assert.equal(e.pools.train.busySeconds, 20);
    assert.equal(e.pools.rollout.busyFraction, 19 / 50);
    assert.equal(e.pools.rollout.nodes, 2, 'one rollout node per shard by default');
    assert.equal(e.pools.rollout.cost, 2 * 36 * (50 / 3600));
    assert.equal(e.pools.train.cost, 2 * 72 * (50 / 3600));
    assert.equal(e.totalCost, 1 + 2);
    assert.equal(e.costPerMillionGeneratedTokens, 3 / (1800 / 1e6));
    assert.equal(e.trainCostPerMillionTrainedTokens, 2 / (600 / 1e6));
    const i = e.interruptions;
    assert.equal(i.retryDelaySeconds, 8, 'scheduled at 12 s, the successful attempt started at 20 s');
    assert.equal(i.heartbeatWaitSeconds, 5, 'one heartbeat timeout of 5 s');
    assert.equal(i.redoneChunkSeconds, 2 * (1000 / 100 / 10), 'seconds per chunk of the uninterrupted shard');
    assert.equal(i.lostSeconds.rollout, 10);
    assert.equal(i.lostCost, (10 / 3600) * 36);
    assert.deepEqual([e.update?.epSeconds, e.update?.epShare, e.update?.computeShare], [3, 0.3, 0.7]);
    assert.match(
      iterationsCsv(r).split('\n')[1] ?? '',
      /^1,1,0\.5,0\.25,16,1800,200,2,18,1,10,1,5,1,1,1,2,600,2,/,
    );
  });

  it('without prices costs are null, the rest is computed', () => {
    const r = buildReport(source, resolvePrices({}, spec), null);
    assert.equal(r.economics.totalCost, null);
    assert.equal(r.economics.interruptions.lostCost, null);
    assert.equal(r.economics.pools.train.busySeconds, 20);
  });

  it('validated checkpoints become the validation chart: all prompts, then each data_source', async () => {
    const scored = (iteration: number, meanReward: number) =>
      act({
        activity: 'scoreValidation',
        stage: 'validation',
        iteration,
        scheduledAt: s(iteration * 20 + 11),
        closedAt: s(iteration * 20 + 12),
        result: {
          iteration,
          k: 4,
          prompts: 3,
          meanReward,
          passAtK: 2 * meanReward,
          bySource: { gsm8k: { prompts: 2, meanReward: meanReward + 0.1, passAtK: 1 } },
          attempt: 1,
        },
      });
    const withValidation = { ...records, activities: [...activities, scored(0, 0.1), scored(1, 0.3)] };
    const r = buildReport(
      { ...source, records: withValidation, history: historyFromRecords(withValidation) },
      resolvePrices({}, spec),
      null,
    );
    assert.deepEqual(
      r.validations.map((v) => [v.iteration, v.dataSource, v.meanReward, v.passAtK, v.k]),
      [
        [0, 'all', 0.1, 0.2, 4],
        [0, 'gsm8k', 0.2, 1, 4],
        [1, 'all', 0.3, 0.6, 4],
        [1, 'gsm8k', 0.4, 1, 4],
      ],
    );
    const chart = charts(r).find((c) => c.id === 'validation');
    const rows = (chart?.spec?.data as { values: { series: string }[] } | undefined)?.values ?? [];
    assert.equal(rows.length, 8, 'mean reward and pass@4 per checkpoint and source');
    assert.deepEqual([...new Set(rows.map((v) => v.series))], ['mean reward', 'pass@4']);
    // Vega-Lite compiles it and Vega draws a panel per source, a point per row.
    const view = new View(parse(compile(chart!.spec as never).spec), { renderer: 'none' });
    await view.runAsync();
    const svg = await view.toSVG();
    assert.equal(svg.match(/aria-roledescription="point"/g)?.length, 8, 'eight points');
    assert.ok(svg.includes('gsm8k') && svg.includes('all'), 'a panel per source');
    assert.equal(
      charts(buildReport(source, resolvePrices({}, spec), null)).find((c) => c.id === 'validation')?.spec,
      null,
    );
  });

  it("an agentic campaign's episodes become the episodes chart and CSV columns; one-shot rollouts draw none", async () => {
    const episodes = (
      ends: Record<string, number>,
      calls: Record<string, number>,
      errors: Record<string, number>,
    ) => ({
      episodes: Object.values(ends).reduce((a, b) => a + b, 0),
      policyTurns: 10,
      endReasons: ends,
      toolCalls: calls,
      toolErrors: errors,
      toolSeconds: 2,
      generationSeconds: 6,
    });
    const withEpisodes = {
      ...records,
      activities: activities.map((a) =>
        a.activity !== 'rolloutShard'
          ? a
          : {
              ...a,
              result: {
                ...(a.result as object),
                episodes:
                  a.shard === 0
                    ? episodes({ eos: 3 }, { calculator: 4 }, {})
                    : episodes({ eos: 1, 'max-turns': 1 }, { calculator: 1, python: 2 }, { timeout: 1 }),
              },
            },
      ),
    };
    const r = buildReport(
      { ...source, records: withEpisodes, history: historyFromRecords(withEpisodes) },
      resolvePrices({}, spec),
      null,
    );
    // the two shards' stats add up
    assert.deepEqual(r.iterations[0]!.episodes, {
      episodes: 5,
      policyTurns: 20,
      endReasons: { eos: 4, 'max-turns': 1 },
      toolCalls: { calculator: 5, python: 2 },
      toolErrors: { timeout: 1 },
      toolSeconds: 4,
      generationSeconds: 12,
    });
    assert.match(iterationsCsv(r).split('\n')[1] ?? '', /,5,20,7,1,4,12,$/);
    const chart = charts(r).find((c) => c.id === 'episodes');
    const panels = (chart?.spec?.concat ?? []) as {
      title: string;
      data: { values: Record<string, unknown>[] };
    }[];
    assert.deepEqual(
      panels.map((p) => p.title),
      ['episode end reasons', 'per episode', 'tool calls by tool', 'tool errors'],
    );
    assert.deepEqual(
      panels[1]!.data.values.map((v) => [v.what, v.value]),
      [
        ['policy turns', 4],
        ['tool seconds', 0.8],
        ['generation seconds', 2.4],
      ],
    );
    // Vega-Lite compiles it and Vega draws it: a bar per (iteration, name) of the three count panels
    const view = new View(parse(compile(chart!.spec as never).spec), { renderer: 'none' });
    await view.runAsync();
    const svg = await view.toSVG();
    assert.equal(svg.match(/aria-roledescription="bar"/g)?.length, 2 + 2 + 1);
    assert.ok(svg.includes('max-turns') && svg.includes('python'), 'the names are in the legends');
    const oneShot = buildReport(source, resolvePrices({}, spec), null);
    assert.equal(oneShot.iterations[0]!.episodes, null);
    assert.equal(charts(oneShot).find((c) => c.id === 'episodes')?.spec, null);
    assert.match(iterationsCsv(oneShot).split('\n')[1] ?? '', /,,,,,,,$/);
  });

  it('bad prices name the flag or the file and field', () => {
    const file = join(dir, 'p.yaml');
    writeFileSync(file, 'train: { nodeHourPrice: -1 }\n');
    assert.throws(
      () => resolvePrices({ file }, spec),
      (e: Error) => e instanceof UsageError && /p\.yaml: train\.nodeHourPrice: /.test(e.message),
    );
    assert.throws(
      () => resolvePrices({ trainNodes: '0' }, spec),
      /--train-nodes: got "0"; expected a whole number of nodes/,
    );
    assert.throws(() => resolvePrices({ rolloutPrice: '' }, spec), /--rollout-price: got ""/);
    writeFileSync(file, 'rollout: { nodeHourPrice: 2 }\n');
    assert.deepEqual(resolvePrices({ file, trainPrice: '3' }, spec).rollout, { nodeHourPrice: 2, nodes: 2 });
  });
});

/**
 * A fake Prometheus server: answers /api/v1/query_range for count() and sum() of the capacity
 * metric with a fleet of `pods(t)` workers of 2 ranks each, and records the queries it got.
 */
async function fakePrometheus(
  pods: (t: number) => number,
  answer?: (res: import('node:http').ServerResponse) => void,
) {
  const queries: URLSearchParams[] = [];
  const server = createServer((req, res) => {
    const q = new URL(req.url!, 'http://x').searchParams;
    queries.push(q);
    if (answer) return answer(res);
    const [start, end, step] = ['start', 'end', 'step'].map((k) => Number(q.get(k)));
    const per = q.get('query')!.startsWith('sum(') ? 2 : 1;
    const values: [number, string][] = [];
    for (let t = start!; t <= end!; t += step!) if (pods(t) > 0) values.push([t, String(pods(t) * per)]);
    res.setHeader('content-type', 'application/json');
    res.end(
      JSON.stringify({
        status: 'success',
        data: { resultType: 'matrix', result: values.length ? [{ metric: {}, values }] : [] },
      }),
    );
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { base, queries, close: () => new Promise((ok) => server.close(ok)) };
}

describe('the rollout fleet measured by Prometheus (fake Prometheus server)', () => {
  it('pod- and rank-seconds over the campaign, the busy fraction against the ranks its activities held, the cost from pod-hours', async () => {
    // Two workers from 10 s to 40 s of the 50 s campaign, none before or after.
    const prom = await fakePrometheus((t) => (t >= 10 && t <= 40 ? 2 : 0));
    try {
      const fleet = await readFleet(prom.base, 'job="moerl-rollout"', { from: 0, to: s(50) });
      assert.deepEqual(prom.queries.map((q) => q.get('query')).sort(), [
        'count(moerl_rollout_rank_capacity{job="moerl-rollout"})',
        'sum(moerl_rollout_rank_capacity{job="moerl-rollout"})',
      ]);
      assert.deepEqual(
        ['start', 'end', 'step'].map((k) => prom.queries[0]!.get(k)),
        ['0', '50', '1'],
      );
      const prices = resolvePrices({ rolloutPrice: '36', trainPrice: '72', trainNodes: '2' }, spec);
      const e = buildReport(source, prices, null, fleet).economics;
      const f = e.fleet!;
      assert.equal(f.podSeconds, 31 * 2, '31 one-second samples of 2 pods');
      assert.equal(f.rankSeconds, 31 * 4);
      assert.equal(f.peakPods, 2);
      assert.equal(f.meanPods, 62 / 51);
      // The shards ran 12-22 s and 20-30 s with rolloutEpWorldSize ranks each; the reward 0-31 s with one.
      const ep = spec.rolloutEpWorldSize;
      assert.equal(f.busyRankSeconds, 10 * ep + 10 * ep + 31);
      assert.equal(f.busyFraction, f.busyRankSeconds / 124);
      assert.equal(f.cost, (62 / 3600) * 36);
      assert.equal(e.totalCost, f.cost! + 2, 'the measured fleet replaces the rollout pool in the total');
      assert.equal(e.rolloutCostPerMillionGeneratedTokens, f.cost! / (1800 / 1e6));
      assert.equal(buildReport(source, prices, null).economics.fleet, null, 'no fleet without Prometheus');
    } finally {
      await prom.close();
    }
  });

  it('a long campaign is read at a coarser step within the point limit; no worker at all is zero, not an error', async () => {
    const prom = await fakePrometheus(() => 0);
    try {
      const day = 30 * 3600 * 1000;
      const fleet = await readFleet(prom.base, '', { from: s(100), to: s(100) + day });
      assert.equal(fleet.stepSeconds, 11, '108,000 s in at most 10,000 steps');
      assert.equal(fleet.pods.length, Math.floor(108_000 / 11) + 1);
      assert.equal(prom.queries[0]!.get('query')?.includes('moerl_rollout_rank_capacity{}'), true);
      assert.ok(fleet.pods.every((x) => x === 0));
    } finally {
      await prom.close();
    }
  });

  it("bad URLs, refusals and answers that are not Prometheus's are errors naming the server and the query", async () => {
    assert.throws(
      () => prometheusBase('localhost:9090'),
      (e: Error) => e instanceof UsageError && /--prometheus: got "localhost:9090"/.test(e.message),
    );
    assert.equal(prometheusBase('http://127.0.0.1:9090/prom/'), 'http://127.0.0.1:9090/prom');
    const refusing = await fakePrometheus(
      () => 0,
      (res) => {
        res.statusCode = 400;
        res.end(
          JSON.stringify({ status: 'error', errorType: 'bad_data', error: 'parse error: unexpected "}"' }),
        );
      },
    );
    const notJson = await fakePrometheus(
      () => 0,
      (res) => res.end('<html>a login page</html>'),
    );
    try {
      await assert.rejects(
        readFleet(refusing.base, 'job=', { from: 0, to: s(10) }),
        (e: Error) =>
          e instanceof CliError &&
          e.message.includes(refusing.base) &&
          e.message.includes('{job=}') &&
          /refused it \(HTTP 400\): parse error/.test(e.message),
      );
      await assert.rejects(
        readFleet(notJson.base, '', { from: 0, to: s(10) }),
        /not JSON: is this a Prometheus server\?/,
      );
      await refusing.close();
      await assert.rejects(readFleet(refusing.base, '', { from: 0, to: s(10) }), /cannot reach the server/);
    } finally {
      await notJson.close();
    }
  });
});
