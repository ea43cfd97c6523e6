// Control-plane overhead: a campaign of many iterations × shards whose activities do nothing,
// on the local dev server. Reports, from the workflow histories of every run:
//   - schedule-to-start latency per activity (server dispatch + worker poll),
//   - decision latency (a stage's activity completing → the next stage's activity scheduled),
//   - history events per iteration, wall time per iteration, and the number of runs.
// Usage: node dist/bench/control-plane.js [--iterations 200] [--shards 8] [--json]
import { parseArgs } from 'node:util';
import { Runtime, DefaultLogger } from '@temporalio/worker';
import type { temporal } from '@temporalio/proto';
import { startDevServer } from '../cli/dev-server.js';
import { createRecordingTestActivities } from '../test/support/recording-activities.js';
import { startCampaign, testSpec, withWorkers } from '../test/support/campaign-harness.js';
import { connectDevServer } from './support/dev-server.js';
import { median } from './support/stats.js';

type HistoryEvent = temporal.api.history.v1.IHistoryEvent;

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '200' },
    shards: { type: 'string', default: '8' },
    json: { type: 'boolean', default: false },
  },
});
const iterations = Number(values.iterations);
const shards = Number(values.shards);

const millis = (t: HistoryEvent['eventTime']) =>
  t ? Number(t.seconds ?? 0) * 1000 + Math.floor((t.nanos ?? 0) / 1e6) : Number.NaN;
const p95 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * 0.95)] ?? Number.NaN;

Runtime.install({ logger: new DefaultLogger('ERROR') });
const server = await startDevServer();
try {
  const connections = await connectDevServer(server);
  const { client, workerConnection } = connections;
  const { activities } = createRecordingTestActivities();
  const spec = testSpec({ iterations, rolloutShards: shards, promptsPerIteration: shards * 4 });
  const started = Date.now();
  const workflowId = await withWorkers(workerConnection, server.namespace, activities, async (queues) => {
    const handle = await startCampaign(client, spec, queues);
    await client.workflow.getHandle(handle.workflowId).result();
    return handle.workflowId;
  });
  const wallMs = Date.now() - started;

  const scheduleToStart: Record<string, number[]> = {};
  const decision: number[] = [];
  let events = 0;
  let runs = 0;
  for await (const run of client.workflow.list({ query: `WorkflowId = '${workflowId}'` })) {
    runs++;
    const history = await client.workflow.getHandle(workflowId, run.runId).fetchHistory();
    const all = history.events ?? [];
    events += all.length;
    const scheduled = new Map<number, { type: string; at: number }>();
    let lastCompletedAt: number | null = null;
    for (const e of all) {
      const at = millis(e.eventTime);
      const sch = e.activityTaskScheduledEventAttributes;
      if (sch) {
        const type = sch.activityType?.name ?? '?';
        scheduled.set(Number(e.eventId), { type, at });
        if (lastCompletedAt !== null) decision.push(at - lastCompletedAt);
        lastCompletedAt = null;
      }
      const st = e.activityTaskStartedEventAttributes;
      if (st) {
        const s = scheduled.get(Number(st.scheduledEventId));
        if (s) (scheduleToStart[s.type] ??= []).push(at - s.at);
      }
      if (e.activityTaskCompletedEventAttributes) lastCompletedAt = at;
    }
  }
  const result = {
    iterations,
    shards,
    runs,
    wall_s: wallMs / 1000,
    wall_ms_per_iteration: wallMs / iterations,
    events_per_iteration: events / iterations,
    decision_latency_ms: { median: median(decision), p95: p95(decision) },
    schedule_to_start_ms: Object.fromEntries(
      Object.entries(scheduleToStart).map(([k, v]) => [k, { median: median(v), p95: p95(v), n: v.length }]),
    ),
  };
  if (values.json) console.log(JSON.stringify(result));
  else console.log(JSON.stringify(result, null, 2));
  await connections.close();
} finally {
  await server.stop();
}
