// What a job's Job object and pods say about its ranks and, once it has failed, why: pure
// functions of the objects the launcher's watches hold (times may be Date objects from a list
// or strings from a watch event). A failure names the rank and its pod and says whether a retry
// can help.
import { constants } from 'node:os';
import type { V1ContainerStateTerminated, V1Job, V1JobCondition, V1Pod } from '@kubernetes/client-node';
import type { JobFailure, RankStatus } from '../types.js';
import { rankPeerLostExitCode, rankStoppedExitCode } from '../types.js';
import {
  completionIndexKey,
  indexFailureCountKey,
  indexIgnoredFailureCountKey,
  rankContainerName,
} from './manifests.js';

type Time = Date | string | undefined;

export function timeMs(t: Time): number {
  return t === undefined ? 0 : new Date(t).getTime();
}

/** The rank of an Indexed Job's pod, or null for a pod without a valid index. */
export function podRank(pod: V1Pod): number | null {
  const text = pod.metadata?.annotations?.[completionIndexKey] ?? pod.metadata?.labels?.[completionIndexKey];
  const rank = Number(text);
  return text !== undefined && text !== '' && Number.isInteger(rank) && rank >= 0 ? rank : null;
}

/** The condition of `type` when it is True. */
export function jobCondition(job: V1Job | null, type: string): V1JobCondition | undefined {
  return job?.status?.conditions?.find((c) => c.type === type && c.status === 'True');
}

/** A pod stopped by a disruption (eviction, preemption, node shutdown): the Job does not count it. */
export function isDisrupted(pod: V1Pod): boolean {
  return (pod.status?.conditions ?? []).some((c) => c.type === 'DisruptionTarget' && c.status === 'True');
}

function termination(pod: V1Pod): V1ContainerStateTerminated | undefined {
  const status = pod.status?.containerStatuses?.find((s) => s.name === rankContainerName);
  return status?.state?.terminated ?? status?.lastState?.terminated;
}

/** The signal that ended the rank: the runtime's report, or the 128+n exit-code convention. */
function signalName(t: V1ContainerStateTerminated | undefined): string | null {
  const number = t?.signal ?? (t && t.exitCode > 128 && t.exitCode < 160 ? t.exitCode - 128 : undefined);
  if (!number) return null;
  return Object.entries(constants.signals).find(([, n]) => n === number)?.[0] ?? `signal ${number}`;
}

/** The newest pod of every rank (a replaced pod's successor is the one that counts). */
export function currentPods(pods: Iterable<V1Pod>): Map<number, V1Pod> {
  const byRank = new Map<number, V1Pod>();
  for (const pod of pods) {
    const rank = podRank(pod);
    if (rank === null) continue;
    const other = byRank.get(rank);
    const newer =
      !other ||
      timeMs(pod.metadata?.creationTimestamp) > timeMs(other.metadata?.creationTimestamp) ||
      (timeMs(pod.metadata?.creationTimestamp) === timeMs(other.metadata?.creationTimestamp) &&
        (pod.metadata?.name ?? '') > (other.metadata?.name ?? ''));
    if (newer) byRank.set(rank, pod);
  }
  return byRank;
}

/** Indexes in the Job's `completedIndexes` ("0-3,5"). */
export function completedIndexes(job: V1Job | null): Set<number> {
  const done = new Set<number>();
  for (const part of (job?.status?.completedIndexes ?? '').split(',').filter(Boolean)) {
    const [from, to = from] = part.split('-').map(Number);
    for (let i = from!; i <= to!; i++) done.add(i);
  }
  return done;
}

export function rankStatuses(job: V1Job | null, pods: Iterable<V1Pod>, worldSize: number): RankStatus[] {
  const current = currentPods(pods);
  const done = completedIndexes(job);
  // Its success policy met, the Job is done for every rank: one rank succeeds only once all
  // have stored their outputs (manifests.ts), and the Job stops the pods still running then.
  const succeeded = jobCondition(job, 'SuccessCriteriaMet') ?? jobCondition(job, 'Complete');
  return Array.from({ length: worldSize }, (_, rank): RankStatus => {
    if (succeeded) return { rank, state: 'succeeded', exitCode: 0, signal: null };
    const pod = current.get(rank);
    const t = pod ? termination(pod) : undefined;
    const phase = pod?.status?.phase;
    // A finished Job's pods may be gone already (its TTL): its completed indexes say enough.
    const state =
      phase === 'Succeeded' || (done.has(rank) && phase !== 'Failed')
        ? 'succeeded'
        : phase === 'Failed'
          ? 'failed'
          : phase === 'Running'
            ? 'running'
            : 'pending';
    return {
      rank,
      state,
      exitCode: t?.exitCode ?? (state === 'succeeded' ? 0 : null),
      signal: signalName(t),
    };
  });
}

/** Why a pending pod does not start, when that will not fix itself without someone acting. */
export interface PendingProblem {
  kind: 'image' | 'config' | 'unschedulable';
  message: string;
}

const imageReasons = new Set(['ErrImagePull', 'ImagePullBackOff', 'InvalidImageName', 'ErrImageNeverPull']);
const configReasons = new Set(['CreateContainerConfigError', 'CreateContainerError', 'RunContainerError']);

export function pendingProblem(pod: V1Pod): PendingProblem | null {
  if (pod.status?.phase !== 'Pending' || pod.metadata?.deletionTimestamp) return null;
  const unschedulable = pod.status.conditions?.find(
    (c) => c.type === 'PodScheduled' && c.status === 'False' && c.reason === 'Unschedulable',
  );
  if (unschedulable) return { kind: 'unschedulable', message: unschedulable.message ?? 'no reason given' };
  const waiting = pod.status.containerStatuses?.find((s) => s.name === rankContainerName)?.state?.waiting;
  if (waiting?.reason && imageReasons.has(waiting.reason))
    return { kind: 'image', message: waiting.message ?? waiting.reason };
  if (waiting?.reason && configReasons.has(waiting.reason))
    return { kind: 'config', message: `${waiting.reason}: ${waiting.message ?? 'no message'}` };
  return null;
}

