// Control-plane scale: campaigns of the 48-node shape (32 rollout shards, epWorldSize 16,
// staleness 1; examples/eks.yaml otherwise) with fast activities (bench/scale/activities.ts:
// seeded stage times, no native work) on the local dev server with a SQLite database.
//   single: one campaign of --iterations; from its histories: events per run and per iteration,
//           continue-as-new count, largest payload, decision latency and schedule-to-start of
//           the first and last 100 iterations; worker and server RSS over time; DB size.
//   fleet:  --campaigns campaigns of --fleet-iterations at once on one worker fleet; the
//           iteration rate of each while all run (fairness: max/min).
//   list:   the namespace filled to --namespace-campaigns (tiny campaigns, all completed), then
//           `moerl list` (a process of its own) with and without filters.
// Usage: node dist/bench/scale.js [--iterations 1000] [--campaigns 20] [--fleet-iterations 50]
//   [--namespace-campaigns 1000] [--phases single,fleet,list] [--seed 1] [--sigma 0.5]
//   [--stage-ms rollout=100,reward=20,update=100,commit=20] [--sample-s 2]
// Progress goes to stderr; the last line on stdout is one JSON object.
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { parseArgs } from 'node:util';
import type { Client } from '@temporalio/client';
import { DefaultLogger, Runtime, makeTelemetryFilterString } from '@temporalio/worker';
import { startDevServer } from '../cli/dev-server.js';
import { loadSpecFile } from '../cli/spec-file.js';
import { repoRoot } from '../cli/temporal-tools.js';
import { listQuery } from '../cli/commands/list.js';
import { parseCampaignSpec } from '../workflows/spec.js';
import type { CampaignSpec } from '../workflows/spec.js';
import { startCampaign, testSpec, withWorkers } from '../test/support/campaign-harness.js';
import { connectDevServer } from './support/dev-server.js';
import { createFastActivities } from './scale/activities.js';
import type { CommitTimes, StageMedians } from './scale/activities.js';
import { campaignHistory, p50p95 } from './scale/history.js';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '1000' },
    campaigns: { type: 'string', default: '20' },
    'fleet-iterations': { type: 'string', default: '50' },
    'namespace-campaigns': { type: 'string', default: '1000' },
    phases: { type: 'string', default: 'single,fleet,list' },
    seed: { type: 'string', default: '1' },
    sigma: { type: 'string', default: '0.5' },
    'stage-ms': { type: 'string', default: 'rollout=100,reward=20,update=100,commit=20' },
    'sample-s': { type: 'string', default: '2' },
  },
});

function count(flag: keyof typeof values, min = 1): number {
  const n = Number(values[flag]);
  if (!Number.isInteger(n) || n < min)
    throw new Error(`--${flag} must be an integer ≥ ${min}, got "${values[flag]}"`);
  return n;
}
const iterations = count('iterations');
const fleetSize = count('campaigns');
const fleetIterations = count('fleet-iterations');
const namespaceCampaigns = count('namespace-campaigns');
const seed = count('seed', 0);
const sampleMs = count('sample-s') * 1000;
const sigma = Number(values.sigma);
const phases = new Set(String(values.phases).split(','));
for (const p of phases)
  if (!['single', 'fleet', 'list'].includes(p)) throw new Error(`--phases: unknown phase "${p}"`);

const stageNames: Record<string, keyof StageMedians> = {
  rollout: 'rolloutShard',
  reward: 'computeRewards',
  update: 'updatePolicy',
  commit: 'commitCheckpoint',
};
const medians: StageMedians = {
  prepareInputs: 0,
  preparePolicy: 50,
  rolloutShard: 0,
  computeRewards: 0,
  validationShard: 0,
  scoreValidation: 0,
  updatePolicy: 0,
  commitCheckpoint: 0,
  exportPolicy: 0,
};
for (const part of String(values['stage-ms']).split(',')) {
  const [stage, ms] = part.split('=');
  const name = stageNames[stage ?? ''];
  if (!name || !(Number(ms) >= 0))
    throw new Error(`--stage-ms: expected STAGE=MS (rollout, reward, update, commit), got "${part}"`);
  medians[name] = Number(ms);
}

