// The cluster tier's fault matrix (test/integration/temporal-cluster.test.ts runs one seed per
// kind): the chaos campaign on a Temporal cluster of separate services on PostgreSQL
// (test/support/temporal-cluster.ts), a fault-free run, then every fault kind of
// test/support/cluster-faults.ts with S seeds, each struck while a rollout or an update runs.
// A trial passes when its final checkpoint equals the fault-free run's, file by file (sha256).
// Prints, per kind, trials passed, campaign time against the fault-free run's, what was in
// flight, the work redone, and the events the cluster recorded while the target was down; and
// the fault-free campaign's history figures (events and bytes per run, largest payload).
// Usage: node dist/bench/temporal_cluster.js [--seeds 3] [--seed 1]
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { openStore } from '../activities/store/index.js';
import {
  chaosSpec,
  checkpointDigests,
  clusterTemporal,
  runTrial,
  startChaosStack,
  type LostWork,
} from '../test/support/chaos.js';
import {
  clusterFaultKinds,
  clusterFaultTrial,
  type ClusterFaultKind,
} from '../test/support/cluster-faults.js';
import { startTemporalCluster } from '../test/support/temporal-cluster.js';
import { campaignHistory } from './scale/history.js';
import { median } from './support/stats.js';

const { values } = parseArgs({
  options: { seeds: { type: 'string', default: '3' }, seed: { type: 'string', default: '1' } },
});
const seeds = Number(values.seeds);
const firstSeed = Number(values.seed);
for (const [name, v] of Object.entries({ seeds, seed: firstSeed }))
  if (!Number.isInteger(v) || v < 0)
    throw new Error(`temporal_cluster bench: --${name} must be an integer ≥ 0`);

Runtime.install({ logger: new DefaultLogger('ERROR'), shutdownSignals: [] });
// Exiting runs the harness's exit handlers, which stop the cluster and the worker groups.
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => process.exit(130));
const dir = mkdtempSync(join(tmpdir(), 'moerl-cluster-bench-'));
const cluster = await startTemporalCluster(join(dir, 'temporal'));
const stack = await startChaosStack(join(dir, 'stack'), {}, clusterTemporal(cluster));
const store = openStore(chaosSpec('x', dir).store);

interface KindResult {
  trials: number;
  identical: number;
  wallMs: number[];
  downMs: number[];
  eventsWhileDown: number[];
  inFlight: Record<string, number>;
  hit: Record<string, number>;
  lost: LostWork;
}

try {
  const reference = await runTrial(stack, chaosSpec('cluster-bench-reference', dir), [], 300_000);
  const iterations = reference.state.committedIteration;
  const want = JSON.stringify(await checkpointDigests(store, reference.campaignId, iterations));
  const history = await campaignHistory(cluster.client, reference.campaignId);
  const results = {} as Record<ClusterFaultKind, KindResult>;
  for (const kind of clusterFaultKinds) {
    const r: KindResult = {
      trials: 0,
      identical: 0,
      wallMs: [],
      downMs: [],
      eventsWhileDown: [],
      inFlight: {},
      hit: {},
      lost: { activityRetries: 0, workflowTaskTimeouts: 0, workflowTaskFailures: 0 },
    };
    for (let seed = firstSeed; seed < firstSeed + seeds; seed++) {
      const trial = await clusterFaultTrial(stack, kind, seed, reference, dir);
      r.trials++;
      const got = JSON.stringify(await checkpointDigests(store, trial.outcome.campaignId, iterations));
      if (got === want && trial.outcome.state.committedIteration === iterations) r.identical++;
      r.wallMs.push(trial.outcome.wallMs);
      r.downMs.push(trial.fault.backAt - trial.fault.struckAt);
      r.eventsWhileDown.push(trial.servedWhileDown);
      for (const w of trial.fault.inFlight) r.inFlight[w] = (r.inFlight[w] ?? 0) + 1;
      r.hit[trial.fault.hit] = (r.hit[trial.fault.hit] ?? 0) + 1;
      for (const k of Object.keys(r.lost) as (keyof LostWork)[]) r.lost[k] += trial.outcome.lost[k];
      console.error(`${kind} seed ${seed}: ${trial.summary}`);
    }
    results[kind] = r;
  }
  console.log(
    JSON.stringify({
      bench: 'temporal_cluster',
      seeds: [firstSeed, firstSeed + seeds - 1],
      shards: cluster.numHistoryShards,
      fault_free_ms: reference.wallMs,
      history: {
        runs: history.runs.map((run) => ({ events: run.events, bytes: run.bytes })),
        largest_payload: history.largestPayload,
        max_pending_activities: history.maxPendingActivities,
      },
      kinds: Object.fromEntries(
        Object.entries(results).map(([kind, r]) => [
          kind,
          {
            identical: `${r.identical}/${r.trials}`,
            median_ms: median(r.wallMs),
            max_ms: Math.max(...r.wallMs),
            median_down_ms: median(r.downMs),
            median_events_while_down: median(r.eventsWhileDown),
            in_flight: r.inFlight,
            hit: r.hit,
            lost: r.lost,
          },
        ]),
      ),
      unexpected_worker_exits: stack.unexpectedExits,
    }),
  );
} finally {
  await stack.stop();
  rmSync(dir, { recursive: true, force: true });
}
