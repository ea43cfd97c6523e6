// The seeded chaos driver of the fault suite (test/integration/chaos*.test.ts, bench/chaos.ts):
// a real stack of separate processes — Temporal, and one control, one rollout and one train
// worker, each in its own process group — and a schedule of faults drawn from a seed (SIGKILL
// or SIGTERM of a worker's group, a fault of Temporal's), applied at moments during a campaign.
// A killed worker is replaced at once, as a Spot node would be. Temporal is the dev server on
// a SQLite file and a fixed port (restarted on both), or a cluster of separate services on
// PostgreSQL (test/support/temporal-cluster.ts), whose services and database each take faults.
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, mkdirSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Client, Connection } from '@temporalio/client';
import { logTail, startDevServer, type DevServer } from '../../cli/dev-server.js';
import * as keys from '../../activities/layout.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import type { CampaignState, TaskQueues } from '../../workflows/types.js';
import { connectClient } from '../../workers/temporal-options.js';
import { startCampaign, tinyRealSpec, uniqueTaskQueues } from './campaign-harness.js';
import { seededRandom } from './s3-fault-proxy.js';
import type { ClusterProcess, TemporalCluster } from './temporal-cluster.js';

export type WorkerRole = 'control' | 'rollout' | 'train';
/**
 * 'temporal' is the dev server; a cluster's targets are its processes, and 'history' is the
 * history host that owns the campaign's shard.
 */
export type ChaosTarget = WorkerRole | 'temporal' | ClusterProcess | 'history';

export interface Fault {
  /** When, in ms after the campaign started. */
  atMs: number;
  target: ChaosTarget;
  /** SIGINT: PostgreSQL's fast shutdown; SIGSTOP: the target stalls for `downMs`, then goes on. */
  signal: 'SIGKILL' | 'SIGTERM' | 'SIGINT' | 'SIGSTOP';
  /** How long the target stays down before it is started again. */
  downMs: number;
  /** Strike at the first moment from `atMs` on that the campaign runs this activity (its type). */
  during?: string;
}

/**
 * `count` faults at uniform moments within `spanMs`, in time order; the server only gets
 * SIGKILL (an orderly server stop is no fault), workers either signal.
 */
export function faultSchedule(
  seed: number,
  count: number,
  spanMs: number,
  targets: readonly ChaosTarget[] = ['rollout', 'train', 'control', 'temporal'],
): Fault[] {
  const random = seededRandom(seed);
  const faults: Fault[] = [];
  for (let i = 0; i < count; i++) {
    const target = targets[Math.floor(random() * targets.length)]!;
    const signal = target === 'temporal' || random() < 0.5 ? 'SIGKILL' : 'SIGTERM';
    faults.push({ atMs: Math.round(random() * spanMs), target, signal, downMs: Math.round(random() * 2000) });
  }
  return faults.sort((a, b) => a.atMs - b.atMs);
}

const workerMain = fileURLToPath(new URL('../../workers/main.js', import.meta.url));

/** Temporal under a chaos stack: where workers connect, and how its faults are applied. */
export interface ChaosTemporal {
  address: string;
  client: Client;
  connection: Connection;
  namespace: string;
  /** Applies a fault of a Temporal target and brings it back; names the process it hit. */
  inject(fault: Fault, campaignId: string): Promise<string>;
  logs(): string;
  stop(): Promise<void>;
}

/** The dev server on a SQLite file under `dir`; a fault is SIGKILL and a restart on the file and port. */
export async function devServerTemporal(dir: string): Promise<ChaosTemporal> {
  const dbFile = join(dir, 'temporal.db');
  const logFile = join(dir, 'temporal.log');
  // The first start picks the ports (and retries on others when one is taken); restarts keep them.
  let server: DevServer = await startDevServer({ dbFile, logFile });
  const port = Number(new URL(`grpc://${server.address}`).port);
  const uiPort = Number(new URL(server.uiUrl).port);
  const { client, connection } = await connectClient({ address: server.address, namespace: 'default' });
  return {
    address: server.address,
    client,
    connection,
    namespace: 'default',
    async inject(fault) {
      process.kill(server.pid, 'SIGKILL');
      await server.stop();
      await pause(fault.downMs);
      server = await startDevServer({ dbFile, logFile, port, uiPort });
      return 'temporal';
    },
    logs: () => `--- temporal\n${logTail(logFile, 0)}`,
    async stop() {
      await connection.close().catch(() => undefined);
      await server.stop();
    },
  };
}

