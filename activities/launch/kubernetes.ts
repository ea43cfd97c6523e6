// KubernetesLauncher: a training job is an Indexed Job with one pod per rank (the pod's
// completion index is its rank) and a headless Service through which the ranks find rank 0.
// The API server is the only record of a job: launch() finds the Job by its deterministic name
// and adopts it, so a retry on any worker process follows the same Job instead of starting a
// second one. The Job owns its Service, token Secret and NetworkPolicy (only the job's own pods
// reach its pods), which the garbage collector removes with it. The job is followed through watches of the Job and its pods (kubernetes/watch.ts);
// the objects are built in kubernetes/manifests.ts, failures read in kubernetes/failures.ts,
// API calls made in kubernetes/api.ts with their errors mapped in kubernetes/errors.ts. With a
// Kueue queue (launcher.queueName) a Job waits suspended until admitted (kubernetes/queue.ts).
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import { ApplicationFailure } from '@temporalio/common';
import type { KubernetesLauncher as KubernetesLauncherSpec } from '../../workflows/spec-kubernetes.js';
import { badInputErrorType } from '../types.js';
import { JobApi } from './kubernetes/api.js';
import {
  apiCall,
  isAlreadyExists,
  kubernetesFailure,
  kubernetesUnavailableErrorType,
} from './kubernetes/errors.js';
import {
  currentPods,
  failedJobFailure,
  gangRestarts,
  jobCondition,
  pendingFailure,
  pendingProblem,
  rankStatuses,
} from './kubernetes/failures.js';
import type { PendingProblem } from './kubernetes/failures.js';
import { jobLabel, jobManifest, launchProblem, rankContainerName } from './kubernetes/manifests.js';
import type { TrainerPolicy } from './kubernetes/manifests.js';
import { QueueClock, isQueued } from './kubernetes/queue.js';
import { ListWatch } from './kubernetes/watch.js';
import type { JobFailure, JobStatus, Launcher, TrainJob, TrainJobSpec } from './types.js';

const serviceAccountDir = '/var/run/secrets/kubernetes.io/serviceaccount';

/**
 * The worker's credentials for the API server: the kubeconfig files KUBECONFIG names, else the
 * pod's ServiceAccount when the worker runs in a cluster, else ~/.kube/config.
 */
export function kubeConfigFromEnvironment(env: NodeJS.ProcessEnv = process.env): KubeConfig {
  const config = new KubeConfig();
  const files = (env.KUBECONFIG ?? '').split(delimiter).filter(Boolean);
  if (files.length) {
    config.loadFromFile(files[0]!);
    for (const file of files.slice(1)) {
      const more = new KubeConfig();
      more.loadFromFile(file);
      config.mergeConfig(more);
    }
  } else if (env.KUBERNETES_SERVICE_HOST && existsSync(join(serviceAccountDir, 'token'))) {
    config.loadFromCluster();
  } else {
    const file = join(env.HOME ?? homedir(), '.kube', 'config');
    if (!existsSync(file))
      throw ApplicationFailure.create({
        type: badInputErrorType,
        nonRetryable: true,
        message: `the kubernetes launcher needs the worker's Kubernetes credentials: set KUBECONFIG, write ${file}, or run the worker in the cluster with a ServiceAccount`,
      });
    config.loadFromFile(file);
  }
  return config;
}

export interface KubernetesLauncherOptions {
  /** How long an image may fail to pull, or a container fail to be created, before the job fails. */
  startProblemTimeoutMs?: number;
  /**
   * The worker's shutdown: its jobs stop following (their watches would keep the process
   * alive); the Jobs keep running for the retry, on another worker, to adopt.
   */
  signal?: AbortSignal;
  /** What the operator lets specs choose for trainer pods (MOERL_TRAINER_*); absent: no check here. */
  policy?: TrainerPolicy;
}

export class KubernetesLauncher implements Launcher {
  private readonly api: JobApi;

