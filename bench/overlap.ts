// Overlap benchmark: the same native campaign (examples/demo.yaml, fixed seed) with staleness 0
// and staleness 1, rollout workers pinned to one core and trainer ranks to the other (taskset;
// the pinning is inherited by moe_generate and by the local launcher's ranks), the control
// worker and the dev server unpinned. From each campaign's history:
//   - aggregate rollout throughput: samples generated ÷ (last checkpoint commit − first rollout),
//   - mean iteration time over the same window,
//   - per iteration, the rollout phase R (first shard scheduled → reward done) and the update
//     phase U (update scheduled → commit done), and for staleness 1 where each iteration waited,
//   - a profile: CPU seconds the rollout and the train worker's process trees got in the window,
//     per iteration and as a share of the time their stage ran, and each core's busy share.
// The upper bound of the overlap's speed-up is (R + U) ÷ max(R, U) with the staleness 0 run's
// means, measured in the same invocation.
// The last line of stdout is one JSON object.
//
// usage: node dist/bench/overlap.js [--iterations 12] [--repeats 1] [--set key=value]...
//        [--rollout-cpu 0] [--train-cpu 1] [--keep DIR]
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { WorkflowHandle } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import { startDevServer } from '../cli/dev-server.js';
import { demoSpecPath } from '../cli/commands/demo.js';
import { startCampaign } from '../cli/commands/start.js';
import { loadSpecFile, parseOverride } from '../cli/spec-file.js';
import { connectClient, taskQueuesFrom } from '../workers/temporal-options.js';
import type { CampaignState } from '../workflows/types.js';
import { median } from './support/stats.js';

type HistoryEvent = temporal.api.history.v1.IHistoryEvent;

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '12' },
    repeats: { type: 'string', default: '1' },
    set: { type: 'string', multiple: true, default: [] },
    'rollout-cpu': { type: 'string', default: '0' },
    'train-cpu': { type: 'string', default: '1' },
    keep: { type: 'string' },
  },
});
const iterations = Number(values.iterations);
const repeats = Number(values.repeats);
if (!Number.isInteger(iterations) || iterations < 2)
  throw new Error(`--iterations must be an integer ≥ 2, got "${values.iterations}"`);
if (!Number.isInteger(repeats) || repeats < 1)
  throw new Error(`--repeats must be a positive integer, got "${values.repeats}"`);

const workDir = values.keep ?? mkdtempSync(join(tmpdir(), 'moerl-overlap-'));
mkdirSync(workDir, { recursive: true });
const mainJs = fileURLToPath(new URL('../workers/main.js', import.meta.url));
const prefix = `overlap-${process.pid}-`;
const ticksPerSecond = 100; // USER_HZ on Linux

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
const round = (x: number, digits = 3) => Number(x.toFixed(digits));
const millis = (t: HistoryEvent['eventTime']) =>
  t ? Number(t.seconds ?? 0) * 1000 + Math.floor((t.nanos ?? 0) / 1e6) : Number.NaN;
const payloadJson = (p: temporal.api.common.v1.IPayloads | null | undefined): unknown => {
  const data = p?.payloads?.[0]?.data;
  return data ? JSON.parse(Buffer.from(data).toString('utf8')) : undefined;
};

/** CPU seconds of a process and its reaped descendants (utime + stime + cutime + cstime). */
function treeCpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return [11, 12, 13, 14].reduce((sum, i) => sum + Number(fields[i]), 0) / ticksPerSecond;
}

/** Busy and total ticks per CPU, from /proc/stat. */
function cpuTicks(): Map<string, { busy: number; total: number }> {
  const out = new Map<string, { busy: number; total: number }>();
  for (const line of readFileSync('/proc/stat', 'utf8').split('\n')) {
    const m = /^(cpu\d+) (.*)$/.exec(line);
    if (!m) continue;
    const t = m[2]!.trim().split(/\s+/).map(Number);
    const idle = (t[3] ?? 0) + (t[4] ?? 0);
    const total = t.slice(0, 8).reduce((a, b) => a + b, 0);
    out.set(m[1]!, { busy: total - idle, total });
  }
  return out;
}

