// The seeded chaos driver of the fault suite (test/integration/chaos*.test.ts, bench/chaos.ts):
// a real stack of separate processes — a Temporal dev server on a SQLite file and a fixed
// port, and one control, one rollout and one train worker, each in its own process group —
// and a schedule of faults drawn from a seed (SIGKILL or SIGTERM of a worker's group, SIGKILL
// of the server), applied at moments during a campaign. A killed worker is replaced at once,
// as a Spot node would be; the server is restarted on its SQLite file and port.
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, mkdirSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Client } from '@temporalio/client';
import { logTail, startDevServer, type DevServer } from '../../cli/dev-server.js';
import * as keys from '../../activities/layout.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import type { CampaignState, TaskQueues } from '../../workflows/types.js';
import { connectClient } from '../../workers/temporal-options.js';
import { startCampaign, tinyRealSpec, uniqueTaskQueues } from './campaign-harness.js';
import { seededRandom } from './s3-fault-proxy.js';

export type WorkerRole = 'control' | 'rollout' | 'train';
export type ChaosTarget = WorkerRole | 'temporal';

export interface Fault {
  /** When, in ms after the campaign started. */
  atMs: number;
  target: ChaosTarget;
  signal: 'SIGKILL' | 'SIGTERM';
  /** How long the target stays down before it is started again. */
  downMs: number;
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

export interface ChaosStack {
  client: Client;
  taskQueues: TaskQueues;
  namespace: string;
  /** Applies one fault and brings the target back; resolves when it has been restarted. */
  inject(fault: Fault): Promise<void>;
  /** Workers that exited without being told to (a worker must survive a server restart). */
  unexpectedExits: string[];
  /** The tail of every component's log, for a failure message. */
  logs(): string;
  stop(): Promise<void>;
}

/** Starts the server and the three workers; `env` goes to the workers (store credentials). */
export async function startChaosStack(dir: string, env: NodeJS.ProcessEnv = {}): Promise<ChaosStack> {
  mkdirSync(dir, { recursive: true });
  const dbFile = join(dir, 'temporal.db');
  const serverLog = join(dir, 'temporal.log');
  // The first start picks the ports (and retries on others when one is taken); restarts keep them.
  let server: DevServer = await startDevServer({ dbFile, logFile: serverLog });
  const port = Number(new URL(`grpc://${server.address}`).port);
  const uiPort = Number(new URL(server.uiUrl).port);
  const startServer = () => startDevServer({ dbFile, logFile: serverLog, port, uiPort });
  const { client, connection } = await connectClient({ address: server.address, namespace: 'default' });
  const taskQueues = uniqueTaskQueues();
  const prefix = taskQueues.control.slice(0, -'control'.length);
  const unexpectedExits: string[] = [];
  const workers = new Map<WorkerRole, WorkerProcess>();
  const expected = new Set<WorkerProcess>();

  const spawnWorker = (role: WorkerRole) => {
    const proc = spawnWorkerProcess(
      `${role} worker`,
      [workerMain, '--role', role, '--address', server.address, '--shutdown-grace-seconds', '3'],
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

  const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  return {
    client,
    taskQueues,
    namespace: 'default',
    unexpectedExits,
    async inject(fault) {
      if (fault.target === 'temporal') {
        process.kill(server.pid, 'SIGKILL');
        await server.stop();
        await pause(fault.downMs);
        server = await startServer();
        return;
      }
      const proc = workers.get(fault.target)!;
      expected.add(proc);
      // A SIGTERM'd worker drains for its grace (3 s); one that hangs past it gets SIGKILL.
      await stopWorker(proc, fault.signal, 10_000);
      await pause(fault.downMs);
      spawnWorker(fault.target);
    },
    logs() {
      const parts = [...workers.values()].map((p) => `--- ${p.name}\n${logTail(p.logFile, 0)}`);
      return [...parts, `--- temporal\n${logTail(serverLog, 0)}`].join('\n');
    },
    async stop() {
      for (const proc of workers.values()) expected.add(proc);
      await Promise.all([...workers.values()].map((p) => stopWorker(p, 'SIGTERM', 5_000)));
      await connection.close().catch(() => undefined);
      await server.stop();
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

export interface TrialOutcome {
  campaignId: string;
  wallMs: number;
  /** Faults applied while the campaign ran (those scheduled after it finished are not). */
  applied: Fault[];
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
  const applied: Fault[] = [];
  const injecting = (async () => {
    for (const fault of schedule) {
      const wait = started + fault.atMs - Date.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      if (done) return;
      applied.push(fault);
      await stack.inject(fault);
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