  constructor(
    kubeConfig: KubeConfig,
    private readonly settings: KubernetesLauncherSpec,
    private readonly opts: KubernetesLauncherOptions = {},
  ) {
    this.api = new JobApi(kubeConfig, settings.namespace);
  }

  async launch(spec: TrainJobSpec, signal?: AbortSignal): Promise<TrainJob> {
    const problem = launchProblem(spec, this.settings, this.opts.policy);
    if (problem)
      throw ApplicationFailure.create({
        type: badInputErrorType,
        nonRetryable: true,
        message: `kubernetes launcher: ${problem}`,
      });
    // Each round either adopts, creates, or removes a failed Job; a few rounds cover racing workers.
    // A cancelled launch stops before each step that could create or wait; what it created is
    // returned, for the caller to kill.
    for (let round = 0; round < 4; round++) {
      signal?.throwIfAborted();
      const existing = await this.api.readJob(spec.name);
      if (existing) {
        const uid = existing.metadata?.uid;
        if (existing.metadata?.deletionTimestamp) {
          await this.api.waitJobGone(spec.name, uid, signal);
          continue;
        }
        if (jobCondition(existing, 'Failed') || jobCondition(existing, 'FailureTarget')) {
          await this.api.deleteJob(spec.name);
          await this.api.waitJobGone(spec.name, uid, signal);
          continue;
        }
        await this.api.ensureService(spec, this.settings, existing);
        await this.api.ensureNetworkPolicy(spec, this.settings, existing);
        await this.api.ensureTokenSecret(spec, this.settings, existing, false);
        return this.follow(spec, existing, true);
      }
      signal?.throwIfAborted();
      const created = await apiCall(
        this.api.call('create', `jobs/${spec.name}`),
        () =>
          this.api.batch.createNamespacedJob({
            namespace: this.settings.namespace,
            body: jobManifest(spec, this.settings),
          }),
        // Another worker created it a moment ago: the next round adopts it.
        (err) => (isAlreadyExists(err) ? null : undefined),
      );
      if (!created) continue;
      await this.api.ensureService(spec, this.settings, created);
      await this.api.ensureNetworkPolicy(spec, this.settings, created);
      await this.api.ensureTokenSecret(spec, this.settings, created, true);
      return this.follow(spec, created, false);
    }
    throw ApplicationFailure.create({
      type: kubernetesUnavailableErrorType,
      message: `job ${spec.name} in namespace ${this.settings.namespace} kept changing while it was being launched`,
    });
  }

  private follow(spec: TrainJobSpec, job: V1Job, adopted: boolean): KubernetesJob {
    const startProblemMs = this.opts.startProblemTimeoutMs ?? 120_000;
    const timeouts = {
      image: startProblemMs,
      config: startProblemMs,
      unschedulable: this.settings.unschedulableTimeoutSeconds * 1000,
    };
    return new KubernetesJob(this.api, spec, job, adopted, timeouts, this.opts.signal);
  }
}

class KubernetesJob implements TrainJob {
  readonly name: string;
  private readonly uid: string;
  private readonly jobs: ListWatch<V1Job>;
  private readonly pods: ListWatch<V1Pod>;
  private final: JobStatus | null = null;
  /** Set while the launcher itself ends the job (a pod that cannot start, kill()). */
  private ending = false;
  private readonly done: Promise<JobStatus>;
  private settle!: { resolve: (s: JobStatus) => void; reject: (err: unknown) => void };
  /** When each pod's start problem (`<uid>/<kind>`) was first seen. */
  private readonly problemsSince = new Map<string, number>();
  private problemTimer: NodeJS.Timeout | undefined;
  /** Time queued for admission (launcher.queueName) apart from time run. */
  private readonly clock = new QueueClock();
  /**
   * The most gang restarts the pods have told so far: once the success policy is met, the Job
   * deletes the ranks still running, and the restart count their annotations carried with them.
   */
  private restartsSeen = 0;

