// Node time an elastic rollout fleet saves: the same campaign on a fixed fleet and on one that
// KEDA scales by the campaigns' demand, measured by `moerl report --prometheus` (docs/report.md).
// A real control plane with kwok nodes (test/support/kube-cluster.ts), KEDA's real operator and
// metrics server (test/support/keda.ts), the eks overlay's rollout Deployment as rendered: with
// `--fixed` pods (the overlay without its autoscaling component) or with its ScaledObject
// (test/support/rollout-fleet.ts plays the pods' kubelet: a real rollout worker per running pod).
// A real Prometheus server scrapes every rollout worker's own /metrics each second (on ports
// listed in advance that the workers take as they start); `moerl report --prometheus` reads the
// fleet's pod-seconds from it, and the bench sets beside them the workers' own lifetimes.
// Stage times stand in for generation and training (what is measured is the fleet's size, not
// its speed): recording activities sleep, shard k of S for --rollout-s × (0.5 + 0.5·k/(S−1))
// (stragglers), an update for --update-s. The ScaledObject's timings are the overlay's divided
// by 60 (polling 15 s → 1 s, cooldown and scale-down window 300 s → 5 s, 2 pods a minute → 2
// pods a second), so one second here stands for a minute of a real campaign.
// Each elastic run starts from a fleet at rest (KEDA's ScaledObject Ready, no pod), each fixed
// one from its pods all scraped.
// Usage: node dist/bench/rollout_fleet.js [--shards 4] [--iterations 3] [--rollout-s 20]
//        [--update-s 20] [--staleness 0,1] [--price 30]
// Needs root (the control plane's) and the tools (scripts/setup.sh kube-tools; Prometheus is
// built on first use). Progress goes to stderr; the last line on stdout is one JSON object.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { AppsV1Api, CoreV1Api } from '@kubernetes/client-node';
import { Context, sleep } from '@temporalio/activity';
import { DefaultLogger, Runtime, makeTelemetryFilterString } from '@temporalio/worker';
import { stringify } from 'yaml';
import type { CampaignActivities, RolloutShardInput } from '../activities/types.js';
import type { ReportDocument } from '../cli/report/index.js';
import { freePort } from '../cli/dev-server.js';
import { repoRoot } from '../cli/temporal-tools.js';
import {
  startCampaign,
  testSpec,
  uniqueTaskQueues,
  waitFor,
  withWorkers,
  workflowBundle,
} from '../test/support/campaign-harness.js';
import { startKeda } from '../test/support/keda.js';
import { startKubeCluster } from '../test/support/kube-cluster.js';
import { startPrometheus } from '../test/support/prometheus.js';
import { createRecordingTestActivities } from '../test/support/recording-activities.js';
import {
  fleetObjects,
  rolloutFleet,
  rolloutPods,
  rolloutReplicas,
  scaledObjectReady,
  serveRolloutDemand,
} from '../test/support/rollout-fleet.js';
import { startTestEnvironment } from '../test/support/temporal.js';

const { values } = parseArgs({
  options: {
    shards: { type: 'string', default: '4' },
    iterations: { type: 'string', default: '3' },
    'rollout-s': { type: 'string', default: '20' },
    'update-s': { type: 'string', default: '20' },
    staleness: { type: 'string', default: '0,1' },
    price: { type: 'string', default: '30' },
  },
});
const shards = Number(values.shards);
const iterations = Number(values.iterations);
const rolloutMs = Number(values['rollout-s']) * 1000;
const updateMs = Number(values['update-s']) * 1000;
const stalenesses = values.staleness.split(',').map(Number) as (0 | 1)[];
const log = (line: string) => process.stderr.write(`rollout-fleet: ${line}\n`);
const run = promisify(execFile);

Runtime.install({
  logger: new DefaultLogger('ERROR'),
  telemetryOptions: { logging: { filter: makeTelemetryFilterString({ core: 'ERROR' }) } },
});