/** A cluster's process faults: a kill (or a stall) and, after `downMs`, a start on the same ports. */
export function clusterTemporal(cluster: TemporalCluster): ChaosTemporal {
  return {
    address: cluster.address,
    client: cluster.client,
    connection: cluster.connection,
    namespace: cluster.namespace,
    async inject(fault, campaignId) {
      const target =
        fault.target === 'history'
          ? await cluster.historyHostOf(campaignId)
          : (fault.target as ClusterProcess);
      if (fault.signal === 'SIGSTOP') {
        await cluster.stall(target, fault.downMs);
        return target;
      }
      await cluster.kill(target, fault.signal);
      // A history host's shards move to the other before its time down counts.
      if (target.startsWith('history')) await cluster.shardsSettled();
      await pause(fault.downMs);
      await cluster.start(target);
      return target;
    },
    logs: () => cluster.logs(),
    stop: () => cluster.stop(),
  };
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export interface ChaosStack {
  client: Client;
  taskQueues: TaskQueues;
  namespace: string;
  /** Applies one fault and brings the target back; resolves, naming what it hit, once restarted. */
  inject(fault: Fault, campaignId: string): Promise<string>;
  /** Workers that exited without being told to (a worker must survive a server restart). */
  unexpectedExits: string[];
  /** The tail of every component's log, for a failure message. */
  logs(): string;
  stop(): Promise<void>;
}

/**
 * Starts the three workers on `temporal` (the dev server under `dir` by default); `env` goes to
 * the workers (store credentials). The stack owns `temporal`: stop() stops it.
 */
export async function startChaosStack(
  dir: string,
  env: NodeJS.ProcessEnv = {},
  temporalSide?: ChaosTemporal,
): Promise<ChaosStack> {
  mkdirSync(dir, { recursive: true });
  const temporal = temporalSide ?? (await devServerTemporal(dir));
  const taskQueues = uniqueTaskQueues();
  const prefix = taskQueues.control.slice(0, -'control'.length);
  const unexpectedExits: string[] = [];
  const workers = new Map<WorkerRole, WorkerProcess>();
  const expected = new Set<WorkerProcess>();

  const spawnWorker = (role: WorkerRole) => {
    const proc = spawnWorkerProcess(
      `${role} worker`,
      [
        workerMain,
        '--role',
        role,
        '--address',
        temporal.address,
        '--namespace',
        temporal.namespace,
        '--shutdown-grace-seconds',
        '3',
      ],
      join(dir, `${role}-worker.log`),
      {
        ...process.env,
        ...env,
        MOERL_TASK_QUEUE_PREFIX: prefix,
        // One cache (and job) directory per role, kept across restarts, as on a node's disk:
        // a replaced train worker adopts the training job its predecessor launched.
        MOERL_CACHE_DIR: join(dir, `cache-${role}`),
        OPENBLAS_NUM_THREADS: '1',
      },
    );
    void proc.exited.then((reason) => {
      if (!expected.has(proc)) unexpectedExits.push(`${role} worker exited with ${reason}`);
    });
    workers.set(role, proc);
  };
  for (const role of ['control', 'rollout', 'train'] as const) spawnWorker(role);

  const isWorker = (target: ChaosTarget): target is WorkerRole => workers.has(target as WorkerRole);
  return {
    client: temporal.client,
    taskQueues,
    namespace: temporal.namespace,
    unexpectedExits,
    async inject(fault, campaignId) {
      if (!isWorker(fault.target)) return temporal.inject(fault, campaignId);
      const proc = workers.get(fault.target)!;
      expected.add(proc);
      // A SIGTERM'd worker drains for its grace (3 s); one that hangs past it gets SIGKILL.
      await stopWorker(proc, fault.signal as NodeJS.Signals, 10_000);
      await pause(fault.downMs);
      spawnWorker(fault.target);
      return `${fault.target} worker`;
    },
    logs() {
      const parts = [...workers.values()].map((p) => `--- ${p.name}\n${logTail(p.logFile, 0)}`);
      return [...parts, temporal.logs()].join('\n');
    },
    async stop() {
      for (const proc of workers.values()) expected.add(proc);
      await Promise.all([...workers.values()].map((p) => stopWorker(p, 'SIGTERM', 5_000)));
      await temporal.stop();
    },
  };
}

interface WorkerProcess {
  name: string;
  logFile: string;
  pgid: number;
  exited: Promise<string>;
}

// Workers still running when this process exits go with it.
const liveGroups = new Set<number>();
process.once('exit', () => {
  for (const pgid of liveGroups) signalGroup(pgid, 'SIGKILL');
});

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // the group is gone already
  }
}