/** The 48-node shape: examples/eks.yaml with 16 EP ranks, local launcher and fs store (unused). */
function shapeSpec(name: string, iters: number): CampaignSpec {
  const eks = loadSpecFile(join(repoRoot(), 'examples', 'eks.yaml'));
  return parseCampaignSpec({
    ...eks,
    name,
    iterations: iters,
    epWorldSize: 16,
    rolloutShards: 32,
    staleness: 1,
    launcher: { kind: 'local' },
    store: { kind: 'fs', path: '.moerl/bench-scale' },
  });
}

const log = (msg: string) =>
  process.stderr.write(`[scale ${new Date().toISOString().slice(11, 19)}] ${msg}\n`);
const mb = (bytes: number) => Math.round(bytes / 2 ** 20);
const round = (x: number, d = 2) => Math.round(x * 10 ** d) / 10 ** d;

function serverRssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : Number.NaN;
}

function dbBytes(file: string): number {
  return ['', '-wal', '-shm'].reduce((sum, ext) => {
    try {
      return sum + statSync(file + ext).size;
    } catch {
      return sum;
    }
  }, 0);
}

interface Sample {
  s: number;
  iteration: number;
  workerRssMb: number;
  workerHeapMb: number;
  serverRssMb: number;
}

/** Samples memory every sampleMs with the progress `iteration()` reports, until stopped. */
function sampler(serverPid: number, iteration: () => number) {
  const samples: Sample[] = [];
  const t0 = Date.now();
  const take = () =>
    samples.push({
      s: Math.round((Date.now() - t0) / 1000),
      iteration: iteration(),
      workerRssMb: mb(process.memoryUsage().rss),
      workerHeapMb: mb(process.memoryUsage().heapUsed),
      serverRssMb: mb(serverRssBytes(serverPid)),
    });
  take();
  const timer = setInterval(take, sampleMs);
  return {
    samples,
    stop: () => {
      clearInterval(timer);
      take();
    },
  };
}

/** At most n evenly spaced samples, the last one included. */
const thin = <T>(xs: T[], n = 12) =>
  xs.length <= n ? xs : Array.from({ length: n }, (_, k) => xs[Math.round((k * (xs.length - 1)) / (n - 1))]!);

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

async function single(
  client: Client,
  serverPid: number,
  commits: CommitTimes,
  queues: Parameters<typeof startCampaign>[2],
  dbFile: string,
) {
  const spec = shapeSpec('scale-single', iterations);
  const progress = () => Math.max(0, ...(commits.get(spec.name)?.keys() ?? []));
  const mem = sampler(serverPid, progress);
  const progressLog = setInterval(() => log(`single: iteration ${progress()} of ${iterations}`), 60_000);
  const started = Date.now();
  const handle = await startCampaign(client, spec, queues);
  await handle.result();
  const wallS = (Date.now() - started) / 1000;
  clearInterval(progressLog);
  mem.stop();
  log(`single: ${iterations} iterations in ${round(wallS, 1)} s; reading its histories`);

  const h = await campaignHistory(client, handle.workflowId);
  const w = Math.min(100, Math.floor(iterations / 2));
  const first = (i: number) => i >= 1 && i <= w;
  const last = (i: number) => i > iterations - w && i <= iterations;
  const window = (pick: (i: number) => boolean) => ({
    decision_ms: p50p95(h.decisions.filter((d) => pick(d.iteration)).map((d) => d.scheduledToCompleted)),
    decision_processing_ms: p50p95(
      h.decisions.filter((d) => pick(d.iteration)).map((d) => d.startedToCompleted),
    ),
    schedule_to_start_ms: Object.fromEntries(
      ['rolloutShard', 'computeRewards', 'updatePolicy', 'commitCheckpoint'].map((t) => [
        t,
        p50p95(h.activityStarts.filter((a) => a.type === t && pick(a.iteration)).map((a) => a.ms)),
      ]),
    ),
  });
  const rssIn = (pick: (i: number) => boolean, key: 'workerRssMb' | 'serverRssMb') =>
    round(mean(mem.samples.filter((s) => pick(s.iteration)).map((s) => s[key])), 0);
  const firstW = window(first);
  const lastW = window(last);
  return {
    iterations,
    wall_s: round(wallS, 1),
    s_per_iteration: round(wallS / iterations, 3),
    runs: h.runs.length,
    continue_as_new: h.runs.length - 1,
    events_total: h.events,
    events_per_iteration: round(h.events / iterations, 1),
    events_per_run_max: Math.max(...h.runs.map((r) => r.events)),
    events_per_run: h.runs.map((r) => r.events),
    history_bytes_per_run_max: Math.max(...h.runs.map((r) => r.bytes)),
    largest_payload: h.largestPayload,
    max_pending_activities: h.maxPendingActivities,
    window_iterations: w,
    first: firstW,
    last: lastW,
    decision_p95_last_over_first: round(lastW.decision_ms.p95 / firstW.decision_ms.p95),
    worker_rss_mb: { first_window: rssIn(first, 'workerRssMb'), last_window: rssIn(last, 'workerRssMb') },
    server_rss_mb: { first_window: rssIn(first, 'serverRssMb'), last_window: rssIn(last, 'serverRssMb') },
    memory_samples: thin(mem.samples),
    db_mb_after: round(dbBytes(dbFile) / 2 ** 20, 1),
  };
}