/** Recording activities that take the bench's stage times, heartbeating meanwhile. */
function timedActivities(): CampaignActivities {
  const { activities } = createRecordingTestActivities();
  const busy = async (ms: number) => {
    const until = Date.now() + ms;
    while (Date.now() < until) {
      Context.current().heartbeat();
      await sleep(Math.min(1000, until - Date.now()));
    }
  };
  return {
    ...activities,
    rolloutShard: async (input: RolloutShardInput) => {
      await busy(rolloutMs * (0.5 + (0.5 * input.shard) / Math.max(1, shards - 1)));
      return activities.rolloutShard(input);
    },
    updatePolicy: async (input) => {
      await busy(updateMs);
      return activities.updatePolicy(input);
    },
  };
}

const dir = mkdtempSync(join(tmpdir(), 'moerl-bench-fleet-'));
const cluster = await startKubeCluster({ kwok: true });
const core = cluster.kubeConfig().makeApiClient(CoreV1Api);
const apps = cluster.kubeConfig().makeApiClient(AppsV1Api);
const keda = await startKeda(cluster);
const t = await startTestEnvironment();
const stops: (() => Promise<void>)[] = [];
try {
  await workflowBundle();
  const queues = uniqueTaskQueues();
  const demand = await serveRolloutDemand(t.nativeConnection, t.namespace, queues);
  stops.push(() => demand.stop());

  // Prometheus scrapes a fixed list of ports that the rollout workers take as they start: a
  // worker is seen from its first scrape (1 s), not after a service discovery round (5 s).
  const metricsPorts: number[] = [];
  for (let i = 0; i < 2 * shards; i++) metricsPorts.push(await freePort());
  const prometheus = await startPrometheus(dir, [
    '  - job_name: moerl-rollout',
    `    static_configs: [{ targets: [${metricsPorts.map((p) => `'127.0.0.1:${p}'`).join(', ')}] }]`,
  ]);
  stops.push(() => prometheus.stop());

  const elastic = {
    pollingInterval: 1,
    cooldownPeriod: 5,
    maxReplicaCount: shards,
    scaleDown: { stabilizationWindowSeconds: 5, pods: 2, periodSeconds: 1 },
  };
  let nodeLabels: Record<string, string> | undefined;
  const activities = timedActivities();
  const results: Record<string, unknown>[] = [];
  for (const staleness of stalenesses)
    for (const mode of ['fixed', 'elastic'] as const) {
      const scenario = `${mode}-s${staleness}`;
      const namespace = await cluster.createNamespace(`fleet-${scenario}`);
      const rendered = await fleetObjects(
        namespace,
        mode === 'fixed' ? { fixedReplicas: shards } : { metricsUrl: demand.url, elastic },
      );
      if (!nodeLabels) {
        nodeLabels = rendered.nodeLabels;
        await cluster.addFakeNodes(2, nodeLabels);
      }
      const manifest = rendered.objects.map((o) => stringify(o)).join('---\n');
      const applied = await cluster.kubectl(['apply', '-f', '-'], { input: manifest });
      if (applied.code !== 0) throw new Error(`kubectl apply: ${applied.stderr}`);
      const fleet = rolloutFleet({
        cluster,
        core,
        namespace,
        temporal: { address: t.address, namespace: t.namespace },
        taskQueues: queues,
        activities,
        metricsPorts,
        log: (line) => log(`${scenario}: ${line}`),
      });
      try {
        // A fixed fleet runs before the campaign does: all of it scraped before it starts.
        if (mode === 'fixed')
          await waitFor(
            `Prometheus to scrape the fixed fleet's ${shards} workers`,
            async () =>
              (await prometheus.one(`count(moerl_rollout_rank_capacity)`)) === shards ? true : undefined,
            120_000,
            250,
          );
        // An elastic fleet starts at rest: KEDA in charge and no pod (the Deployment's first one gone).
        if (mode === 'elastic') {
          await scaledObjectReady(cluster, keda, namespace);
          await waitFor(
            'the elastic fleet at zero',
            async () =>
              (await rolloutReplicas(apps, namespace)) === 0 && fleet.live().length === 0 ? true : undefined,
            120_000,
            250,
          );
        }
        const started = Date.now();
        const id = await withWorkers(
          t.nativeConnection,
          t.namespace,
          activities,
          async () => {
            const spec = testSpec({
              name: `fleet-${scenario}`,
              iterations,
              rolloutShards: shards,
              rolloutEpWorldSize: 1,
              staleness,
            });
            const handle = await startCampaign(t.client, spec, queues);
            const result = await handle.result();
            if (result.status !== 'completed') throw new Error(`${scenario}: campaign ${result.status}`);
            return handle.workflowId;
          },
          queues,
          ['control', 'train'],
        );
        keda.assertRunning();
        log(`${scenario}: campaign ${id} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
        // Two more scrapes, so the fleet's last seconds inside the campaign are stored.
        await new Promise((r) => setTimeout(r, 2500));
        const { stdout } = await run(
          process.execPath,
          [
            join(repoRoot(), 'bin', 'moerl.js'),
            'report',
            id,
            '--address',
            t.address,
            '--namespace',
            t.namespace,
            '--out',
            join(dir, 'reports', scenario),
            '--rollout-price',
            values.price,
            '--prometheus',
            prometheus.url,
            '--fleet-selector',
            'job="moerl-rollout"',
            '--json',
          ],
          { maxBuffer: 64 << 20 },
        );
        const report = JSON.parse(stdout) as ReportDocument;
        const e = report.economics;
        // The same from the workers' own lives, cut to the campaign's wall time: what the
        // scrapes miss (a pod counts from its first scrape to its first failed one).
        const [from, to] = [Date.parse(report.header.startedAt), Date.parse(report.header.endedAt ?? '')];
        const lived = [...fleet.workers.values()].reduce(
          (sum, w) => sum + Math.max(0, Math.min(to, w.stoppedAt ?? to) - Math.max(from, w.startedAt)),
          0,
        );
        const f = e.fleet;
        if (!f) throw new Error(`${scenario}: moerl report printed no fleet figures`);
        const row = {
          scenario,
          staleness,
          fleet: mode,
          wallSeconds: Number(e.wallSeconds.toFixed(1)),
          podSeconds: f.podSeconds,
          podSecondsFromWorkers: Number((lived / 1000).toFixed(1)),
          meanPods: Number(f.meanPods.toFixed(2)),
          peakPods: f.peakPods,
          busyFraction: f.busyFraction === null ? null : Number(f.busyFraction.toFixed(3)),
          fleetCost: f.cost === null ? null : Number(f.cost.toFixed(4)),
          podsStarted: fleet.workers.size,
          chunksRedone: e.interruptions.chunksRedone,
        };
        log(JSON.stringify(row));
        results.push(row);
      } finally {
        await cluster.kubectl(['delete', '-f', '-', '--wait=false'], { input: manifest });
        await waitFor(
          `${scenario}: the fleet gone`,
          async () => ((await rolloutPods(core, namespace)).length === 0 ? true : undefined),
          120_000,
          250,
        ).catch(() => undefined);
        await fleet.stop();
      }
    }
  const byScenario = new Map(results.map((r) => [r.scenario as string, r]));
  const saved = Object.fromEntries(
    stalenesses.map((s) => {
      const [fixed, elastic] = [byScenario.get(`fixed-s${s}`), byScenario.get(`elastic-s${s}`)];
      return [
        `staleness${s}`,
        Number((1 - (elastic!.podSeconds as number) / (fixed!.podSeconds as number)).toFixed(3)),
      ];
    }),
  );
  console.log(
    JSON.stringify({
      bench: 'rollout_fleet',
      shards,
      iterations,
      rolloutSeconds: rolloutMs / 1000,
      updateSeconds: updateMs / 1000,
      nodeSecondsSaved: saved,
      scenarios: results,
    }),
  );
} finally {
  for (const stop of stops.reverse()) await stop().catch(() => undefined);
  await keda.stop();
  await t.teardown();
  await cluster.stop();
  rmSync(dir, { recursive: true, force: true });
}
