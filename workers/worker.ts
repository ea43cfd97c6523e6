// Runs the Temporal workers of one moerl process. A role maps to the task queue it polls:
//   control  campaign workflows + checkpoint commits   (stable, small)
//   rollout  rollout shards + rewards                    (Spot capacity, scales out)
//   train    policy preparation + updates               (stable, launches trainer ranks)
import { hostname } from 'node:os';
import { fileURLToPath } from 'node:url';
import { Worker } from '@temporalio/worker';
import type { NativeConnection, WorkflowBundle } from '@temporalio/worker';
import type { CampaignActivities } from '../activities/types.js';
import type { TaskQueues } from '../workflows/types.js';

export const roles = ['control', 'rollout', 'train', 'all'] as const;
export type Role = (typeof roles)[number];

type QueueRole = Exclude<Role, 'all'>;

/** Which activities each queue serves; the workflow schedules each activity on exactly one. */
export const activitiesByRole: Record<QueueRole, (keyof CampaignActivities)[]> = {
  control: ['commitCheckpoint'],
  rollout: ['prepareInputs', 'rolloutShard', 'computeRewards', 'validationShard', 'scoreValidation'],
  train: ['preparePolicy', 'updatePolicy', 'exportPolicy'],
};

export const workflowsPath = fileURLToPath(new URL('../workflows/index.js', import.meta.url));

/** A build of the workers under Temporal Worker Versioning (docs/operations.md, "Deploying new worker code"). */
export interface WorkerDeployment {
  /** The same for every build of one moerl installation, e.g. "moerl". */
  deploymentName: string;
  /** Unique per build of the worker code, e.g. the image tag. */
  buildId: string;
}

export interface RunWorkersOptions {
  roles: Role[];
  connection: NativeConnection;
  namespace: string;
  taskQueues: TaskQueues;
  activities: CampaignActivities;
  /** How long in-flight activities get to finish after shutdown starts (keep below the pod's grace). */
  shutdownGraceMs?: number;
  /** Pre-built workflow code (tests reuse one bundle); bundled from workflowsPath when absent. */
  workflowBundle?: WorkflowBundle;
  /** Aborting it starts a graceful shutdown: stop polling, let activities flush, then return. */
  signal?: AbortSignal;
  /** Poll as this deployment version; unversioned when absent. */
  deployment?: WorkerDeployment;
  /**
   * The rollout worker's rank capacity (activities/rollout-capacity.ts): it takes at most this
   * many rollout-queue tasks at once, since each running shard holds at least one rank; the
   * SDK's default (100) when absent.
   */
  rolloutRanks?: number;
}

export function expandRoles(requested: readonly Role[]): QueueRole[] {
  const set = new Set<QueueRole>();
  for (const role of requested) {
    if (role === 'all') ['control', 'rollout', 'train'].forEach((r) => set.add(r as QueueRole));
    else set.add(role);
  }
  return [...set];
}

/**
 * Campaign workflows auto-upgrade: a campaign runs for weeks, and a pinned one would hold its
 * build's workers for its whole life. So every workflow task goes to the current build, whose
 * workflow code must replay the older builds' histories (patched(), the replay tests).
 * The identity names the build, so history events show which build ran each task.
 */
function versioningOptions(deployment: WorkerDeployment | undefined) {
  if (!deployment) return {};
  const { deploymentName, buildId } = deployment;
  return {
    identity: `${process.pid}@${hostname()} ${deploymentName}:${buildId}`,
    workerDeploymentOptions: {
      version: { deploymentName, buildId },
      useWorkerVersioning: true,
      defaultVersioningBehavior: 'AUTO_UPGRADE',
    },
  } as const;
}

export async function createWorkers(opts: RunWorkersOptions): Promise<Worker[]> {
  const graceMs = opts.shutdownGraceMs ?? 20_000;
  const versioning = versioningOptions(opts.deployment);
  return Promise.all(
    expandRoles(opts.roles).map((role) =>
      Worker.create({
        connection: opts.connection,
        namespace: opts.namespace,
        taskQueue: opts.taskQueues[role],
        activities: Object.fromEntries(activitiesByRole[role].map((name) => [name, opts.activities[name]])),
        ...(role === 'control'
          ? opts.workflowBundle
            ? { workflowBundle: opts.workflowBundle }
            : { workflowsPath }
          : {}),
        ...(role === 'rollout' && opts.rolloutRanks !== undefined
          ? { maxConcurrentActivityTaskExecutions: opts.rolloutRanks }
          : {}),
        shutdownGraceTime: graceMs,
        shutdownForceTime: graceMs + 5_000,
        ...versioning,
      }),
    ),
  );
}

/** Runs the workers for `roles` until `signal` aborts (or a worker fails), then shuts all down. */
export async function runWorkers(opts: RunWorkersOptions): Promise<void> {
  const workers = await createWorkers(opts);
  const shutdown = () => {
    for (const w of workers) if (w.getState() === 'RUNNING') w.shutdown();
  };
  const running = workers.map((w) => w.run());
  // A stop that came while the workers were made (a control worker bundles its workflows for
  // seconds) shuts them down now: a worker not yet running cannot be shut down, only left
  // running.
  if (opts.signal?.aborted) shutdown();
  opts.signal?.addEventListener('abort', shutdown, { once: true });
  try {
    await Promise.all(running);
  } catch (err) {
    shutdown();
    await Promise.allSettled(running);
    throw err;
  } finally {
    opts.signal?.removeEventListener('abort', shutdown);
  }
}