async function fleet(
  client: Client,
  serverPid: number,
  commits: CommitTimes,
  queues: Parameters<typeof startCampaign>[2],
  dbFile: string,
) {
  const specs = Array.from({ length: fleetSize }, (_, k) =>
    shapeSpec(`scale-fleet-${String(k).padStart(2, '0')}`, fleetIterations),
  );
  const done = () => specs.reduce((n, s) => n + (commits.get(s.name)?.size ?? 0), 0);
  const mem = sampler(serverPid, done);
  const started = Date.now();
  const handles = await Promise.all(specs.map((s) => startCampaign(client, s, queues)));
  const progressLog = setInterval(
    () => log(`fleet: ${done()} commits of ${fleetSize * (fleetIterations + 1)}`),
    60_000,
  );
  await Promise.all(handles.map((h) => h.result()));
  clearInterval(progressLog);
  mem.stop();
  const wallS = (Date.now() - started) / 1000;
  // Rates over the window in which every campaign was running: from the latest first
  // iteration commit to the earliest last one.
  const times = specs.map((s) =>
    [...(commits.get(s.name)?.entries() ?? [])].filter(([i]) => i >= 1).map(([, t]) => t),
  );
  const from = Math.max(...times.map((t) => Math.min(...t)));
  const to = Math.min(...times.map((t) => Math.max(...t)));
  const rates = times.map((t) => t.filter((x) => x > from && x <= to).length / ((to - from) / 1000));
  const whole = times.map((t) => (t.length - 1) / ((Math.max(...t) - Math.min(...t)) / 1000));
  return {
    campaigns: fleetSize,
    iterations_each: fleetIterations,
    wall_s: round(wallS, 1),
    common_window_s: round((to - from) / 1000, 1),
    iterations_per_s: {
      min: round(Math.min(...rates), 3),
      max: round(Math.max(...rates), 3),
      total: round(
        rates.reduce((a, b) => a + b, 0),
        2,
      ),
    },
    fairness_max_over_min: round(Math.max(...rates) / Math.min(...rates)),
    whole_run_iterations_per_s: { min: round(Math.min(...whole), 3), max: round(Math.max(...whole), 3) },
    memory_samples: thin(mem.samples, 6),
    db_mb_after: round(dbBytes(dbFile) / 2 ** 20, 1),
  };
}

async function fill(client: Client, queues: Parameters<typeof startCampaign>[2]) {
  const query = listQuery({});
  const have = (await client.workflow.count(query)).count;
  const missing = Math.max(0, namespaceCampaigns - have);
  log(`list: ${have} campaigns in the namespace; starting ${missing} small ones`);
  const spec = testSpec({
    name: 'scale-fill',
    iterations: 1,
    rolloutShards: 1,
    promptsPerIteration: 1,
    chunkSize: 1,
  });
  for (let started = 0; started < missing;) {
    const batch = Math.min(50, missing - started);
    const handles = await Promise.all(
      Array.from({ length: batch }, () => startCampaign(client, spec, queues)),
    );
    await Promise.all(handles.map((h) => h.result()));
    started += batch;
  }
  return (await client.workflow.count(query)).count;
}

const run = promisify(execFile);

/** `moerl ARGS` as a process of its own: wall time, and its CPU time (user + system) from bash's `times`. */
async function timedCli(args: string[]): Promise<{ wallMs: number; cpuMs: number; stdout: string }> {
  const cli = join(repoRoot(), 'bin', 'moerl.js');
  const t = performance.now();
  const { stdout, stderr } = await run('bash', [
    '-c',
    'out=$("$@") || exit; printf "%s\\n" "$out"; times >&2',
    'moerl',
    process.execPath,
    cli,
    ...args,
  ]);
  const wallMs = performance.now() - t;
  // The second line of `times` is the children's "user system", e.g. "0m0.912s 0m0.101s".
  const children = stderr.trim().split('\n').at(-1) ?? '';
  const cpuMs = [...children.matchAll(/(\d+)m([\d.]+)s/g)].reduce(
    (sum, m) => sum + (Number(m[1]) * 60 + Number(m[2])) * 1000,
    0,
  );
  return { wallMs, cpuMs, stdout };
}

