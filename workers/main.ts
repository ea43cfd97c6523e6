// Worker process entrypoint: `node dist/workers/main.js --role rollout` (or MOERL_WORKER_ROLES).
// SIGTERM/SIGINT (a Spot notice, a pod deletion, Ctrl-C) starts a graceful shutdown: polling
// stops, in-flight activities get the grace period to flush, then the process exits.
import { parseArgs } from 'node:util';
import { Runtime } from '@temporalio/worker';
import { createActivities } from '../activities/index.js';
import { workerActivityDeps } from '../activities/deps.js';
import { rolloutRankCapacity, rolloutRanksEnv } from '../activities/rollout-capacity.js';
import {
  apiKeyFlagWarning,
  connectWorkerConnection,
  taskQueuesFrom,
  temporalOptionsFrom,
} from './temporal-options.js';
import { parsePort } from './metrics.js';
import type { MetricsServer } from './metrics.js';
import { demandIntervalMsFromEnv } from './demand.js';
import { podBusyMarker, podFromEnv } from './pod-deletion-cost.js';
import { sdkRuntimeOptions, startWorkerMetrics } from './telemetry.js';
import { campaignEndedFrom, runSweeper, sweepSettingsFromEnv } from './sweeper.js';
import { expandRoles, roles, runWorkers } from './worker.js';
import type { Role, WorkerDeployment } from './worker.js';

