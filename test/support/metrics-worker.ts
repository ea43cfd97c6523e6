// The worker program as users start it, with both metrics ports on 127.0.0.1, and an HTTP reward
// model whose rewards differ within every group: what the metrics tests run a campaign with.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../cli/dev-server.js';
import type { TaskQueues } from '../../workflows/types.js';
import { spawnGroup, waitUntilReady } from './process-group.js';
import type { GroupProcess } from './process-group.js';

const workerMain = fileURLToPath(new URL('../../workers/main.js', import.meta.url));

export interface MetricsWorker {
  process: GroupProcess;
  port: number;
  sdkPort: number;
  /** moerl's /metrics. */
  url: string;
}

/**
 * Starts `moerl-worker` (roles: all unless given) with --metrics-port and --sdk-metrics-port, in
 * its own process group; resolves once /metrics answers.
 */
export async function startMetricsWorker(opts: {
  address: string;
  queues: TaskQueues;
  dir: string;
  env: NodeJS.ProcessEnv;
  roles?: string[];
  name?: string;
}): Promise<MetricsWorker> {
  const name = opts.name ?? 'worker';
  const [port, sdkPort] = [await freePort(), await freePort()];
  const url = `http://127.0.0.1:${port}/metrics`;
  const proc = spawnGroup(
    `moerl-worker ${name}`,
    process.execPath,
    [
      workerMain,
      ...(opts.roles ?? ['all']).flatMap((r) => ['--role', r]),
      ...['--address', opts.address, '--shutdown-grace-seconds', '5'],
      ...['--metrics-port', String(port), '--sdk-metrics-port', String(sdkPort)],
    ],
    join(opts.dir, `${name}.log`),
    {
      ...opts.env,
      MOERL_TASK_QUEUE_PREFIX: opts.queues.control.slice(0, -'control'.length),
      MOERL_CACHE_DIR: join(opts.dir, `cache-${name}`),
    },
  );
  try {
    await waitUntilReady(
      proc,
      Date.now() + 60_000,
      async () => (await fetch(url)).ok || 'not 200 yet',
      (message) => new Error(message),
    );
  } catch (err) {
    await proc.stop(10_000);
    throw err;
  }
  return { process: proc, port, sdkPort, url };
}

/**
 * A reward model on the HTTP protocol (docs/rewards.md) scoring every other sample 1. With
 * `held`, it answers nothing until release(): the campaign cannot finish its first iteration
 * before the test lets it, however fast or loaded the machine.
 */
export async function startRewardModel({ held = false } = {}) {
  let release = (): void => undefined;
  const released = held ? new Promise<void>((resolve) => (release = resolve)) : Promise.resolve();
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const { samples } = JSON.parse(body) as { samples: { sample_index: number }[] };
      void released.then(() => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ rewards: samples.map((x) => x.sample_index % 2) }));
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/score`,
    release: () => release(),
    close: () => {
      release();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