async function listLatency(client: Client, address: string, namespace: string) {
  const cases: Record<string, string[]> = {
    default: [],
    limit_1000: ['--limit', '1000'],
    completed_1000: ['--status', 'completed', '--limit', '1000'],
    running: ['--status', 'running'],
    by_name: ['--name', 'scale-fleet-07'],
  };
  const median = (xs: number[]) => Math.round([...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!);
  const out: Record<string, Record<string, number>> = {};
  const help = await Promise.all([0, 1, 2].map(() => timedCli(['--help'])));
  out.help_only = {
    cli_wall_ms_p50: median(help.map((h) => h.wallMs)),
    cli_cpu_ms_p50: median(help.map((h) => h.cpuMs)),
  };
  for (const [name, args] of Object.entries(cases)) {
    const wall: number[] = [];
    const cpu: number[] = [];
    let campaigns = 0;
    for (let k = 0; k < 5; k++) {
      const r = await timedCli(['list', '--address', address, '--namespace', namespace, '--json', ...args]);
      wall.push(r.wallMs);
      cpu.push(r.cpuMs);
      campaigns = (JSON.parse(r.stdout) as { campaigns: unknown[] }).campaigns.length;
    }
    const flag = (f: string) => (args.includes(f) ? args[args.indexOf(f) + 1] : undefined);
    const query = listQuery({
      ...(flag('--status') ? { status: flag('--status')! } : {}),
      ...(flag('--name') ? { name: flag('--name')! } : {}),
    });
    const limit = Number(flag('--limit') ?? 50);
    const t = performance.now();
    let n = 0;
    for await (const _ of client.workflow.list({ query, pageSize: limit })) if (++n >= limit) break;
    out[name] = {
      cli_wall_ms_p50: median(wall),
      cli_wall_ms_max: Math.round(Math.max(...wall)),
      cli_cpu_ms_p50: median(cpu),
      in_process_ms: Math.round(performance.now() - t),
      campaigns,
    };
  }
  return out;
}

Runtime.install({
  logger: new DefaultLogger('ERROR'),
  telemetryOptions: { logging: { filter: makeTelemetryFilterString({ core: 'ERROR' }) } },
});
const dir = mkdtempSync(join(tmpdir(), 'moerl-bench-scale-'));
const dbFile = join(dir, 'temporal.db');
const server = await startDevServer({ dbFile });
log(`dev server at ${server.address}, pid ${server.pid}, db ${dbFile}`);
try {
  const connections = await connectDevServer(server);
  const { client, workerConnection } = connections;
  const { activities, commits } = createFastActivities({
    seed,
    sigma,
    mediansFor: (spec) => (spec.name === 'scale-fill' ? null : medians),
  });
  const result: Record<string, unknown> = {
    machine: {
      cpus: (await import('node:os')).cpus().length,
      loadavg_at_start: (await import('node:os')).loadavg().map((x) => round(x)),
    },
    settings: {
      seed,
      sigma,
      stage_ms: values['stage-ms'],
      shape: 'rolloutShards 32, epWorldSize 16, staleness 1, continueAsNewEvery 50',
    },
  };
  await withWorkers(workerConnection, server.namespace, activities, async (queues) => {
    if (phases.has('single')) result.single = await single(client, server.pid, commits, queues, dbFile);
    if (phases.has('fleet')) {
      log(`fleet: ${fleetSize} campaigns of ${fleetIterations} iterations`);
      result.fleet = await fleet(client, server.pid, commits, queues, dbFile);
    }
    if (phases.has('list')) {
      const inNamespace = await fill(client, queues);
      result.list = {
        campaigns_in_namespace: inNamespace,
        ...(await listLatency(client, server.address, server.namespace)),
      };
    }
  });
  result.db_mb = round(dbBytes(dbFile) / 2 ** 20, 1);
  result.loadavg_at_end = (await import('node:os')).loadavg().map((x) => round(x));
  console.log(JSON.stringify(result));
  await connections.close();
} finally {
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
}
