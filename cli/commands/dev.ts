// `moerl dev`: a local Temporal dev server (SQLite under the state directory) and an all-role
// worker in one process tree. Ctrl-C or SIGTERM stops the worker first (activities flush),
// then the server.
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
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

export const devCommand: Command = {
  name: 'dev',
  summary: 'run a local Temporal dev server and an all-role worker until Ctrl-C',
  usage: 'dev [--state-dir DIR] [--port N] [--ui-port N] [--shutdown-grace-seconds N]',
  options: {
    'state-dir': { type: 'string' },
    port: { type: 'string' },
    'ui-port': { type: 'string' },
    'shutdown-grace-seconds': { type: 'string' },
  },
  optionHelp: {
    '--state-dir DIR': 'where the server keeps its SQLite database and log (default .moerl/dev)',
    '--port N': 'frontend port on 127.0.0.1 (default 7233, the address other commands use by default)',
    '--ui-port N': 'web UI port (default: port + 1000)',
    '--shutdown-grace-seconds N': 'how long running activities get to finish on Ctrl-C (default 10)',
  },
  details: `Campaigns survive restarts: the server's database is in the state directory.
The worker polls the control, rollout and train task queues (with MOERL_TASK_QUEUE_PREFIX).`,
  positionals: { min: 0, max: 0 },
  async run(ctx: CommandContext) {
    const stateDir = resolve(ctx.string('state-dir') ?? join('.moerl', 'dev'));
    const frontendPort = port('port', ctx.string('port') ?? '7233');
    const uiPort = port('ui-port', ctx.string('ui-port') ?? String(Math.min(frontendPort + 1000, 65535)));
    const graceText = ctx.string('shutdown-grace-seconds') ?? '10';
    const graceSeconds = Number(graceText);
    if (!Number.isFinite(graceSeconds) || graceSeconds < 0)
      throw new UsageError(`--shutdown-grace-seconds must be a number ≥ 0, got "${graceText}"`);
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
        },
        async (server) => {
          const ready = { address: server.address, uiUrl: server.uiUrl, namespace, stateDir, taskQueues };
          ctx.print(ready, () =>
            [
              `Temporal dev server  ${server.address} (namespace ${namespace})`,
              `web UI               ${server.uiUrl}`,
              `state                ${stateDir}`,
              `worker               all roles on ${taskQueues.control}, ${taskQueues.rollout}, ${taskQueues.train}`,
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
