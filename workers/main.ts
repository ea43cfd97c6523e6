// Worker process entrypoint: `node dist/workers/main.js --role rollout` (or MOERL_WORKER_ROLES).
// SIGTERM/SIGINT (a Spot notice, a pod deletion, Ctrl-C) starts a graceful shutdown: polling
// stops, in-flight activities get the grace period to flush, then the process exits.
import { parseArgs } from 'node:util';
import { Runtime } from '@temporalio/worker';
import { createActivities } from '../activities/index.js';
import { workerActivityDeps } from '../activities/deps.js';
import {
  apiKeyFlagWarning,
  connectWorkerConnection,
  taskQueuesFrom,
  temporalOptionsFrom,
} from './temporal-options.js';
import { createWorkerMetrics, hostPort, parsePort, serveMetrics } from './metrics.js';
import type { MetricsServer } from './metrics.js';
import { roles, runWorkers } from './worker.js';
import type { Role } from './worker.js';

const usage = `usage: moerl-worker [--role control|rollout|train|all]... [--shutdown-grace-seconds N]
                    [--address host:port] [--namespace NS] [--api-key-file FILE]
                    [--tls-cert FILE --tls-key FILE] [--tls-ca FILE] [--tls-server-name NAME]
                    [--metrics-port N] [--sdk-metrics-port N] [--metrics-host ADDR]
env: MOERL_WORKER_ROLES (comma list), MOERL_SHUTDOWN_GRACE_SECONDS, MOERL_TASK_QUEUE_PREFIX,
     MOERL_METRICS_PORT, MOERL_SDK_METRICS_PORT, MOERL_METRICS_HOST (default 127.0.0.1),
     TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_API_KEY_FILE, TEMPORAL_TLS_*
(--api-key KEY works too, but shows the key in the process list)`;

export function parseWorkerArgs(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  const { values } = parseArgs({
    args: argv,
    options: {
      role: { type: 'string', multiple: true },
      'shutdown-grace-seconds': { type: 'string' },
      address: { type: 'string' },
      namespace: { type: 'string' },
      'api-key': { type: 'string' },
      'api-key-file': { type: 'string' },
      'tls-cert': { type: 'string' },
      'tls-key': { type: 'string' },
      'tls-ca': { type: 'string' },
      'tls-server-name': { type: 'string' },
      'metrics-port': { type: 'string' },
      'sdk-metrics-port': { type: 'string' },
      'metrics-host': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  const requested = values.role ?? (env.MOERL_WORKER_ROLES ?? 'all').split(',').map((r) => r.trim());
  for (const r of requested)
    if (!(roles as readonly string[]).includes(r))
      throw new Error(`unknown role "${r}"; allowed: ${roles.join(', ')}`);
  const graceText = values['shutdown-grace-seconds'] ?? env.MOERL_SHUTDOWN_GRACE_SECONDS ?? '20';
  const graceSeconds = Number(graceText);
  if (!Number.isFinite(graceSeconds) || graceSeconds < 0)
    throw new Error(`shutdown grace must be a number of seconds ≥ 0, got "${graceText}"`);
  const port = (text: string | undefined, what: string) =>
    text === undefined || text === '' ? undefined : parsePort(text, what);
  return {
    help: values.help ?? false,
    /** moerl's metrics and the Temporal SDK's, each on its own port; off when no port is given. */
    metrics: {
      port: port(values['metrics-port'] ?? env.MOERL_METRICS_PORT, '--metrics-port (MOERL_METRICS_PORT)'),
      sdkPort: port(
        values['sdk-metrics-port'] ?? env.MOERL_SDK_METRICS_PORT,
        '--sdk-metrics-port (MOERL_SDK_METRICS_PORT)',
      ),
      host: values['metrics-host'] ?? env.MOERL_METRICS_HOST ?? '127.0.0.1',
    },
    roles: requested as Role[],
    shutdownGraceMs: graceSeconds * 1000,
    /** Lines for stderr before the worker starts. */
    warnings: values['api-key'] === undefined ? [] : [apiKeyFlagWarning],
    temporal: temporalOptionsFrom(
      {
        address: values.address,
        namespace: values.namespace,
        apiKey: values['api-key'],
        apiKeyFile: values['api-key-file'],
        tlsCert: values['tls-cert'],
        tlsKey: values['tls-key'],
        tlsCa: values['tls-ca'],
        tlsServerName: values['tls-server-name'],
      },
      env,
    ),
  };
}

async function main(): Promise<void> {
  const args = parseWorkerArgs(process.argv.slice(2));
  if (args.help) {
    console.log(usage);
    return;
  }
  for (const warning of args.warnings) console.error(`moerl-worker: ${warning}`);
  const { metrics } = args;
  // The process owns its signals: the SDK must not shut down on its own. The runtime is created
  // once, before any connection, so its metrics exporter is configured here.
  Runtime.install({
    shutdownSignals: [],
    ...(metrics.sdkPort === undefined
      ? {}
      : {
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
        }),
  });
  const stop = new AbortController();
  for (const sig of ['SIGTERM', 'SIGINT'] as const)
    process.once(sig, () => {
      console.error(`moerl-worker: ${sig}, shutting down (grace ${args.shutdownGraceMs / 1000}s)`);
      stop.abort();
    });
  let activities = createActivities(workerActivityDeps(stop.signal));
  let server: MetricsServer | undefined;
  if (metrics.port !== undefined) {
    const workerMetrics = createWorkerMetrics();
    activities = workerMetrics.instrument(activities);
    server = await serveMetrics(workerMetrics.registry, metrics.port, metrics.host);
    console.error(`moerl-worker: metrics at ${server.url}`);
  }
  const connection = await connectWorkerConnection(args.temporal);
  try {
    console.error(
      `moerl-worker: roles ${args.roles.join(',')} on ${args.temporal.address}/${args.temporal.namespace}`,
    );
    await runWorkers({
      roles: args.roles,
      connection,
      namespace: args.temporal.namespace,
      taskQueues: taskQueuesFrom(),
      activities,
      shutdownGraceMs: args.shutdownGraceMs,
      signal: stop.signal,
    });
  } finally {
    await connection.close();
    await server?.close();
  }
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].replace(/\\/g, '/'))) {
  main().catch((err: unknown) => {
    console.error(`moerl-worker: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  });
}
