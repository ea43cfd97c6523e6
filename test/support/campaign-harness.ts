// Helpers for tests that run real campaign workflows on the dev server: a workflow bundle built
// once, workers with test activities on task queues unique to the test, small specs, polling,
// rollout workers in processes of their own.
import { execFileSync, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { closeSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { Client, WorkflowHandle } from '@temporalio/client';
import { bundleWorkflowCode } from '@temporalio/worker';
import type { NativeConnection, WorkflowBundle } from '@temporalio/worker';
import * as keys from '../../activities/layout.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { CampaignActivities } from '../../activities/types.js';
import type { campaign } from '../../workflows/campaign.js';
import { campaignNameKey, campaignStatusKey } from '../../workflows/search-attributes.js';
import { parseCampaignSpec } from '../../workflows/spec.js';
import type { CampaignSpec, CampaignSpecInput } from '../../workflows/spec.js';
import type { CampaignInput, CampaignState, TaskQueues } from '../../workflows/types.js';
import { runWorkers, workflowsPath } from '../../workers/worker.js';
import type { Role } from '../../workers/worker.js';

let bundle: Promise<WorkflowBundle> | undefined;
/** The production workflow code, bundled once per test process. */
export function workflowBundle(): Promise<WorkflowBundle> {
  bundle ??= bundleWorkflowCode({ workflowsPath, logger: quietLogger });
  return bundle;
}

const noop = () => undefined;
const quietLogger = { log: noop, trace: noop, debug: noop, info: noop, warn: noop, error: noop };

export function uniqueTaskQueues(): TaskQueues {
  const prefix = `t-${randomUUID().slice(0, 8)}-`;
  return { control: `${prefix}control`, rollout: `${prefix}rollout`, train: `${prefix}train` };
}

/** A small valid spec; `overrides` are merged at the top level (and into orchestration). */
export function testSpec(overrides: Partial<CampaignSpecInput> = {}): CampaignSpec {
  return parseCampaignSpec({
    name: 'test-campaign',
    task: { builtin: 'add' },
    model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 },
    iterations: 3,
    promptsPerIteration: 4,
    groupSize: 2,
    rolloutShards: 2,
    chunkSize: 2,
    epWorldSize: 2,
    seed: 7,
    ...overrides,
    orchestration: { rolloutHeartbeatSeconds: 5, updateHeartbeatSeconds: 5, ...overrides.orchestration },
  });
}

/**
 * A campaign of the real data plane small enough for seconds per stage on two cores: one
 * iteration of a 1-layer policy, 2 EP ranks, 2 rollout shards, an fs store under `dir`.
 */
export function tinyRealSpec(
  name: string,
  dir: string,
  overrides: Partial<CampaignSpecInput> = {},
): CampaignSpec {
  return testSpec({
    name,
    task: { builtin: 'reverse' },
    model: { layers: 1, hidden: 32, heads: 2, experts: 4, topK: 2, contextLength: 32 },
    iterations: 1,
    promptsPerIteration: 4,
    groupSize: 4,
    rolloutShards: 2,
    chunkSize: 2,
    epWorldSize: 2,
    sftWarmStartSteps: 0,
    store: { kind: 'fs', path: join(dir, 'store') },
    hyperparameters: { maxNewTokens: 10 },
    ...overrides,
  });
}

/** Runs workers (all roles by default) with `activities` while `body` runs, then shuts them down. */
export async function withWorkers<T>(
  connection: NativeConnection,
  namespace: string,
  activities: CampaignActivities,
  body: (taskQueues: TaskQueues) => Promise<T>,
  taskQueues: TaskQueues = uniqueTaskQueues(),
  roles: Role[] = ['all'],
): Promise<T> {
  const stop = new AbortController();
  const running = runWorkers({
    roles,
    connection,
    namespace,
    taskQueues,
    activities,
    workflowBundle: await workflowBundle(),
    shutdownGraceMs: 1000,
    signal: stop.signal,
  });
  try {
    return await body(taskQueues);
  } finally {
    stop.abort();
    await running;
  }
}

export async function startCampaign(
  client: Client,
  spec: CampaignSpec,
  taskQueues: TaskQueues,
  extra: Partial<CampaignInput> = {},
): Promise<WorkflowHandle<typeof campaign>> {
  const campaignId = `${spec.name}-${randomUUID().slice(0, 8)}`;
  return client.workflow.start<typeof campaign>('campaign', {
    workflowId: campaignId,
    taskQueue: taskQueues.control,
    args: [{ campaignId, spec, taskQueues, ...extra }],
    typedSearchAttributes: [
      { key: campaignNameKey, value: spec.name },
      { key: campaignStatusKey, value: 'running' },
    ],
  });
}

/**
 * The campaign's result, or after `timeoutMs` an error saying where it stands (its status, active
 * stages and last failure) and `context()`: a test that waits on a stuck campaign fails naming
 * the stage, not by its file's timeout with nothing said.
 */
export async function resultWithin(
  handle: WorkflowHandle<typeof campaign>,
  timeoutMs: number,
  context: () => string | Promise<string> = () => '',
): Promise<Awaited<ReturnType<typeof campaign>>> {
  try {
    return await within(`campaign ${handle.workflowId}`, timeoutMs, handle.result());
  } catch (err) {
    if (!(err instanceof StepTimeout)) throw err;
  }
  const where = await handle.query<CampaignState>('status').then(
    (s) =>
      `status ${s.status}, next iteration ${s.nextIteration}, committed ${s.committedIteration}, ` +
      `active ${JSON.stringify(s.activeStages)}, last failure ${JSON.stringify(s.lastFailure)}`,
    (err: unknown) => `status query failed: ${String(err)}`,
  );
  const more = await context();
  throw new Error(
    `campaign ${handle.workflowId} not done after ${timeoutMs} ms: ${where}${more ? `; ${more}` : ''}`,
  );
}

/** What `within` throws when its step is late. */
export class StepTimeout extends Error {}

/**
 * `step`'s value, or after `timeoutMs` an error naming `what` it was waiting on: a test stuck on
 * one step fails saying which, not by its file's timeout with nothing said.
 */
export async function within<T>(what: string, timeoutMs: number, step: Promise<T>): Promise<T> {
  const late = new AbortController();
  const timedOut = Symbol('timed out');
  const outcome = await Promise.race([
    step.finally(() => late.abort()),
    delay(timeoutMs, timedOut, { signal: late.signal }).catch(() => undefined),
  ]);
  if (outcome === timedOut) throw new StepTimeout(`timed out after ${timeoutMs} ms waiting for ${what}`);
  return outcome as T;
}

/** Polls `probe` until it returns a value other than undefined, or fails after `timeoutMs`. */
export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  timeoutMs = 30_000,
  intervalMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export async function waitForState(
  handle: WorkflowHandle<typeof campaign>,
  what: string,
  predicate: (s: CampaignState) => boolean,
  timeoutMs?: number,
): Promise<CampaignState> {
  return waitFor(
    what,
    async () => {
      const state = await handle.query<CampaignState>('status');
      return predicate(state) ? state : undefined;
    },
    timeoutMs,
  );
}

/** Every rollout chunk and rewards file of a campaign, by its key below the campaign. */
export async function artifacts(store: ObjectStore, campaignId: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const prefix = `${keys.campaignPrefix(campaignId)}/`;
  for (const kind of ['rollouts/', 'rewards/'])
    for await (const obj of store.list(prefix + kind))
      out.set(obj.key.slice(prefix.length), (await store.get(obj.key)).toString('utf8'));
  return out;
}

const workerMain = fileURLToPath(new URL('../../workers/main.js', import.meta.url));

/**
 * `moerl-worker --role rollout` in its own process group, as a pod on its own node would be, on
 * the rollout queue of `queues`, with its cache in `<dir>/cache-<name>`. Its output is dropped,
 * or written to `<logDir>/worker-<name>.log` (for when a campaign does not get going).
 */
export function spawnRolloutWorker(opts: {
  address: string;
  queues: TaskQueues;
  dir: string;
  name: string;
  env?: NodeJS.ProcessEnv;
  logDir?: string;
}): ChildProcess {
  const log =
    opts.logDir === undefined ? 'ignore' : openSync(join(opts.logDir, `worker-${opts.name}.log`), 'w');
  try {
    return spawn(
      process.execPath,
      [workerMain, '--role', 'rollout', '--address', opts.address, '--shutdown-grace-seconds', '5'],
      {
        detached: true,
        stdio: ['ignore', log, log],
        env: {
          ...(opts.env ?? process.env),
          MOERL_TASK_QUEUE_PREFIX: opts.queues.rollout.slice(0, -'rollout'.length),
          MOERL_CACHE_DIR: join(opts.dir, `cache-${opts.name}`),
        },
      },
    );
  } finally {
    // The child holds its own copy of the log's descriptor.
    if (typeof log === 'number') closeSync(log);
  }
}

/** A `moerl-worker --role <role>` process whose stderr is kept, for tests of its own behaviour. */
export function spawnWatchedWorker(
  role: Role,
  env: NodeJS.ProcessEnv,
): { worker: ChildProcess; log: () => string; exited: Promise<number | null> } {
  const worker = spawn(process.execPath, [workerMain, '--role', role], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  worker.stderr!.on('data', (d: Buffer) => (log += d.toString()));
  const exited = new Promise<number | null>((resolve) => worker.once('exit', (code) => resolve(code)));
  return { worker, log: () => log, exited };
}

/** `ps` lines (the pid, then the arguments) of the processes whose arguments hold each of `needles`. */
export function processes(...needles: string[]): string[] {
  return execFileSync('ps', ['-eo', 'pid=,args='], { encoding: 'utf8' })
    .split('\n')
    .filter((l) => l.trim() !== '' && needles.every((n) => l.includes(n)));
}

/** The pid of a `processes` line. */
export const pidOf = (psLine: string) => Number.parseInt(psLine, 10);

/** Resolves once `child` has exited (at once if it has). */
export function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null
    ? Promise.resolve()
    : new Promise<void>((resolve) => child.once('exit', () => resolve()));
}

/** How many rollout chunks of `iteration` the store holds, over the given shards. */
export async function rolloutChunksStored(
  store: ObjectStore,
  campaignId: string,
  iteration: number,
  shards: readonly number[] = [0, 1],
): Promise<number> {
  let n = 0;
  for (const shard of shards)
    for await (const _ of store.list(`${keys.rolloutShardPrefix(campaignId, iteration, shard)}/`)) n++;
  return n;
}
