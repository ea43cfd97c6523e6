// `moerl dev`: a local Temporal dev server (SQLite under the state directory) and an all-role
// worker in one process tree. Ctrl-C or SIGTERM stops the worker first (activities flush),
// then the server.
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { demandIntervalMsFromEnv } from '../../workers/demand.js';
import { hostPort, parsePort } from '../../workers/metrics.js';
import { taskQueuesFrom } from '../../workers/temporal-options.js';
import type { Command, CommandContext } from '../command.js';
import { UsageError } from '../errors.js';
import { stopOnSignals, withLocalStack } from '../local-stack.js';

function port(name: string, text: string): number {
  const value = Number(text);
  if (!Number.isInteger(value) || value < 1 || value > 65535)
    throw new UsageError(`--${name} must be a TCP port (1-65535), got "${text}"`);
  return value;
}

const optional = <K extends string, V>(key: K, value: V | undefined) =>
  (value === undefined ? {} : { [key]: value }) as Partial<Record<K, V>>;

function demandInterval(env: NodeJS.ProcessEnv): number {
  try {
    return demandIntervalMsFromEnv(env);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** A metrics port as the worker program takes it (0: any free port). */
function metricsPort(name: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  try {
    return parsePort(text, `--${name}`);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

export const devCommand: Command = {
  name: 'dev',
  summary: 'run a local Temporal dev server and an all-role worker until Ctrl-C',
  usage:
    'dev [--state-dir DIR] [--port N] [--ui-port N] [--shutdown-grace-seconds N] [--metrics-port N] [--sdk-metrics-port N] [--metrics-host ADDR]',
  options: {
    'state-dir': { type: 'string' },
    port: { type: 'string' },
    'ui-port': { type: 'string' },
    'shutdown-grace-seconds': { type: 'string' },
    'metrics-port': { type: 'string' },
    'sdk-metrics-port': { type: 'string' },
    'metrics-host': { type: 'string' },
  },
  optionHelp: {
    '--state-dir DIR': 'where the server keeps its SQLite database and log (default .moerl/dev)',
    '--port N': 'frontend port on 127.0.0.1 (default 7233, the address other commands use by default)',
    '--ui-port N': 'web UI port (default: port + 1000)',
    '--shutdown-grace-seconds N': 'how long running activities get to finish on Ctrl-C (default 10)',
    '--metrics-port N':
      "serve the worker's Prometheus metrics at /metrics on this port (0: a free one; default off)",
    '--sdk-metrics-port N': "serve the Temporal SDK's Prometheus metrics on this port (default off)",
    '--metrics-host ADDR': 'address the metrics ports bind (default 127.0.0.1)',
  },
  details: `Campaigns survive restarts: the server's database is in the state directory.
The worker polls the control, rollout and train task queues (with MOERL_TASK_QUEUE_PREFIX).
With --metrics-port it serves the metrics a cluster's workers do (docs/metrics.md).`,
  positionals: { min: 0, max: 0 },
  async run(ctx: CommandContext) {
    const stateDir = resolve(ctx.string('state-dir') ?? join('.moerl', 'dev'));
    const frontendPort = port('port', ctx.string('port') ?? '7233');
    const uiPort = port('ui-port', ctx.string('ui-port') ?? String(Math.min(frontendPort + 1000, 65535)));
    const graceText = ctx.string('shutdown-grace-seconds') ?? '10';
    const graceSeconds = Number(graceText);
    if (!Number.isFinite(graceSeconds) || graceSeconds < 0)
      throw new UsageError(`--shutdown-grace-seconds must be a number ≥ 0, got "${graceText}"`);
    const metrics = {
      ...optional('port', metricsPort('metrics-port', ctx.string('metrics-port'))),
      ...optional('sdkPort', metricsPort('sdk-metrics-port', ctx.string('sdk-metrics-port'))),
      host: ctx.string('metrics-host') ?? '127.0.0.1',
      demandIntervalMs: demandInterval(ctx.io.env),
    };
    const namespace = ctx.temporal().namespace;
    const taskQueues = taskQueuesFrom(ctx.io.env);
    mkdirSync(stateDir, { recursive: true });

    // This process owns its signals: stop the worker first, then the server.
    const stop = new AbortController();
    const removeSignalHandlers = stopOnSignals(stop, 'dev', (line) => ctx.note(line));
    ctx.io.signal?.addEventListener('abort', () => stop.abort(), { once: true });
    try {
      await withLocalStack(
        {
          stateDir,
          namespace,
          taskQueues,
          port: frontendPort,
          uiPort,
          shutdownGraceMs: graceSeconds * 1000,
          stop,
          metrics,
        },
        async ({ server, metricsUrl }) => {
          const ready = {
            address: server.address,
            uiUrl: server.uiUrl,
            namespace,
            stateDir,
            taskQueues,
            ...optional('metricsUrl', metricsUrl),
          };
          ctx.print(ready, () =>
            [
              `Temporal dev server  ${server.address} (namespace ${namespace})`,
              `web UI               ${server.uiUrl}`,
              `state                ${stateDir}`,
              `worker               all roles on ${taskQueues.control}, ${taskQueues.rollout}, ${taskQueues.train}`,
              ...(metricsUrl ? [`metrics              ${metricsUrl}`] : []),
              ...(metrics.sdkPort === undefined
                ? []
                : [`SDK metrics          http://${hostPort(metrics.host, metrics.sdkPort)}/metrics`]),
              'Ctrl-C stops the worker, then the server.',
            ].join('\n'),
          );
          if (!stop.signal.aborted)
            await new Promise((resolve) => stop.signal.addEventListener('abort', resolve, { once: true }));
        },
      );
      ctx.note('moerl dev: stopped');
    } finally {
      removeSignalHandlers();
    }
  },
};
