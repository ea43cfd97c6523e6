// Bounded staleness: iterations per hour of a rollout-bound campaign at staleness k against
// staleness 1, measured side by side in one run, on the real workflow, dev server and workers.
// Stage times stand in for generation and training (what is measured is the pipeline, not the
// engines): recording activities sleep, shard s of S for --rollout-s × (1 − spread + spread·s/(S−1))
// (the longest shard --rollout-s, the shortest 1 − spread of it), an update for --update-s
// (rollouts 3× longer than updates by default). The rollout fleet is one worker taking at
// most --fleet shards at once (its rank capacity, EP 1): with fleet = S one iteration's shards
// fill it and only the stragglers' tails are left for the iterations running ahead; with more
// ranks than S a deeper pipeline has idle ranks to fill.
// Throughput is the steady state: the iterations committed between the commits of --window
// A,B (B − A iterations ÷ the time between them), the same window for every setting; the
// pipeline's fill before A and its drain after B (up to k updates with no rollout left to
// overlap, which a campaign of thousands of iterations never sees) stay outside it.
// The last line of stdout is one JSON object.
//
// usage: node dist/bench/staleness.js [--shards 4] [--fleets 4,8] [--spreads 0,0.5]
//        [--staleness 1,2,4,8] [--iterations 24] [--window 4,16] [--rollout-s 1.2]
//        [--update-s 0.4] [--repeats 1]
import { parseArgs } from 'node:util';
import { sleep } from '@temporalio/activity';
import { DefaultLogger, Runtime, makeTelemetryFilterString } from '@temporalio/worker';
import type { CampaignActivities, RolloutShardInput } from '../activities/types.js';
import {
  startCampaign,
  testSpec,
  uniqueTaskQueues,
  workflowBundle,
} from '../test/support/campaign-harness.js';
import { createRecordingTestActivities } from '../test/support/recording-activities.js';
import { startTestEnvironment } from '../test/support/temporal.js';
import { runWorkers } from '../workers/worker.js';
import { median } from './support/stats.js';

const { values } = parseArgs({
  options: {
    shards: { type: 'string', default: '4' },
    fleets: { type: 'string', default: '4,8' },
    spreads: { type: 'string', default: '0,0.5' },
    staleness: { type: 'string', default: '1,2,4,8' },
    iterations: { type: 'string', default: '24' },
    window: { type: 'string', default: '4,16' },
    'rollout-s': { type: 'string', default: '1.2' },
    'update-s': { type: 'string', default: '0.4' },
    repeats: { type: 'string', default: '1' },
  },
});
const numbers = (flag: string, text: string, ok: (x: number) => boolean) => {
  const xs = text.split(',').map(Number);
  if (xs.length === 0 || !xs.every(ok)) throw new Error(`--${flag}: got "${text}"`);
  return xs;
};
const whole = (x: number) => Number.isInteger(x) && x >= 1;
const [shards] = numbers('shards', values.shards, whole);
const [iterations] = numbers('iterations', values.iterations, (x) => whole(x) && x >= 2);
const [from, to] = numbers('window', values.window, whole);
if (from === undefined || to === undefined || from >= to || to > iterations!)
  throw new Error(`--window: want A,B with 1 ≤ A < B ≤ --iterations, got "${values.window}"`);
const [repeats] = numbers('repeats', values.repeats, whole);
const [rolloutS] = numbers('rollout-s', values['rollout-s'], (x) => x > 0);
const [updateS] = numbers('update-s', values['update-s'], (x) => x > 0);
const fleets = numbers('fleets', values.fleets, whole);
const spreads = numbers('spreads', values.spreads, (x) => x >= 0 && x < 1);
const stalenesses = numbers('staleness', values.staleness, (x) => Number.isInteger(x) && x >= 1 && x <= 8);
const log = (line: string) => process.stderr.write(`staleness: ${line}\n`);

Runtime.install({
  logger: new DefaultLogger('ERROR'),
  telemetryOptions: { logging: { filter: makeTelemetryFilterString({ core: 'ERROR' }) } },
});

