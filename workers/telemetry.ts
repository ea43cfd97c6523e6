// A worker process's metrics, the same for the worker program (workers/main.ts) and the local
// stack of `moerl dev` (cli/local-stack.ts): moerl's /metrics on one port, the Temporal SDK's
// Prometheus exporter on another (docs/metrics.md).
import type { NativeConnection, RuntimeOptions } from '@temporalio/worker';
import { Gauge } from 'prom-client';
import type { CampaignActivities } from '../activities/types.js';
import type { TaskQueues } from '../workflows/types.js';
import { rolloutDemandReader, trackRolloutDemand } from './demand.js';
import { createWorkerMetrics, hostPort, serveMetrics } from './metrics.js';
import type { MetricsServer } from './metrics.js';

export interface MetricsSettings {
  /** moerl's /metrics; off when absent. */
  port?: number;
  /** The Temporal SDK's metrics; off when absent. */
  sdkPort?: number;
  /** The address both bind. */
  host: string;
  /** How often a control worker reads the rollout demand (workers/demand.ts). */
  demandIntervalMs: number;
}

/** The runtime's telemetry options for the SDK's exporter (Runtime.install, before any connection). */
export function sdkTelemetryOptions(metrics: MetricsSettings): Pick<RuntimeOptions, 'telemetryOptions'> {
  if (metrics.sdkPort === undefined) return {};
  return {
    telemetryOptions: {
      metrics: {
        prometheus: {
          bindAddress: hostPort(metrics.host, metrics.sdkPort),
          // Prometheus conventions: `_total` counters, durations in seconds with the unit in the name.
          countersTotalSuffix: true,
          unitSuffix: true,
          useSecondsForDurations: true,
        },
      },
    },
  };
}

/**
 * Serves moerl's metrics of `activities` (measured from now on: use the returned ones) at
 * `port`. Retry reasons and campaign statuses are what the server recorded, read on `connection`.
 * With `demand` (a control worker) it also reads the rollout fleet's demand until `signal` aborts.
 */
export async function startWorkerMetrics(opts: {
  connection: NativeConnection;
  namespace: string;
  activities: CampaignActivities;
  port: number;
  host: string;
  demand?: { taskQueues: TaskQueues; intervalMs: number; signal: AbortSignal };
  /** A rollout worker's rank capacity, exported beside the demand it answers. */
  rolloutRanks?: number;
}): Promise<{ activities: CampaignActivities; server: MetricsServer }> {
  const { connection, namespace, demand } = opts;
  const workerMetrics = createWorkerMetrics((workflowId, runId) =>
    connection.workflowService.describeWorkflowExecution({ namespace, execution: { workflowId, runId } }),
  );
  const activities = workerMetrics.instrument(opts.activities);
  if (opts.rolloutRanks !== undefined)
    new Gauge({
      name: 'moerl_rollout_rank_capacity',
      help: 'moe_generate ranks this rollout worker runs at once (MOERL_ROLLOUT_RANKS).',
      registers: [workerMetrics.registry],
    }).set(opts.rolloutRanks);
  if (demand)
    void trackRolloutDemand({
      registry: workerMetrics.registry,
      read: rolloutDemandReader(connection.workflowService, namespace, demand.taskQueues),
      intervalMs: demand.intervalMs,
      signal: demand.signal,
    });
  const server = await serveMetrics(workerMetrics.registry, opts.port, opts.host);
  return { activities, server };
}