/** A worker process leading its own process group, as a pod on its own node would be. */
function spawnWorkerProcess(name: string, args: string[], logFile: string, env: NodeJS.ProcessEnv) {
  const fd = openSync(logFile, 'a');
  let child: ChildProcess;
  try {
    child = spawn(process.execPath, args, { detached: true, stdio: ['ignore', fd, fd], env });
  } finally {
    closeSync(fd);
  }
  if (child.pid === undefined) throw new Error(`${name} did not start: node ${args.join(' ')}`);
  const pgid = child.pid;
  liveGroups.add(pgid);
  const exited = new Promise<string>((resolve) =>
    child.once('exit', (code, signal) => {
      liveGroups.delete(pgid);
      resolve(signal ? `signal ${signal}` : `code ${code}`);
    }),
  );
  return { name, logFile, pgid, exited } satisfies WorkerProcess;
}

/** Signals the group and waits for its leader; SIGKILL after `graceMs` if it is still there. */
async function stopWorker(proc: WorkerProcess, signal: NodeJS.Signals, graceMs: number): Promise<void> {
  signalGroup(proc.pgid, signal);
  const timer = setTimeout(() => signalGroup(proc.pgid, 'SIGKILL'), graceMs);
  await proc.exited;
  clearTimeout(timer);
}

/** A fault as it struck: what was in flight, and when the target went down and came back. */
export interface AppliedFault extends Fault {
  /** The campaign's pending activities (by type) and workflow task at the moment it struck. */
  inFlight: string[];
  /** The process it hit (for 'history': the host that owned the campaign's shard). */
  hit: string;
  struckAt: number;
  backAt: number;
}

export interface TrialOutcome {
  campaignId: string;
  wallMs: number;
  /** Faults applied while the campaign ran (those scheduled after it finished are not). */
  applied: AppliedFault[];
  state: CampaignState;
  /** Workflow runs (continue-as-new chain) and, over all of them, the work that faults cost. */
  runs: number;
  lost: LostWork;
}

/**
 * Over every run of a campaign: activity attempts that were retried (the server records only
 * the last attempt, whose number tells how many went before), workflow tasks lost.
 */
export interface LostWork {
  activityRetries: number;
  workflowTaskTimeouts: number;
  workflowTaskFailures: number;
}

async function lostWork(client: Client, campaignId: string): Promise<{ runs: number; lost: LostWork }> {
  const lost: LostWork = {
    activityRetries: 0,
    workflowTaskTimeouts: 0,
    workflowTaskFailures: 0,
  };
  let runs = 0;
  for await (const run of client.workflow.list({ query: `WorkflowId = "${campaignId}"` })) {
    runs++;
    const history = await client.workflow.getHandle(campaignId, run.runId).fetchHistory();
    for (const e of history.events ?? []) {
      lost.activityRetries += Math.max(0, (e.activityTaskStartedEventAttributes?.attempt ?? 1) - 1);
      if (e.workflowTaskTimedOutEventAttributes) lost.workflowTaskTimeouts++;
      if (e.workflowTaskFailedEventAttributes) lost.workflowTaskFailures++;
    }
  }
  return { runs, lost };
}

/** The campaign's pending activities and workflow task now ([] when Temporal does not answer). */
async function pendingWork(client: Client, campaignId: string): Promise<string[]> {
  try {
    const { raw } = await client.workflow.getHandle(campaignId).describe();
    return [
      ...(raw.pendingActivities ?? []).map((a) => `activity ${a.activityType?.name ?? '?'}`),
      ...(raw.pendingWorkflowTask ? ['workflow task'] : []),
    ];
  } catch {
    return [];
  }
}