/** Recording activities taking the bench's stage times; `committed` has each commit's time. */
function timedActivities(spread: number) {
  const { activities } = createRecordingTestActivities();
  const committed = new Map<number, number>();
  const timed: CampaignActivities = {
    ...activities,
    rolloutShard: async (input: RolloutShardInput) => {
      const share = 1 - spread + (spread * input.shard) / Math.max(1, shards! - 1);
      await sleep(rolloutS! * 1000 * share);
      return activities.rolloutShard(input);
    },
    updatePolicy: async (input) => {
      await sleep(updateS! * 1000);
      return activities.updatePolicy(input);
    },
    commitCheckpoint: async (input) => {
      const out = await activities.commitCheckpoint(input);
      committed.set(input.staged.iteration, Date.now());
      return out;
    },
  };
  return { timed, committed };
}

const t = await startTestEnvironment();
const rows: {
  fleet: number;
  spread: number;
  staleness: number;
  iterationsPerHour: number;
  secondsPerIteration: number;
  vsStaleness1: number;
}[] = [];
try {
  const bundle = await workflowBundle();
  for (const fleet of fleets)
    for (const spread of spreads) {
      const perHour = new Map<number, number[]>();
      for (let r = 0; r < repeats!; r++)
        // the order alternates between repeats, so a drift of the machine favours no setting
        for (const staleness of r % 2 ? [...stalenesses].reverse() : stalenesses) {
          const { timed, committed } = timedActivities(spread);
          const queues = uniqueTaskQueues();
          const stop = new AbortController();
          const running = runWorkers({
            roles: ['all'],
            connection: t.nativeConnection,
            namespace: t.namespace,
            taskQueues: queues,
            activities: timed,
            workflowBundle: bundle,
            shutdownGraceMs: 1000,
            signal: stop.signal,
            rolloutRanks: fleet,
          });
          try {
            const spec = testSpec({
              name: `staleness-${staleness}`,
              iterations: iterations!,
              rolloutShards: shards!,
              rolloutEpWorldSize: 1,
              staleness,
              retention: { keepLast: 1 + staleness, keepBest: false },
            });
            const result = await (await startCampaign(t.client, spec, queues)).result();
            if (result.status !== 'completed')
              throw new Error(`staleness ${staleness}: campaign ${result.status}`);
          } finally {
            stop.abort();
            await running;
          }
          const seconds = (committed.get(to)! - committed.get(from)!) / 1000;
          perHour.set(staleness, [...(perHour.get(staleness) ?? []), (3600 * (to - from)) / seconds]);
          log(
            `fleet ${fleet}, spread ${spread}, staleness ${staleness}: ${(seconds / (to - from)).toFixed(3)} s per iteration`,
          );
        }
      const base = median(perHour.get(1) ?? perHour.get(stalenesses[0]!)!);
      for (const staleness of stalenesses) {
        const iph = median(perHour.get(staleness)!);
        rows.push({
          fleet,
          spread,
          staleness,
          iterationsPerHour: Math.round(iph),
          secondsPerIteration: Number((3600 / iph).toFixed(3)),
          vsStaleness1: Number((iph / base).toFixed(3)),
        });
      }
    }
} finally {
  await t.teardown();
}

process.stdout.write(
  '| fleet (ranks) | shard spread | staleness | s per iteration | iterations per hour | vs staleness 1 |\n',
);
process.stdout.write('| --- | --- | --- | --- | --- | --- |\n');
for (const r of rows)
  process.stdout.write(
    `| ${r.fleet} | ${r.spread} | ${r.staleness} | ${r.secondsPerIteration} | ${r.iterationsPerHour} | ${r.vsStaleness1}× |\n`,
  );
process.stdout.write(
  JSON.stringify({
    shards,
    iterations,
    window: [from, to],
    repeats,
    rolloutS,
    updateS,
    rows,
    machine: process.arch,
  }) + '\n',
);