/** The campaign's result; a campaign paused by a stage that failed for good ends the benchmark. */
async function finished(handle: WorkflowHandle): Promise<void> {
  let done = false;
  const result = handle.result().finally(() => (done = true));
  while (!done) {
    await Promise.race([result, new Promise((r) => setTimeout(r, 2000))]);
    if (done) break;
    const state = await handle.query<CampaignState>('status');
    if (state.status === 'paused' && state.lastFailure)
      throw new Error(
        `campaign ${handle.workflowId} paused: ${state.lastFailure.stage} of iteration ${state.lastFailure.iteration}: ${state.lastFailure.message}`,
      );
  }
  await result;
}

interface Sample {
  t: number;
  rollout: number;
  train: number;
  ticks: Map<string, { busy: number; total: number }>;
}

function startWorker(role: string, cpu: string | undefined, address: string): ChildProcess {
  const log = openSync(join(workDir, `worker-${role}.log`), 'a');
  const args = [process.execPath, mainJs, '--role', role, '--shutdown-grace-seconds', '5'];
  const [file, argv] = cpu === undefined ? [args[0]!, args.slice(1)] : ['taskset', ['-c', cpu, ...args]];
  try {
    return spawn(file, argv, {
      stdio: ['ignore', log, log],
      env: {
        ...process.env,
        TEMPORAL_ADDRESS: address,
        TEMPORAL_NAMESPACE: 'default',
        MOERL_TASK_QUEUE_PREFIX: prefix,
        MOERL_CACHE_DIR: join(workDir, `cache-${role}`),
        // Pinned to one core, the rollout worker's rank capacity would default to 1 and run
        // the demo's two shards one after the other; they are mostly start-up and waiting (a
        // third of a core each), so both share the core, as in a default unpinned worker here.
        ...(role === 'rollout' ? { MOERL_ROLLOUT_RANKS: process.env.MOERL_ROLLOUT_RANKS ?? '2' } : {}),
      },
    });
  } finally {
    closeSync(log);
  }
}

interface Phase {
  start: number;
  end: number;
}

/** Per-iteration phases, samples and the measured window, from a campaign's history. */
function analyse(events: HistoryEvent[]) {
  const scheduled = new Map<string, { type: string; iteration: number; at: number }>();
  const rollout = new Map<number, Phase>();
  const update = new Map<number, Phase>();
  let samples = 0;
  for (const e of events) {
    const s = e.activityTaskScheduledEventAttributes;
    if (s) {
      const input = payloadJson(s.input) as { iteration?: number; staged?: { iteration: number } };
      const iteration = input.iteration ?? input.staged?.iteration ?? 0;
      const type = s.activityType?.name ?? '';
      const at = millis(e.eventTime);
      scheduled.set(String(e.eventId), { type, iteration, at });
      if (type === 'rolloutShard' && !rollout.has(iteration)) rollout.set(iteration, { start: at, end: NaN });
      if (type === 'updatePolicy') update.set(iteration, { start: at, end: NaN });
      continue;
    }
    const c = e.activityTaskCompletedEventAttributes;
    if (!c) continue;
    const what = scheduled.get(String(c.scheduledEventId));
    if (!what || what.iteration < 1) continue;
    const at = millis(e.eventTime);
    if (what.type === 'rolloutShard') samples += (payloadJson(c.result) as { samples: number }).samples;
    if (what.type === 'computeRewards') rollout.get(what.iteration)!.end = at;
    if (what.type === 'commitCheckpoint') update.get(what.iteration)!.end = at;
  }
  const its = [...update.keys()].sort((a, b) => a - b);
  const r = its.map((i) => rollout.get(i)!);
  const u = its.map((i) => update.get(i)!);
  const windowStart = r[0]!.start;
  const windowEnd = u.at(-1)!.end;
  const windowS = (windowEnd - windowStart) / 1000;
  // Staleness 1: update i starts once update i-1 is committed and rollout i is done; which came
  // last says what bounded the iteration, the rest of the gap is the control plane's hand-off.
  const waits = its.slice(1).map((_, k) => {
    const prevCommit = u[k]!.end;
    const rolloutDone = r[k + 1]!.end;
    return {
      rolloutBound: rolloutDone > prevCommit,
      handoffS: (u[k + 1]!.start - Math.max(prevCommit, rolloutDone)) / 1000,
      waitForRolloutS: Math.max(0, rolloutDone - prevCommit) / 1000,
    };
  });
  return {
    windowStart,
    windowEnd,
    totalRolloutS: r.reduce((sum, p) => sum + (p.end - p.start) / 1000, 0),
    totalUpdateS: u.reduce((sum, p) => sum + (p.end - p.start) / 1000, 0),
    iterations: its.length,
    samples,
    windowS: round(windowS, 2),
    throughput: samples / windowS,
    meanIterationS: windowS / its.length,
    rolloutS: mean(r.map((p) => (p.end - p.start) / 1000)),
    updateS: mean(u.map((p) => (p.end - p.start) / 1000)),
    // Meaningful with staleness 1 only (with 0 the rollout never runs during an update).
    rolloutBoundIterations: waits.filter((w) => w.rolloutBound).length,
    meanWaitForRolloutS: round(mean(waits.map((w) => w.waitForRolloutS))),
    meanHandoffS: round(mean(waits.map((w) => w.handoffS))),
  };
}

