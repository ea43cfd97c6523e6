// The cluster tier's fault kinds (test/integration/temporal-cluster.test.ts, and the matrix of
// bench/temporal_cluster.ts): each a seeded fault of one cluster process, struck while a
// campaign runs, and what it cost against the fault-free run.
import type { Client } from '@temporalio/client';
import { tsToMs } from '@temporalio/common/lib/time.js';
import {
  chaosSpec,
  runTrial,
  type AppliedFault,
  type ChaosStack,
  type Fault,
  type TrialOutcome,
} from './chaos.js';
import { seededRandom } from './s3-fault-proxy.js';

export const clusterFaultKinds = [
  'history SIGKILL',
  'matching restart',
  'postgres restart',
  'postgres stall',
  'frontend SIGKILL',
] as const;
export type ClusterFaultKind = (typeof clusterFaultKinds)[number];

/**
 * The kind's fault, struck mid-rollout or mid-update (drawn from `seed`): at the first moment
 * that activity runs after a time drawn within the first 25 % of the fault-free run's
 * `spanMs` (runs vary in length by half on a loaded machine; a moment is not enough).
 */
export function clusterFault(kind: ClusterFaultKind, seed: number, spanMs: number): Fault {
  const random = seededRandom(seed * 7919 + clusterFaultKinds.indexOf(kind));
  const atMs = Math.round(spanMs * 0.25 * random());
  const during = random() < 0.5 ? 'rolloutShard' : 'updatePolicy';
  const brief = Math.round(2000 * random());
  const at = { atMs, during };
  switch (kind) {
    // Down long enough that the campaign must go on without it, on the other host.
    case 'history SIGKILL':
      return { ...at, target: 'history', signal: 'SIGKILL', downMs: 5000 + brief };
    case 'matching restart':
      return { ...at, target: 'matching', signal: 'SIGTERM', downMs: brief };
    case 'postgres restart':
      return { ...at, target: 'postgres', signal: 'SIGINT', downMs: brief };
    case 'postgres stall':
      return { ...at, target: 'postgres', signal: 'SIGSTOP', downMs: 20_000 };
    case 'frontend SIGKILL':
      return { ...at, target: 'frontend', signal: 'SIGKILL', downMs: brief };
  }
}

export interface ClusterFaultTrial {
  fault: AppliedFault;
  outcome: TrialOutcome;
  /** The campaign's history events recorded while the target was down. */
  servedWhileDown: number;
  summary: string;
}

export async function clusterFaultTrial(
  stack: ChaosStack,
  kind: ClusterFaultKind,
  seed: number,
  reference: TrialOutcome,
  dir: string,
): Promise<ClusterFaultTrial> {
  const schedule = [clusterFault(kind, seed, reference.wallMs)];
  const name = `cluster-${kind.replace(/\W+/g, '-').toLowerCase()}-${seed}`;
  const outcome = await runTrial(stack, chaosSpec(name, dir), schedule, 300_000);
  const fault = outcome.applied[0];
  if (!fault) throw new Error(`${kind} never struck: the campaign finished in ${outcome.wallMs} ms`);
  const servedWhileDown = await eventsBetween(stack.client, outcome.campaignId, fault.struckAt, fault.backAt);
  const summary =
    `${outcome.wallMs} ms (fault-free ${reference.wallMs} ms), struck ${fault.hit} at ${fault.atMs} ms ` +
    `with [${fault.inFlight.join(', ')}] in flight, down ${fault.backAt - fault.struckAt} ms, ` +
    `${servedWhileDown} events meanwhile, runs ${outcome.runs}, lost ${JSON.stringify(outcome.lost)}`;
  return { fault, outcome, servedWhileDown, summary };
}

/** History events of every run of a campaign recorded between two moments. */
async function eventsBetween(
  client: Client,
  campaignId: string,
  fromMs: number,
  toMs: number,
): Promise<number> {
  let count = 0;
  for await (const run of client.workflow.list({ query: `WorkflowId = "${campaignId}"` })) {
    const history = await client.workflow.getHandle(campaignId, run.runId).fetchHistory();
    for (const e of history.events ?? []) {
      const at = tsToMs(e.eventTime);
      if (at >= fromMs && at <= toMs) count++;
    }
  }
  return count;
}
