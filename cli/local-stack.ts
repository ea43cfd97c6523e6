// A whole moerl deployment in one process tree, for `moerl dev` and `moerl demo`: the Temporal
// dev server (SQLite under a state directory) and an all-role worker with the shipped
// activities. The body runs while both are up; then the worker stops first (activities flush),
// then the server.
import { join } from 'node:path';
import { connectWorkerConnection } from '../workers/temporal-options.js';
import type { MetricsServer } from '../workers/metrics.js';
import type { MetricsSettings } from '../workers/telemetry.js';
import type { TaskQueues } from '../workflows/types.js';
import { DevServerError, startDevServer } from './dev-server.js';
import type { DevServer } from './dev-server.js';
import { CliError } from './errors.js';

export interface LocalStackOptions {
  stateDir: string;
  namespace: string;
  taskQueues: TaskQueues;
  /** Frontend and UI ports; free ones when absent. */
  port?: number;
  uiPort?: number;
  shutdownGraceMs: number;
  /** Aborting it stops the worker and the server (the body should return too). */
  stop: AbortController;
  /** The worker's metrics ports, as the worker program's (docs/metrics.md); none when absent. */
  metrics?: MetricsSettings;
}

/** What the body is given: the server, and moerl's /metrics URL when it is served. */
export interface LocalStack {
  server: DevServer;
  metricsUrl?: string;
}

export async function withLocalStack<T>(
  opts: LocalStackOptions,
  body: (stack: LocalStack) => Promise<T>,
): Promise<T> {
  // The worker SDK, the activities and the workflow bundler load only when a stack starts:
  // main.ts imports every command, and `moerl list` must not pay for `moerl dev`'s worker.
  const [
    { Runtime },
    { workerActivityDeps },
    { createActivities },
    { runWorkers },
    { sdkRuntimeOptions, startWorkerMetrics },
  ] = await Promise.all([
    import('@temporalio/worker'),
    import('../activities/deps.js'),
    import('../activities/index.js'),
    import('../workers/worker.js'),
    import('../workers/telemetry.js'),
  ]);
  try {
    // Warnings and errors only: the worker's start-up chatter would bury the user's output.
    Runtime.install(
      sdkRuntimeOptions({
        logs: { level: 'WARN', write: (line) => console.error(line) },
        ...(opts.metrics ? { metrics: opts.metrics } : {}),
      }),
    );
  } catch {
    // A runtime already exists in this process (an embedding program installed its own); its
    // telemetry settings, not ours, decide whether the SDK's metrics are served.
  }
  let server: DevServer;
  try {
    server = await startDevServer({
      dbFile: join(opts.stateDir, 'temporal.db'),
      logFile: join(opts.stateDir, 'temporal.log'),
      namespace: opts.namespace,
      ...(opts.port === undefined ? {} : { port: opts.port }),
      ...(opts.uiPort === undefined ? {} : { uiPort: opts.uiPort }),
    });
  } catch (err) {
    if (err instanceof DevServerError) {
      const inUse = /address already in use/i.test(err.message) ? ' (port in use: try --port)' : '';
      throw new CliError(
        `the dev server did not start${inUse}: ${err.message.split('\n')[0]}; log: ${join(opts.stateDir, 'temporal.log')}`,
      );
    }
    throw err;
  }
  try {
    const connection = await connectWorkerConnection({ address: server.address, namespace: opts.namespace });
    const deps = workerActivityDeps(opts.stop.signal);
    let activities = createActivities(deps);
    let metricsServer: MetricsServer | undefined;
    try {
      if (opts.metrics?.port !== undefined) {
        const started = await startWorkerMetrics({
          connection,
          namespace: opts.namespace,
          activities,
          port: opts.metrics.port,
          host: opts.metrics.host,
          demand: {
            taskQueues: opts.taskQueues,
            intervalMs: opts.metrics.demandIntervalMs,
            signal: opts.stop.signal,
          },
          rolloutRanks: deps.rolloutRanks.capacity,
        });
        ({ activities, server: metricsServer } = started);
      }
      const workers = runWorkers({
        roles: ['all'],
        connection,
        namespace: opts.namespace,
        taskQueues: opts.taskQueues,
        activities,
        shutdownGraceMs: opts.shutdownGraceMs,
        signal: opts.stop.signal,
      });
      // A worker that dies ends the body's wait too.
      workers.catch(() => opts.stop.abort());
      try {
        return await body({ server, ...(metricsServer ? { metricsUrl: metricsServer.url } : {}) });
      } finally {
        opts.stop.abort();
        await workers;
      }
    } finally {
      await connection.close();
      await metricsServer?.close();
    }
  } finally {
    await server.stop();
  }
}

/**
 * SIGINT/SIGTERM stop `stop` gracefully (worker first, then server); a second signal exits at
 * once, for a shutdown that hangs. Returns the function that removes the handlers.
 */
export function stopOnSignals(
  stop: AbortController,
  command: string,
  note: (line: string) => void,
): () => void {
  const onSignal = (signal: NodeJS.Signals) => {
    if (stop.signal.aborted) {
      note(`moerl ${command}: second ${signal}, exiting without waiting`);
      process.exit(130);
    }
    note(`moerl ${command}: ${signal}, stopping the worker, then the server (again to exit at once)`);
    stop.abort();
  };
  const signals = ['SIGINT', 'SIGTERM'] as const;
  for (const s of signals) process.on(s, onSignal);
  return () => {
    for (const s of signals) process.off(s, onSignal);
  };
}