const server = await startDevServer({ logFile: join(workDir, 'temporal.log') });
const workers = {
  control: startWorker('control', undefined, server.address),
  rollout: startWorker('rollout', values['rollout-cpu'], server.address),
  train: startWorker('train', values['train-cpu'], server.address),
};
const takeSample = (): Sample => ({
  t: Date.now(),
  rollout: treeCpuSeconds(workers.rollout.pid!),
  train: treeCpuSeconds(workers.train.pid!),
  ticks: cpuTicks(),
});
type Measured = Omit<
  ReturnType<typeof analyse>,
  'windowStart' | 'windowEnd' | 'totalRolloutS' | 'totalUpdateS'
>;
const runs: Record<'0' | '1', Measured & Record<string, unknown>>[] = [];
try {
  const { client, connection } = await connectClient({ address: server.address, namespace: 'default' });
  try {
    for (let rep = 0; rep < repeats; rep++) {
      const pair = {} as (typeof runs)[number];
      // Alternate the order, so a drifting machine load does not favour one setting.
      for (const staleness of rep % 2 === 0 ? [0, 1] : [1, 0]) {
        const overrides = [
          ...values.set,
          `iterations=${iterations}`,
          `staleness=${staleness}`,
          `store.path=${join(workDir, `store-${rep}-${staleness}`)}`,
        ].map(parseOverride);
        const spec = loadSpecFile(demoSpecPath, overrides);
        const started = await startCampaign(client, {
          spec,
          taskQueues: taskQueuesFrom({ MOERL_TASK_QUEUE_PREFIX: prefix }),
        });
        const handle = client.workflow.getHandle(started.campaignId);
        // CPU use is sampled throughout and read at the window's ends (from the history). A
        // process's CPU time reaches its parent when it exits, and every moe_generate and rank
        // process exits inside the window, so the difference is the window's work.
        const samplesCpu: Sample[] = [];
        const sample = () => samplesCpu.push(takeSample());
        sample();
        const timer = setInterval(sample, 250);
        const load0 = loadavg()[0]!;
        const t0 = Date.now();
        try {
          await finished(handle);
        } finally {
          clearInterval(timer);
        }
        await new Promise((r) => setTimeout(r, 300));
        sample();
        const wallS = (Date.now() - t0) / 1000;
        const { events } = await handle.fetchHistory();
        const { windowStart, windowEnd, totalRolloutS, totalUpdateS, ...a } = analyse(events ?? []);
        const before = samplesCpu.filter((x) => x.t <= windowStart).at(-1) ?? samplesCpu[0]!;
        const after = samplesCpu.find((x) => x.t >= windowEnd) ?? samplesCpu.at(-1)!;
        const rolloutCpu = after.rollout - before.rollout;
        const trainCpu = after.train - before.train;
        const coreBusy = Object.fromEntries(
          [...after.ticks].map(([cpu, t]) => {
            const b = before.ticks.get(cpu)!;
            return [cpu, round((t.busy - b.busy) / Math.max(1, t.total - b.total), 2)];
          }),
        );
        pair[String(staleness) as '0' | '1'] = {
          ...a,
          campaignId: started.campaignId,
          campaignWallS: round(wallS, 1),
          // The profile: CPU seconds our processes got in the window, per iteration, and as a
          // share of the time their stage ran (1 = a whole core whenever the stage ran).
          profile: {
            rolloutCpuPerIterationS: round(rolloutCpu / a.iterations),
            trainCpuPerIterationS: round(trainCpu / a.iterations),
            rolloutCpuShare: round(rolloutCpu / totalRolloutS, 2),
            trainCpuShare: round(trainCpu / totalUpdateS, 2),
            coreBusy,
          },
          loadavg1: [round(load0, 1), round(loadavg()[0]!, 1)],
        };
        console.error(
          `overlap: repeat ${rep + 1} staleness ${staleness}: ${round(a.throughput, 1)} samples/s, ` +
            `${round(a.meanIterationS, 2)} s/iteration (R ${round(a.rolloutS, 2)} s, U ${round(a.updateS, 2)} s), load ${round(load0, 1)}`,
        );
      }
      runs.push(pair);
    }
  } finally {
    await connection.close();
  }
} finally {
  for (const w of Object.values(workers)) w.kill('SIGTERM');
  await Promise.all(
    Object.values(workers).map(
      (w) => new Promise((r) => (w.exitCode === null ? w.once('exit', r) : r(null))),
    ),
  );
  await server.stop();
  if (values.keep === undefined) rmSync(workDir, { recursive: true, force: true });
}

