// `moerl report` on a real short campaign (native tools, demo-sized policy, a few iterations) that
// meets a Spot interruption (its rollout worker SIGKILLed mid-rollout), a pause, a
// hyperparameter change and a continue-as-new. The report's JSON must agree with
// `moerl history --json`, each event must show where it happened, and the page, opened in a real
// headless Chromium, must draw every chart with no console error and no network request.
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import { openStore } from '../../activities/store/index.js';
import type { CampaignHistory } from '../../cli/history.js';
import { main } from '../../cli/main.js';
import type { ReportDocument } from '../../cli/report/index.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import type { CampaignState, TaskQueues } from '../../workflows/types.js';
import { chromiumSkip, renderPage, withBrowser } from '../support/browser.js';
import {
  exited,
  rolloutChunksStored,
  spawnRolloutWorker,
  startCampaign,
  tinyRealSpec,
  uniqueTaskQueues,
  waitFor,
  waitForState,
  withWorkers,
} from '../support/campaign-harness.js';
import { nativeTools } from '../support/native-tools.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const native = nativeTools(['moe_train', 'moe_generate']);
const outputDir = join(repoRoot(), '.moerl', 'test-output', 'report');

let t: TestEnvironment;
let dir: string;
before(async () => {
  t = await startTestEnvironment();
  dir = mkdtempSync(join(tmpdir(), 'moerl-report-'));
  rmSync(outputDir, { recursive: true, force: true });
  mkdirSync(outputDir, { recursive: true });
});
after(async () => {
  await t?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

const rolloutWorker = (queues: TaskQueues, name: string) =>
  spawnRolloutWorker({ address: t.address, queues, dir, name, logDir: outputDir });

async function cli(argv: string[]) {
  let stdout = '';
  let stderr = '';
  const code = await main([...argv, '--address', t.address], {
    stdout: { write: (s: string) => (stdout += s) },
    stderr: { write: (s: string) => (stderr += s) },
    env: {},
  });
  assert.equal(code, 0, `moerl ${argv.join(' ')}: ${stderr}`);
  return stdout;
}

const close = (a: number | null, b: number | null, what: string) =>
  a === null || b === null
    ? assert.equal(a, b, what)
    : assert.ok(Math.abs(a - b) < 1e-9, `${what}: ${a} vs ${b}`);

describe('moerl report', { skip: native.skip || chromiumSkip(), timeout: 300_000 }, () => {
  test('a campaign with a Spot interruption, a pause, a hyperparameter change and a continue-as-new', async () => {
    const spec = tinyRealSpec('report', dir, {
      model: { layers: 2, hidden: 128, heads: 4, experts: 8, topK: 2, contextLength: 32 },
      iterations: 4,
      promptsPerIteration: 128,
      groupSize: 8,
      // Without a warm start every reward is 0 and GRPO has nothing to train on.
      sftWarmStartSteps: 100,
      hyperparameters: { maxNewTokens: 10, minibatches: 2, epochs: 1 },
      orchestration: { rolloutHeartbeatSeconds: 2, updateHeartbeatSeconds: 10, continueAsNewEvery: 2 },
    });
    const store = openStore(spec.store);
    const deps = workerActivityDeps(new AbortController().signal, {
      ...process.env,
      MOERL_CACHE_DIR: join(dir, 'cache-main'),
    });
    const queues = uniqueTaskQueues();
    const pauseSeconds = 2;
    const { id, state } = await withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(deps),
      async () => {
        const first = rolloutWorker(queues, 'first');
        const handle = await startCampaign(t.client, spec, queues);
        const id = handle.workflowId;
        // A wait that times out says where the campaign was.
        const explain = async (err: unknown) => {
          const s = await handle.query<CampaignState>('status').catch(() => null);
          const where = s && {
            status: s.status,
            active: s.activeStages,
            failure: s.lastFailure,
            retries: s.retries,
          };
          throw new Error(`${(err as Error).message}; campaign: ${JSON.stringify(where)}`);
        };
        let second: ChildProcess | null = null;
        try {
          await waitFor(
            'iteration 1 rollout to be under way (after the warm start)',
            async () => ((await rolloutChunksStored(store, id, 1, [0])) >= 2 ? true : undefined),
            180_000,
            20,
          ).catch(explain);
          process.kill(-first.pid!, 'SIGKILL'); // the Spot node is gone
          await exited(first);
          second = rolloutWorker(queues, 'second');
          await waitForState(handle, 'iteration 1 committed', (s) => s.committedIteration >= 1, 90_000).catch(
            explain,
          );
          await cli(['pause', id, '--reason', 'inspect rollouts']);
          await waitForState(handle, 'the campaign paused', (s) => s.status === 'paused', 60_000).catch(
            explain,
          );
          await cli(['set', id, 'temperature=0.9', '--reason', 'report test']);
          await new Promise((r) => setTimeout(r, pauseSeconds * 1000));
          await cli(['resume', id]);
          await handle.result();
          return { id, state: await handle.query<CampaignState>('status') };
        } finally {
          for (const worker of [first, second]) {
            if (!worker || worker.exitCode !== null || worker.signalCode !== null) continue;
            process.kill(-worker.pid!, 'SIGKILL');
            await exited(worker);
          }
        }
      },
      queues,
      ['control', 'train'],
    );

    const prices = join(dir, 'prices.yaml');
    writeFileSync(
      prices,
      'currency: USD\nrollout: { nodeHourPrice: 12.5, nodes: 2 }\ntrain: { nodeHourPrice: 80 }\n',
    );
    const out = join(outputDir, 'campaign');
    const report = JSON.parse(
      await cli([
        'report',
        id,
        '--out',
        out,
        '--prices',
        prices,
        '--train-price',
        '90',
        '--ui',
        'http://127.0.0.1:8233',
        '--json',
      ]),
    ) as ReportDocument;
    const history = JSON.parse(await cli(['history', id, '--json'])) as CampaignHistory;
    assert.deepEqual(JSON.parse(readFileSync(join(out, 'report.json'), 'utf8')), report);

    // The report's numbers are the history's.
    assert.equal(report.header.runs, history.runs.length);
    const rows = history.iterations.filter((it) => it.iteration >= 1);
    assert.deepEqual(
      report.iterations.map((it) => it.iteration),
      rows.map((it) => it.iteration),
    );
    for (const [i, it] of report.iterations.entries()) {
      const h = rows[i]!;
      close(it.meanReward, h.meanReward, `iteration ${it.iteration} reward`);
      close(it.passRate, h.passRate, `iteration ${it.iteration} pass rate`);
      close(it.tokens, h.tokens, `iteration ${it.iteration} tokens`);
      close(it.rolloutTokensPerSecond, h.rolloutTokensPerSecond, `iteration ${it.iteration} tokens/s`);
      close(it.chunksRedone, h.chunksRedone, `iteration ${it.iteration} chunks redone`);
      for (const s of ['rollout', 'reward', 'update', 'checkpoint'] as const)
        close(it.stageSeconds[s], h.stages[s]?.seconds ?? null, `iteration ${it.iteration} ${s} seconds`);
      // native rollouts and trainer: the mismatch is rounding
      close(
        it.train?.mismatchKl ?? null,
        h.trainMetrics?.mismatch_kl ?? null,
        `iteration ${it.iteration} mismatch`,
      );
      assert.ok(
        (it.train?.mismatchKl ?? 1) < 1e-6,
        `iteration ${it.iteration} mismatch_kl ${it.train?.mismatchKl}`,
      );
    }
    const csv = readFileSync(join(out, 'iterations.csv'), 'utf8').trim().split('\n');
    assert.equal(csv.length, 1 + report.iterations.length, 'a CSV row per iteration');

    // Each event where it happened.
    const it1 = report.iterations[0]!;
    assert.ok(
      it1.retries >= 1 && it1.heartbeatTimeouts >= 1,
      `the killed rollout was retried after a heartbeat timeout (${JSON.stringify(it1)})`,
    );
    assert.ok((it1.chunksRedone ?? 0) >= 1, 'the chunk in flight on the killed worker was redone');
    const e = report.economics;
    assert.ok(e.interruptions.heartbeatWaitSeconds >= spec.orchestration.rolloutHeartbeatSeconds);
    assert.ok(e.interruptions.retryDelaySeconds >= e.interruptions.heartbeatWaitSeconds);
    assert.ok(
      e.interruptions.redoneChunkSeconds > 0 &&
        e.interruptions.lostCost !== null &&
        e.interruptions.lostCost > 0,
    );
    const change = state.hyperparameterChanges[0]!;
    assert.deepEqual(
      report.hyperparameterChanges.map((c) => [c.iteration, c.label]),
      [[change.iteration, 'temperature=0.9']],
    );
    assert.deepEqual(
      report.iterations.find((it) => it.iteration === change.iteration)?.hyperparameterChanges,
      ['temperature=0.9'],
    );
    assert.equal(report.pauses.length, 1);
    const pause = report.pauses[0]!;
    assert.equal(pause.reason, 'inspect rollouts');
    const paused = report.iterations.find((it) => it.iteration === pause.beforeIteration);
    assert.ok(
      paused && (paused.waitingSeconds ?? 0) >= pauseSeconds,
      `the pause is waiting time of iteration ${pause.beforeIteration}`,
    );
    assert.deepEqual(
      report.runs.map((r) => [r.index, r.firstIteration, r.closedAs]),
      [
        [1, 0, 'continued-as-new'],
        [2, 3, 'completed'],
      ],
    );
    assert.deepEqual(
      report.iterations.map((it) => it.run),
      [1, 1, 2, 2],
    );

    // Economics from the prices given (file, with the flag overriding the train price).
    assert.deepEqual(
      [
        e.pools.rollout.nodes,
        e.pools.rollout.nodeHourPrice,
        e.pools.train.nodes,
        e.pools.train.nodeHourPrice,
      ],
      [2, 12.5, 1, 90],
    );
    close(e.pools.rollout.cost, 2 * 12.5 * (e.wallSeconds / 3600), 'rollout pool cost');
    close(e.totalCost, (2 * 12.5 + 90) * (e.wallSeconds / 3600), 'campaign cost');
    for (const p of [e.pools.rollout, e.pools.train])
      assert.ok(p.busyFraction! > 0 && p.busyFraction! <= 1, `busy fraction ${p.busyFraction}`);
    assert.equal(
      e.generatedTokens,
      rows.reduce((s, it) => s + (it.tokens ?? 0), 0),
    );
    close(
      e.costPerMillionGeneratedTokens,
      e.totalCost! / (e.generatedTokens / 1e6),
      'cost per 1M generated tokens',
    );
    assert.ok(e.update && e.update.epShare! > 0 && e.update.epShare! < 1, `EP share ${e.update?.epShare}`);
    for (const it of report.iterations) {
      const layers = it.train?.expertLoadLayers;
      assert.equal(layers?.length, 2, `expert load of iteration ${it.iteration} per layer`);
      for (const row of layers!)
        assert.ok(Math.abs(row.reduce((a, b) => a + b, 0) - 1) < 1e-3, "a layer's shares sum to 1");
    }
    assert.deepEqual(report.absent, []);
    assert.match(report.header.temporalUi ?? '', new RegExp(`/namespaces/default/workflows/${id}$`));
    assert.deepEqual(
      report.header.checkpointsKept.map((c) => c.iteration),
      state.checkpoints.map((c) => c.iteration),
    );

    // The page in a real browser: every chart drawn, the markers among the drawn marks.
    const screenshot = join(outputDir, 'report.png');
    const page = await withBrowser((browser) => renderPage(browser, join(out, 'report.html'), screenshot));
    console.log(`report page: ${JSON.stringify(page.marks)}; screenshot ${screenshot}`);
    assert.equal(page.rendered, 'ok');
    assert.deepEqual(page.consoleErrors, []);
    assert.deepEqual(page.requests, [], 'the page loads nothing');
    const charts = [
      'reward',
      'stages',
      'throughput',
      'interruptions',
      'timeline',
      'training',
      'mismatch',
      'expertLoad',
      'epCompute',
    ];
    assert.deepEqual(Object.keys(page.marks).sort(), [...charts].sort());
    const drawn = (chart: string) => Object.values(page.marks[chart] ?? {}).reduce((a, b) => a + b, 0);
    for (const c of charts) assert.ok(drawn(c) > 0, `chart ${c} drew marks`);
    assert.equal(page.marks.reward?.hpChange_marks, 1, 'one hyperparameter change on the reward chart');
    assert.equal(page.marks.stages?.pauseBefore_marks, 1, 'one pause on the stage chart');
    assert.equal(page.marks.stages?.runStartBefore_marks, 1, 'one new run on the stage chart');
    assert.equal(page.marks.timeline?.pause_marks, 1, 'one pause on the timeline');
    assert.equal(page.marks.timeline?.runStart_marks, 1, 'one continue-as-new on the timeline');
    assert.equal(
      page.marks.expertLoad && Object.values(page.marks.expertLoad).reduce((a, b) => a + b, 0),
      4 * 2 * 8,
      'a cell per iteration, layer and expert',
    );
    assert.ok(statSync(screenshot).size > 10_000, 'a screenshot was written');
  });
});