/**
 * Runs one campaign on the stack while the schedule's faults are applied, and waits until it
 * completes (polling through server outages). Fails with the component logs after `timeoutMs`.
 */
export async function runTrial(
  stack: ChaosStack,
  spec: CampaignSpec,
  schedule: readonly Fault[],
  timeoutMs: number,
): Promise<TrialOutcome> {
  const started = Date.now();
  const handle = await startCampaign(stack.client, spec, stack.taskQueues);
  const campaignId = handle.workflowId;
  let done = false;
  const applied: AppliedFault[] = [];
  const injecting = (async () => {
    for (const fault of schedule) {
      const wait = started + fault.atMs - Date.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      let inFlight = await pendingWork(stack.client, campaignId);
      while (fault.during && !done && !inFlight.includes(`activity ${fault.during}`)) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        inFlight = await pendingWork(stack.client, campaignId);
      }
      if (done) return;
      const struckAt = Date.now();
      const hit = await stack.inject(fault, campaignId);
      applied.push({ ...fault, atMs: struckAt - started, inFlight, hit, struckAt, backAt: Date.now() });
    }
  })();
  try {
    const current = () => stack.client.workflow.getHandle(campaignId);
    for (;;) {
      if (Date.now() - started > timeoutMs)
        throw new Error(
          `campaign ${campaignId} not done after ${timeoutMs} ms (faults applied: ${JSON.stringify(applied)})\n${stack.logs()}`,
        );
      try {
        const { status } = await current().describe();
        if (status.name === 'COMPLETED') break;
        if (status.name !== 'RUNNING' && status.name !== 'CONTINUED_AS_NEW')
          throw new Error(`campaign ${campaignId} ended ${status.name}\n${stack.logs()}`);
      } catch (err) {
        // The server is down for a moment: ask again.
        if (!/UNAVAILABLE|14 |connect|ECONNREFUSED|deadline/i.test(String(err))) throw err;
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    done = true;
    await injecting;
    const wallMs = Date.now() - started;
    const state = await current().query<CampaignState>('status');
    return { campaignId, wallMs, applied, state, ...(await lostWork(stack.client, campaignId)) };
  } finally {
    done = true;
    await injecting.catch(() => undefined);
  }
}

/** sha256 of every file of a committed checkpoint (the manifest's own files), read from the store. */
export async function checkpointDigests(
  store: ObjectStore,
  campaignId: string,
  iteration: number,
): Promise<Record<string, string>> {
  const key = keys.checkpointKey(campaignId, iteration);
  const manifest = JSON.parse((await store.get(`${key}/${keys.manifestName}`)).toString('utf8')) as {
    files: { name: string }[];
  };
  const out: Record<string, string> = {};
  for (const { name } of [...manifest.files].sort((a, b) => a.name.localeCompare(b.name))) {
    const hash = createHash('sha256');
    for await (const chunk of store.getStream(`${key}/${name}`)) hash.update(chunk as Buffer);
    out[name] = hash.digest('hex');
  }
  return out;
}

/** Faults applied, counted by target and signal ("rollout SIGKILL": 2, ...). */
export function countFaults(faults: readonly Fault[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const f of faults) out[`${f.target} ${f.signal}`] = (out[`${f.target} ${f.signal}`] ?? 0) + 1;
  return out;
}

/**
 * The fault suite's campaign: the real data plane at its tiniest, 4 iterations with staleness 1
 * (rollout i+1 overlaps update i) and continue-as-new every 2, heartbeats short enough that a
 * lost worker is noticed in seconds, and updates that may be retried as often as faults demand.
 */
export function chaosSpec(name: string, dir: string, store?: CampaignSpec['store']): CampaignSpec {
  return tinyRealSpec(name, dir, {
    iterations: 4,
    promptsPerIteration: 8,
    groupSize: 4,
    chunkSize: 2,
    staleness: 1,
    retention: { keepLast: 2, keepBest: false },
    ...(store ? { store } : {}),
    orchestration: {
      continueAsNewEvery: 2,
      rolloutHeartbeatSeconds: 2,
      updateHeartbeatSeconds: 3,
      updateMaxAttempts: 50,
    },
  });
}