const perRepeat = runs.map(({ 0: s0, 1: s1 }) => {
  const upperBound = (s0.rolloutS + s0.updateS) / Math.max(s0.rolloutS, s0.updateS);
  const ratio = s1.throughput / s0.throughput;
  return { ratio: round(ratio), upperBound: round(upperBound), ofUpperBound: round(ratio / upperBound) };
});
console.log(
  JSON.stringify({
    bench: 'overlap',
    iterations,
    repeats,
    overrides: values.set,
    pinning: { rollout: values['rollout-cpu'], train: values['train-cpu'], control: 'unpinned' },
    throughput_ratio: round(median(perRepeat.map((p) => p.ratio))),
    upper_bound: round(median(perRepeat.map((p) => p.upperBound))),
    of_upper_bound: round(median(perRepeat.map((p) => p.ofUpperBound))),
    staleness0: {
      samples_per_s: round(median(runs.map((r) => r[0].throughput)), 1),
      mean_iteration_s: round(median(runs.map((r) => r[0].meanIterationS))),
      rollout_s: round(median(runs.map((r) => r[0].rolloutS))),
      update_s: round(median(runs.map((r) => r[0].updateS))),
    },
    staleness1: {
      samples_per_s: round(median(runs.map((r) => r[1].throughput)), 1),
      mean_iteration_s: round(median(runs.map((r) => r[1].meanIterationS))),
      rollout_s: round(median(runs.map((r) => r[1].rolloutS))),
      update_s: round(median(runs.map((r) => r[1].updateS))),
    },
    runs: runs.map((pair, i) => ({ ...perRepeat[i], staleness0: pair[0], staleness1: pair[1] })),
  }),
);