  constructor(
    private readonly api: JobApi,
    private readonly spec: TrainJobSpec,
    job: V1Job,
    readonly adopted: boolean,
    private readonly problemTimeoutMs: Record<PendingProblem['kind'], number>,
    private readonly signal: AbortSignal | undefined,
  ) {
    this.name = spec.name;
    this.uid = job.metadata!.uid!;
    this.done = new Promise((resolve, reject) => (this.settle = { resolve, reject }));
    // wait() may never be called (a worker shutting down): its rejection must not go unhandled.
    this.done.catch(() => undefined);
    const namespace = api.namespace;
    const common = {
      kubeConfig: api.kubeConfig,
      onChange: () => this.evaluate(),
      onFatal: (f: ApplicationFailure) => this.fail(f),
    };
    this.jobs = new ListWatch<V1Job>({
      ...common,
      path: `/apis/batch/v1/namespaces/${namespace}/jobs`,
      selector: { fieldSelector: `metadata.name=${spec.name}` },
      list: () => api.batch.listNamespacedJob({ namespace, fieldSelector: `metadata.name=${spec.name}` }),
      call: api.call('watch', `jobs/${spec.name}`),
    });
    this.pods = new ListWatch<V1Pod>({
      ...common,
      path: `/api/v1/namespaces/${namespace}/pods`,
      selector: { labelSelector: `${jobLabel}=${spec.name}` },
      list: () => api.core.listNamespacedPod({ namespace, labelSelector: `${jobLabel}=${spec.name}` }),
      call: api.call('watch', `pods -l ${jobLabel}=${spec.name}`),
    });
    this.signal?.addEventListener('abort', this.stopFollowing);
    this.jobs.start();
    this.pods.start();
  }

  /** This Job (not an earlier or later one of the same name). */
  private job(): V1Job | null {
    for (const job of this.jobs.objects.values()) if (job.metadata?.uid === this.uid) return job;
    return null;
  }

  private owns(pod: V1Pod): boolean {
    return pod.metadata?.ownerReferences?.some((r) => r.uid === this.uid) ?? false;
  }

  /** This Job's pods (not those of an earlier Job of the same name, while they are removed). */
  private ownPods(): V1Pod[] {
    return [...this.pods.objects.values()].filter((p) => this.owns(p));
  }

  status(): JobStatus {
    if (this.final) return structuredClone(this.final);
    const job = this.job();
    return {
      name: this.name,
      state: job && isQueued(job) ? 'queued' : 'running',
      ranks: rankStatuses(job, this.ownPods(), this.spec.worldSize),
      failure: null,
      restarts: this.countRestarts(),
      ...this.clock.times(),
    };
  }

  private countRestarts(): number {
    this.restartsSeen = Math.max(this.restartsSeen, gangRestarts(this.ownPods()));
    return this.restartsSeen;
  }

  private finish(state: JobStatus['state'], failure: JobFailure | null): void {
    if (this.final) return;
    const status = this.status();
    this.final = { ...status, state, failure };
    this.stopFollowing();
    this.settle.resolve(structuredClone(this.final));
  }

  private fail(failure: ApplicationFailure): void {
    if (this.final) return;
    this.stopFollowing();
    this.settle.reject(failure);
  }

  private readonly stopFollowing = (): void => {
    clearTimeout(this.problemTimer);
    this.signal?.removeEventListener('abort', this.stopFollowing);
    this.jobs.stop();
    this.pods.stop();
  };

