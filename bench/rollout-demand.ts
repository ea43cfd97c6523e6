// What reading the rollout demand (workers/demand.ts) costs at fleet scale: --campaigns running
// campaigns on the local dev server (SQLite), each with --shards rollout shards of EP size
// --ep scheduled and no rollout worker to take them (a fleet scaled to zero), so every
// campaign has pending activities to describe. Times --reads reads after the first (which also
// reads each run's start event once) and checks each returns campaigns × shards × EP.
// Usage: node dist/bench/rollout-demand.js [--campaigns 64] [--shards 8] [--ep 2] [--reads 20]
// Progress goes to stderr; the last line on stdout is one JSON object.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { DefaultLogger, Runtime, makeTelemetryFilterString } from '@temporalio/worker';
import { startDevServer } from '../cli/dev-server.js';
import { rolloutDemandReader } from '../workers/demand.js';
import { startCampaign, testSpec, waitFor, withWorkers } from '../test/support/campaign-harness.js';
import { createRecordingTestActivities } from '../test/support/recording-activities.js';
import { connectDevServer } from './support/dev-server.js';

const { values } = parseArgs({
  options: {
    campaigns: { type: 'string', default: '64' },
    shards: { type: 'string', default: '8' },
    ep: { type: 'string', default: '2' },
    reads: { type: 'string', default: '20' },
  },
});
const campaigns = Number(values.campaigns);
const shards = Number(values.shards);
const ep = Number(values.ep);
const reads = Number(values.reads);
const log = (line: string) => process.stderr.write(`rollout-demand: ${line}\n`);

Runtime.install({
  logger: new DefaultLogger('ERROR'),
  telemetryOptions: { logging: { filter: makeTelemetryFilterString({ core: 'ERROR' }) } },
});
const dir = mkdtempSync(join(tmpdir(), 'moerl-bench-demand-'));
const server = await startDevServer({
  dbFile: join(dir, 'temporal.db'),
  logFile: join(dir, 'temporal.log'),
  namespace: 'default',
});
const conn = await connectDevServer(server);
try {
  const { activities } = createRecordingTestActivities();
  const result = await withWorkers(
    conn.workerConnection,
    server.namespace,
    activities,
    async (queues) => {
      const spec = testSpec({
        iterations: 1,
        rolloutShards: shards,
        promptsPerIteration: shards,
        rolloutEpWorldSize: ep,
      });
      for (let i = 0; i < campaigns; i++) await startCampaign(conn.client, spec, queues);
      const read = rolloutDemandReader(conn.workerConnection.workflowService, server.namespace, queues);
      const want = campaigns * shards * ep;
      const firstStarted = performance.now();
      // The first read that sees every shard scheduled: it reads each run's start event too.
      let firstMs = 0;
      await waitFor(
        `${want} ranks wanted`,
        async () => {
          const t = performance.now();
          const ranks = await read();
          firstMs = performance.now() - t;
          log(`${ranks} of ${want} ranks wanted`);
          return ranks === want ? true : undefined;
        },
        300_000,
        500,
      );
      log(`all shards scheduled after ${((performance.now() - firstStarted) / 1000).toFixed(1)} s`);
      const times: number[] = [];
      for (let i = 0; i < reads; i++) {
        const t = performance.now();
        const ranks = await read();
        times.push(performance.now() - t);
        if (ranks !== want) throw new Error(`read ${i}: ${ranks} ranks, expected ${want}`);
      }
      times.sort((a, b) => a - b);
      const at = (q: number) => times[Math.min(times.length - 1, Math.floor(q * times.length))]!;
      return {
        campaigns,
        shards,
        ep,
        ranksWanted: want,
        reads,
        firstFullReadMs: Math.round(firstMs),
        readMs: { p50: Math.round(at(0.5)), p95: Math.round(at(0.95)), max: Math.round(times.at(-1)!) },
        callsPerRead: { listPages: Math.ceil(campaigns / 1000), describes: campaigns },
      };
    },
    undefined,
    ['control', 'train'],
  );
  console.log(JSON.stringify(result));
} finally {
  await conn.close();
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
}