const usage = `usage: moerl-worker [--role control|rollout|train|all]... [--shutdown-grace-seconds N]
                    [--address host:port] [--namespace NS] [--api-key-file FILE]
                    [--tls-cert FILE --tls-key FILE] [--tls-ca FILE] [--tls-server-name NAME]
                    [--metrics-port N] [--sdk-metrics-port N] [--metrics-host ADDR]
                    [--deployment-name NAME --build-id ID]   (Worker Versioning; unversioned without)
                    [--rollout-ranks N]   (moe_generate ranks at once; default the CPUs it may use)
env: MOERL_WORKER_ROLES (comma list), MOERL_SHUTDOWN_GRACE_SECONDS, MOERL_TASK_QUEUE_PREFIX,
     MOERL_ROLLOUT_RANKS, MOERL_SWEEP_NAMESPACES, MOERL_SWEEP_INTERVAL_SECONDS (control: trainer Jobs of ended campaigns),
     TEMPORAL_DEPLOYMENT_NAME, TEMPORAL_WORKER_BUILD_ID,
     MOERL_METRICS_PORT, MOERL_SDK_METRICS_PORT, MOERL_METRICS_HOST (default 127.0.0.1),
     MOERL_DEMAND_INTERVAL_SECONDS (control with metrics: rollout demand read every N s, default 10),
     MOERL_POD_NAME, MOERL_POD_NAMESPACE (rollout in a pod: marks it busy for scale-in),
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
      'deployment-name': { type: 'string' },
      'build-id': { type: 'string' },
      'rollout-ranks': { type: 'string' },
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
      demandIntervalMs: demandIntervalMsFromEnv(env),
    },
    roles: requested as Role[],
    deployment: workerDeploymentFrom(values['deployment-name'], values['build-id'], env),
    shutdownGraceMs: graceSeconds * 1000,
    /** moe_generate ranks this worker's rollout shards run at once (activities/rollout-capacity.ts). */
    rolloutRanks: rolloutRankCapacity(
      values['rollout-ranks'] ?? env[rolloutRanksEnv],
      `--rollout-ranks (${rolloutRanksEnv})`,
    ),
    /** The worker's own pod, which a rollout worker marks busy or idle (workers/pod-deletion-cost.ts). */
    pod: podFromEnv(env),
    /** Namespaces whose trainer Jobs of ended campaigns a control worker deletes, and how often. */
    sweep: sweepSettingsFromEnv(env),
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

/** Both names or neither: a build id without its deployment (or the reverse) is a mistake. */
export function workerDeploymentFrom(
  nameFlag: string | undefined,
  buildIdFlag: string | undefined,
  env: NodeJS.ProcessEnv,
): WorkerDeployment | undefined {
  const deploymentName = nameFlag ?? (env.TEMPORAL_DEPLOYMENT_NAME || undefined);
  const buildId = buildIdFlag ?? (env.TEMPORAL_WORKER_BUILD_ID || undefined);
  if (deploymentName === undefined && buildId === undefined) return undefined;
  if (deploymentName === undefined || buildId === undefined)
    throw new Error(
      'Worker Versioning needs both --deployment-name (TEMPORAL_DEPLOYMENT_NAME) and --build-id (TEMPORAL_WORKER_BUILD_ID)',
    );
  if (!/^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$/.test(deploymentName))
    throw new Error(
      `--deployment-name must be letters, digits, "-" or "_" (at most 100), got "${deploymentName}"`,
    );
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(buildId))
    throw new Error(`--build-id must be letters, digits, ".", "-" or "_" (at most 128), got "${buildId}"`);
  return { deploymentName, buildId };
}

async function main(): Promise<void> {
  const args = parseWorkerArgs(process.argv.slice(2));
  if (args.help) {
    console.log(usage);
    return;
  }
  for (const warning of args.warnings) console.error(`moerl-worker: ${warning}`);
  const { metrics } = args;
  // The runtime is created once, before any connection, so its logs and metrics are set here.
  Runtime.install(
    sdkRuntimeOptions({
      logs: { level: 'INFO', write: (line) => console.error(`moerl-worker: ${line}`) },
      metrics,
    }),
  );
  const stop = new AbortController();
  for (const sig of ['SIGTERM', 'SIGINT'] as const)
    process.once(sig, () => {
      console.error(`moerl-worker: ${sig}, shutting down (grace ${args.shutdownGraceMs / 1000}s)`);
      stop.abort();
    });
  let activities = createActivities(
    workerActivityDeps(stop.signal, { ...process.env, [rolloutRanksEnv]: String(args.rolloutRanks) }),
  );
  const connection = await connectPatiently(args.temporal, stop.signal);
  if (!connection) return; // stopped before the server was reachable
  let server: MetricsServer | undefined;
  try {
    if (metrics.port !== undefined) {
      const started = await startWorkerMetrics({
        connection,
        namespace: args.temporal.namespace,
        activities,
        port: metrics.port,
        host: metrics.host,
        // The control worker exports the rollout fleet's demand (workers/demand.ts).
        ...(expandRoles(args.roles).includes('control')
          ? {
              demand: {
                taskQueues: taskQueuesFrom(),
                intervalMs: metrics.demandIntervalMs,
                signal: stop.signal,
              },
            }
          : {}),
        ...(expandRoles(args.roles).includes('rollout') ? { rolloutRanks: args.rolloutRanks } : {}),
      });
      ({ activities, server } = started);
      console.error(`moerl-worker: metrics at ${server.url}`);
    }
    // A scale-in deletes idle rollout pods first, pods mid-shard last.
    if (args.pod && expandRoles(args.roles).includes('rollout'))
      activities = podBusyMarker({ pod: args.pod }).instrument(activities);
    const build = args.deployment
      ? `build ${args.deployment.deploymentName}:${args.deployment.buildId}`
      : 'unversioned';
    const ranks = expandRoles(args.roles).includes('rollout') ? `, ${args.rolloutRanks} rollout ranks` : '';
    console.error(
      `moerl-worker: roles ${args.roles.join(',')} on ${args.temporal.address}/${args.temporal.namespace}, ${build}${ranks}`,
    );
    // The control worker deletes trainer Jobs of ended campaigns (workers/sweeper.ts).
    const { namespace } = args.temporal;
    const sweeping = expandRoles(args.roles).includes('control')
      ? runSweeper({
          settings: args.sweep,
          signal: stop.signal,
          campaignEnded: campaignEndedFrom((workflowId) =>
            connection.workflowService.describeWorkflowExecution({ namespace, execution: { workflowId } }),
          ),
        })
      : Promise.resolve();
    await runWorkers({
      roles: args.roles,
      connection,
      namespace: args.temporal.namespace,
      taskQueues: taskQueuesFrom(),
      activities,
      shutdownGraceMs: args.shutdownGraceMs,
      signal: stop.signal,
      rolloutRanks: args.rolloutRanks,
      ...(args.deployment ? { deployment: args.deployment } : {}),
    }).finally(() => stop.abort());
    await sweeping;
  } finally {
    await connection.close();
    await server?.close();
  }
}

// Refused, reset, unresolvable or silent: the server is not there yet (or restarting); bad
// credentials, TLS settings or namespaces are not waited out.
const unreachable = /connection refused|tcp connect error|connection reset|dns error|unavailable|timed out/i;

/**
 * A worker started while its Temporal server is down (started together with it, or during a
 * restart) waits for it, retrying every 0.5 s doubling to 10 s, instead of exiting; null when
 * stopped (SIGTERM) before it connected.
 */
async function connectPatiently(
  opts: Parameters<typeof connectWorkerConnection>[0],
  signal: AbortSignal,
): Promise<Awaited<ReturnType<typeof connectWorkerConnection>> | null> {
  for (let waitMs = 500; ; waitMs = Math.min(waitMs * 2, 10_000)) {
    try {
      return await connectWorkerConnection(opts);
    } catch (err) {
      const reason = err instanceof Error ? err.message : String(err);
      if (!unreachable.test(reason)) throw err;
      console.error(
        `moerl-worker: Temporal at ${opts.address} unreachable (${reason}); retrying in ${waitMs / 1000}s`,
      );
    }
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, waitMs);
      signal.addEventListener('abort', () => (clearTimeout(timer), resolve(undefined)), { once: true });
    });
    if (signal.aborted) return null;
  }
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].replace(/\\/g, '/'))) {
  main().catch((err: unknown) => {
    console.error(`moerl-worker: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  });
}