function who(pod: V1Pod): string {
  return `rank ${podRank(pod)} (pod ${pod.metadata?.name})`;
}

/**
 * The failure of a job whose pod has had `problem` for `waitedMs`: an image that cannot be
 * pulled and a container that cannot be created are the spec's to fix; a pod the scheduler has
 * no room for may fit on a retry (nodes come and go).
 */
export function pendingFailure(pod: V1Pod, problem: PendingProblem, waitedMs: number): JobFailure {
  const seconds = Math.round(waitedMs / 1000);
  const image = pod.spec?.containers.find((c) => c.name === rankContainerName)?.image;
  const account =
    problem.kind === 'image'
      ? `${who(pod)}: image ${image} cannot be pulled: ${problem.message} (for ${seconds} s; check launcher.image and the pull secret)`
      : problem.kind === 'config'
        ? `${who(pod)} cannot start its container: ${problem.message} (for ${seconds} s)`
        : `${who(pod)} could not be scheduled for ${seconds} s (launcher.unschedulableTimeoutSeconds): ${problem.message}`;
  return {
    rank: podRank(pod),
    exitCode: null,
    signal: null,
    logTail: account,
    permanent: problem.kind !== 'unschedulable',
  };
}

/** What happened to a failed pod, in one line. */
export function podAccount(pod: V1Pod): string {
  const t = termination(pod);
  if (t?.reason === 'OOMKilled') {
    const limit = pod.spec?.containers.find((c) => c.name === rankContainerName)?.resources?.limits?.memory;
    return `${who(pod)} was OOMKilled: raise launcher.memory${limit ? ` (now ${limit})` : ''}`;
  }
  if (t?.exitCode === 2) return `${who(pod)} exited with code 2 (bad input): not retried`;
  if (t?.exitCode === rankPeerLostExitCode)
    return `${who(pod)} exited with code ${rankPeerLostExitCode} (a peer was lost): restarted with the job's other ranks`;
  if (t) return `${who(pod)} exited with code ${t.exitCode}${t.reason ? ` (${t.reason})` : ''}`;
  const reason = [pod.status?.reason, pod.status?.message].filter(Boolean).join(': ');
  return `${who(pod)} failed${reason ? `: ${reason}` : ''}`;
}

/** Exit codes the podFailurePolicy ignores: a stopped rank and one whose peer was lost. */
const ignoredExitCodes = new Set([rankStoppedExitCode, rankPeerLostExitCode]);

/** The failed pods the Job counts (not those its podFailurePolicy ignores), in the order they failed. */
function countedFailures(pods: Iterable<V1Pod>): V1Pod[] {
  const finished = (p: V1Pod) => timeMs(termination(p)?.finishedAt) || timeMs(p.metadata?.creationTimestamp);
  return [...pods]
    .filter(
      (p) =>
        p.status?.phase === 'Failed' &&
        !isDisrupted(p) &&
        !ignoredExitCodes.has(termination(p)?.exitCode ?? -1),
    )
    .sort((a, b) => finished(a) - finished(b));
}

/**
 * Gang restarts of a job so far: the most times one rank was started again after a loss, as
 * the Job controller writes on each pod it makes (the failures of its rank before it, counted
 * and ignored). A gang restart starts every rank again once, so it counts once however many
 * ranks were lost at a time; a rank replaced alone while the group was still forming counts
 * once too. Read from the newest pods, so pods already gone (force-deleted, or removed once
 * the Job had counted them) still count, and pods the Job stopped after it succeeded do not.
 */
export function gangRestarts(pods: Iterable<V1Pod>): number {
  let most = 0;
  for (const pod of pods) {
    const annotations = pod.metadata?.annotations ?? {};
    const failures = [indexFailureCountKey, indexIgnoredFailureCountKey]
      .map((key) => Number(annotations[key] ?? 0))
      .reduce((a, b) => a + b, 0);
    if (Number.isInteger(failures)) most = Math.max(most, failures);
  }
  return most;
}

/**
 * Why a Job with the Failed condition failed: the pod its podFailurePolicy failed it for (exit
 * 2: permanent), else the first counted pod failure (OOMKilled, a crash: retryable), with the
 * Job's own reason (BackoffLimitExceeded, DeadlineExceeded). `pod` is whose log to quote.
 */
export function failedJobFailure(
  job: V1Job,
  pods: Iterable<V1Pod>,
): { failure: JobFailure; pod: V1Pod | null } {
  const failed = jobCondition(job, 'Failed') ?? jobCondition(job, 'FailureTarget');
  const reason = failed?.reason ?? 'Failed';
  const jobAccount = `job ${job.metadata?.name}: ${reason}${failed?.message ? `: ${failed.message}` : ''}`;
  const permanent = reason === 'PodFailurePolicy';
  const counted = countedFailures(pods);
  const pod =
    reason === 'DeadlineExceeded'
      ? undefined
      : permanent
        ? (counted.find((p) => termination(p)?.exitCode === 2) ?? counted[0])
        : counted[0];
  if (!pod)
    return {
      failure: { rank: null, exitCode: null, signal: null, logTail: jobAccount, permanent },
      pod: null,
    };
  const t = termination(pod);
  return {
    failure: {
      rank: podRank(pod),
      exitCode: t?.exitCode ?? null,
      signal: signalName(t),
      logTail: `${podAccount(pod)}; ${jobAccount}`,
      permanent,
    },
    pod,
  };
}