  /** Decides from the watched objects whether the job has ended, and how. */
  private evaluate(): void {
    if (this.final || this.ending || !this.jobs.synced || !this.pods.synced) return;
    const job = this.job();
    if (!job) {
      this.finish('failed', {
        rank: null,
        exitCode: null,
        signal: null,
        logTail: `job ${this.name} in namespace ${this.api.namespace} was deleted before it finished`,
        permanent: false,
      });
      return;
    }
    this.clock.observe(job);
    this.countRestarts();
    if (jobCondition(job, 'Complete')) return this.finish('succeeded', null);
    if (jobCondition(job, 'Failed')) {
      const { failure, pod } = failedJobFailure(job, this.ownPods());
      this.ending = true;
      void (pod ? this.api.logTail(pod.metadata!.name!) : Promise.resolve('')).then((log) => {
        this.ending = false;
        this.finish('failed', { ...failure, logTail: [log, failure.logTail].filter(Boolean).join('\n') });
      });
      return;
    }
    if (isQueued(job)) {
      // Waiting for admission, or preempted: no pod is meant to run, so none is late to start.
      clearTimeout(this.problemTimer);
      this.problemsSince.clear();
      return;
    }
    this.checkStartProblems();
  }

  /** A pod that cannot start (image, container config, no room) fails the job after its timeout. */
  private checkStartProblems(): void {
    const now = Date.now();
    const seen = new Set<string>();
    let next = Infinity;
    for (const pod of currentPods(this.ownPods()).values()) {
      const problem = pendingProblem(pod);
      if (!problem) continue;
      const key = `${pod.metadata?.uid}/${problem.kind}`;
      seen.add(key);
      const since = this.problemsSince.get(key) ?? now;
      this.problemsSince.set(key, since);
      const deadline = since + this.problemTimeoutMs[problem.kind];
      if (now >= deadline) {
        // The Job would wait forever: stop its other ranks, then report.
        const failure = pendingFailure(pod, problem, now - since);
        this.ending = true;
        // If it cannot be removed now, the caller's cleanUp() tries again.
        void this.remove()
          .catch(() => undefined)
          .then(() => this.finish('failed', failure));
        return;
      }
      next = Math.min(next, deadline);
    }
    for (const key of this.problemsSince.keys()) if (!seen.has(key)) this.problemsSince.delete(key);
    clearTimeout(this.problemTimer);
    if (next < Infinity) this.problemTimer = setTimeout(() => this.evaluate(), next - now + 10);
  }

  wait(): Promise<JobStatus> {
    return this.done;
  }

  /** Deletes the Job (its pods first) and the Service, and waits until the pods are gone. */
  private async remove(): Promise<void> {
    await this.api.deleteJob(this.name);
    await this.api.waitJobGone(this.name, this.uid);
  }

  /**
   * Never rejects (the caller cancels with it in the background): a Job that could not be
   * deleted is said in the status, and cleanUp(), which the caller awaits, tries again.
   */
  async kill(): Promise<void> {
    this.ending = true;
    const error = await this.remove().then(
      () => null,
      (err: unknown) => (err instanceof Error ? err.message : String(err)),
    );
    this.finish('failed', {
      rank: null,
      exitCode: null,
      signal: 'SIGTERM',
      logTail: error
        ? `job ${this.name} was killed, but not removed: ${error}`
        : `job ${this.name} was killed`,
      permanent: false,
    });
  }

  async cleanUp(): Promise<void> {
    this.ending = true;
    this.stopFollowing();
    await this.api.deleteJob(this.name);
    this.finish('failed', {
      rank: null,
      exitCode: null,
      signal: null,
      logTail: `job ${this.name} was removed before it finished`,
      permanent: false,
    });
  }

  /** One attempt, no retries: the caller reads logs again and again while the job runs. */
  async readLog(rank: number): Promise<Buffer> {
    const pod = currentPods(this.ownPods()).get(rank);
    if (!pod?.metadata?.name) throw new Error(`job ${this.name} has no pod for rank ${rank} (yet)`);
    const name = pod.metadata.name;
    const namespace = this.api.namespace;
    try {
      return Buffer.from(
        await this.api.core.readNamespacedPodLog({ name, namespace, container: rankContainerName }),
      );
    } catch (err) {
      throw kubernetesFailure(err, this.api.call('get', `pods/${name}/log`));
    }
  }
}
