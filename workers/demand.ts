// The rollout fleet's demand, read from the campaigns' own state (docs/operations.md, "An
// elastic rollout fleet"): moe_generate ranks wanted = Σ over running campaigns of their
// rollout shards scheduled or running × the campaign's rolloutEpWorldSize, plus one for every
// other activity waiting for or running on the rollout queue (a reward batch needs a worker
// too). A control worker reads it every interval and exports it as moerl_rollout_ranks_wanted,
// the metric an autoscaler (KEDA) sizes the rollout Deployment by.
//
// Cost per read: one ListWorkflowExecutions page per 1000 running campaigns and one
// DescribeWorkflowExecution per campaign (server-side only: no workflow task, no replay), plus
// the first history event once per campaign run for its spec. No query is sent: a query is a
// workflow task on a control worker, which at 64+ campaigns would compete with the campaigns.
import { defaultPayloadConverter } from '@temporalio/common';
import type { NativeConnection } from '@temporalio/worker';
import { Counter, Gauge } from 'prom-client';
import type { Registry } from 'prom-client';
import { mapLimit } from '../activities/concurrency.js';
import type { CampaignInput, TaskQueues } from '../workflows/types.js';
import { activitiesByRole } from './worker.js';

type Service = NativeConnection['workflowService'];
/** The three calls the reader makes. */
export type DemandService = Pick<
  Service,
  'listWorkflowExecutions' | 'describeWorkflowExecution' | 'getWorkflowExecutionHistory'
>;

/** The gauge's name, which k8s/autoscaling's ScaledObject reads. */
export const rolloutRanksWantedMetric = 'moerl_rollout_ranks_wanted';

/** PendingActivityState wire numbers: scheduled, started, cancel requested (still running). */
const pendingStates = new Set([1, 2, 3]);
const rolloutActivities = new Set<string>(activitiesByRole.rollout);
/** Describes in flight at once. */
const describeConcurrency = 8;

/** Settings of the demand reader: MOERL_DEMAND_INTERVAL_SECONDS (default 10). */
export function demandIntervalMsFromEnv(env: NodeJS.ProcessEnv): number {
  const text = env.MOERL_DEMAND_INTERVAL_SECONDS?.trim() || '10';
  const seconds = Number(text);
  if (!Number.isFinite(seconds) || seconds < 0.1 || seconds > 3600)
    throw new Error(`MOERL_DEMAND_INTERVAL_SECONDS must be seconds from 0.1 to 3600, got "${text}"`);
  return seconds * 1000;
}

/**
 * Reads the rollout ranks wanted now, by the campaigns of `taskQueues` (their workflows run on
 * its control queue; other moerl installations in the namespace are not counted).
 */
export function rolloutDemandReader(
  service: DemandService,
  namespace: string,
  taskQueues: TaskQueues,
): () => Promise<number> {
  /** rolloutEpWorldSize by run id: a run's spec never changes (a new run re-reads it). */
  const worldSizes = new Map<string, number>();

  async function worldSizeOf(workflowId: string, runId: string): Promise<number> {
    const known = worldSizes.get(runId);
    if (known !== undefined) return known;
    const { history } = await service.getWorkflowExecutionHistory({
      namespace,
      execution: { workflowId, runId },
      maximumPageSize: 1,
    });
    const payload = history?.events?.[0]?.workflowExecutionStartedEventAttributes?.input?.payloads?.[0];
    if (!payload) throw new Error(`campaign ${workflowId} (run ${runId}): no start event with its input`);
    const input = defaultPayloadConverter.fromPayload<CampaignInput>(payload);
    // Specs of campaigns started before the field existed lack it: one rank, as their shards run.
    const size = input.spec.rolloutEpWorldSize ?? 1;
    worldSizes.set(runId, size);
    return size;
  }

  async function runningCampaigns(): Promise<{ workflowId: string; runId: string }[]> {
    const runs: { workflowId: string; runId: string }[] = [];
    let nextPageToken: Uint8Array | undefined;
    do {
      const page = await service.listWorkflowExecutions({
        namespace,
        query: `WorkflowType = 'campaign' AND ExecutionStatus = 'Running' AND TaskQueue = '${taskQueues.control}'`,
        pageSize: 1000,
        ...(nextPageToken ? { nextPageToken } : {}),
      });
      for (const e of page.executions ?? [])
        if (e.execution?.workflowId && e.execution.runId)
          runs.push({ workflowId: e.execution.workflowId, runId: e.execution.runId });
      nextPageToken = page.nextPageToken?.length ? page.nextPageToken : undefined;
    } while (nextPageToken);
    return runs;
  }

  return async () => {
    const runs = await runningCampaigns();
    const wanted = await mapLimit(runs, describeConcurrency, async ({ workflowId, runId }) => {
      const d = await service.describeWorkflowExecution({ namespace, execution: { workflowId, runId } });
      let ranks = 0;
      for (const p of d.pendingActivities ?? []) {
        const type = p.activityType?.name ?? '';
        // Servers before 1.27 do not show an activity's task queue: then its type says where it runs.
        const queue = p.activityOptions?.taskQueue?.name || undefined;
        const onRollout = queue === undefined ? rolloutActivities.has(type) : queue === taskQueues.rollout;
        if (!pendingStates.has(p.state ?? 0) || !onRollout) continue;
        ranks += type === 'rolloutShard' ? await worldSizeOf(workflowId, runId) : 1;
      }
      return ranks;
    });
    // Runs that ended (or continued as new) are forgotten.
    const live = new Set(runs.map((r) => r.runId));
    for (const runId of worldSizes.keys()) if (!live.has(runId)) worldSizes.delete(runId);
    return wanted.reduce((a, b) => a + b, 0);
  };
}

/**
 * Reads the demand now and then every `intervalMs` until `signal` aborts, into the gauge
 * moerl_rollout_ranks_wanted of `registry`. A read that fails keeps the last value (an outage
 * of the Temporal server must not scale the fleet in) and is counted and logged.
 */
export async function trackRolloutDemand(opts: {
  registry: Registry;
  read: () => Promise<number>;
  intervalMs: number;
  signal: AbortSignal;
  log?: (line: string) => void;
}): Promise<void> {
  const { registry, signal } = opts;
  const log = opts.log ?? ((line: string) => console.error(`moerl-worker: ${line}`));
  const gauge = new Gauge({
    name: rolloutRanksWantedMetric,
    help: 'moe_generate ranks the running campaigns want now: rollout shards scheduled or running × their rolloutEpWorldSize, plus 1 per other rollout-queue activity.',
    registers: [registry],
  });
  const readAt = new Gauge({
    name: 'moerl_rollout_demand_read_timestamp_seconds',
    help: 'When moerl_rollout_ranks_wanted was last read from the Temporal server (Unix time).',
    registers: [registry],
  });
  const failures = new Counter({
    name: 'moerl_rollout_demand_read_failures_total',
    help: 'Reads of the rollout demand that failed (the last value is kept).',
    registers: [registry],
  });
  while (!signal.aborted) {
    try {
      gauge.set(await opts.read());
      readAt.set(Date.now() / 1000);
    } catch (err) {
      if (signal.aborted) break; // the connection closed under the read at shutdown
      failures.inc();
      log(
        `reading the rollout demand failed (kept the last value): ${(err as Error).message ?? String(err)}`,
      );
    }
    await new Promise<void>((resolve) => {
      const onAbort = () => (clearTimeout(timer), resolve());
      const timer = setTimeout(
        () => (signal.removeEventListener('abort', onAbort), resolve()),
        opts.intervalMs,
      );
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }
}
