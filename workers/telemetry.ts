// A worker process's telemetry, the same for the worker program (workers/main.ts) and the local
// stack of `moerl dev` (cli/local-stack.ts): moerl's /metrics on one port, the Temporal SDK's
// Prometheus exporter on another (docs/metrics.md), and the SDK's log lines, its Rust core's
// included, written by the process's own logger at the level each deserves.
import { DefaultLogger } from '@temporalio/worker';
import type { LogEntry, LogLevel, NativeConnection, RuntimeOptions } from '@temporalio/worker';
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

/** Where the SDK's log lines go: those at `level` or above, each through `write`. */
export interface SdkLogSettings {
  level: LogLevel;
  write: (line: string) => void;
}

const severity: Record<LogLevel, number> = { TRACE: 0, DEBUG: 1, INFO: 2, WARN: 3, ERROR: 4 };

// What the SDK reports as a warning but is expected in moerl's use and asks nothing of anyone:
// a query's answer that found the query gone (the asking client's deadline passed, or the
// workflow task moved on; the client asks again), and the roles that run no workflows by design.
const expectedWarnings = [/^Query not found when attempting to respond to it/, /^No workflows registered/];

/** The level an SDK log entry is written at: its own, but expected warnings are debug lines. */
export function sdkLogLevel(entry: Pick<LogEntry, 'level' | 'message'>): LogLevel {
  return entry.level === 'WARN' && expectedWarnings.some((pattern) => pattern.test(entry.message))
    ? 'DEBUG'
    : entry.level;
}

/** One log line: `[LEVEL] message key=value ...`, the entry's fields (the core's error among them) included. */
export function formatSdkLog(level: LogLevel, entry: Pick<LogEntry, 'message' | 'meta'>): string {
  const fields = Object.entries(entry.meta ?? {})
    .filter(([key]) => key !== 'sdkComponent' && key !== 'target')
    .map(([key, value]) => `${key}=${typeof value === 'string' ? value : JSON.stringify(value)}`);
  return [`[${level}] ${entry.message}`, ...fields].join(' ');
}

/**
 * The options of the process's one SDK runtime (Runtime.install, before any connection): the
 * process owns its signals; the core's log lines are forwarded to the SDK's logger (not printed
 * by the core itself) and written as `logs` says; with `metrics.sdkPort`, the SDK's Prometheus
 * exporter.
 */
export function sdkRuntimeOptions(opts: { logs: SdkLogSettings; metrics?: MetricsSettings }): RuntimeOptions {
  const { logs, metrics } = opts;
  const logger = new DefaultLogger('TRACE', (entry) => {
    const level = sdkLogLevel(entry);
    if (severity[level] >= severity[logs.level]) logs.write(formatSdkLog(level, entry));
  });
  const threshold = severity[logs.level] >= severity.WARN ? 'WARN' : logs.level;
  return {
    shutdownSignals: [],
    logger,
    telemetryOptions: {
      logging: { forward: {}, filter: { core: threshold, other: 'ERROR' } },
      ...(metrics?.sdkPort === undefined
        ? {}
        : {
            metrics: {
              prometheus: {
                bindAddress: hostPort(metrics.host, metrics.sdkPort),
                // Prometheus conventions: `_total` counters, durations in seconds with the unit in the name.
                countersTotalSuffix: true,
                unitSuffix: true,
                useSecondsForDurations: true,
              },
            },
          }),
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
