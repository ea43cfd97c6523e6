// The API calls the KubernetesLauncher makes for one namespace: reading, creating and
// deleting a job's Job and Service, creating its token Secret and NetworkPolicy, and reading its
// pods' logs, each through errors.ts's mapping and retries.
import { setTimeout as sleep } from 'node:timers/promises';
import { BatchV1Api, CoreV1Api, NetworkingV1Api } from '@kubernetes/client-node';
import type { KubeConfig, V1Job, V1ObjectMeta, V1Service } from '@kubernetes/client-node';
import { ApplicationFailure } from '@temporalio/common';
import type { KubernetesLauncher as KubernetesLauncherSpec } from '../../../workflows/spec-kubernetes.js';
import type { TrainJobSpec } from '../types.js';
import { apiCall, isAlreadyExists, isNotFound, kubernetesUnavailableErrorType } from './errors.js';
import type { ApiCall } from './errors.js';
import { newJobToken } from '../rendezvous.js';
import {
  jobLabel,
  networkPolicyManifest,
  networkPolicyName,
  rankContainerName,
  serviceManifest,
  serviceName,
  tokenSecretManifest,
  tokenSecretName,
} from './manifests.js';

/** Lines of a failed rank's log quoted in its failure. */
const failureLogLines = 40;
const logTailChars = 4096;
/** A Job being deleted is gone once its pods have stopped (grace period) and been collected. */
const deletionTimeoutMs = 180_000;

export class JobApi {
  readonly batch: BatchV1Api;
  readonly core: CoreV1Api;
  readonly networking: NetworkingV1Api;
  constructor(
    readonly kubeConfig: KubeConfig,
    readonly namespace: string,
  ) {
    this.batch = kubeConfig.makeApiClient(BatchV1Api);
    this.core = kubeConfig.makeApiClient(CoreV1Api);
    this.networking = kubeConfig.makeApiClient(NetworkingV1Api);
  }

  call(verb: string, resource: string): ApiCall {
    return { verb, resource, namespace: this.namespace };
  }

  readJob(name: string): Promise<V1Job | null> {
    return apiCall(
      this.call('get', `jobs/${name}`),
      () => this.batch.readNamespacedJob({ name, namespace: this.namespace }),
      (err) => (isNotFound(err) ? null : undefined),
    );
  }

  readService(name: string): Promise<V1Service | null> {
    return apiCall(
      this.call('get', `services/${name}`),
      () => this.core.readNamespacedService({ name, namespace: this.namespace }),
      (err) => (isNotFound(err) ? null : undefined),
    );
  }

  /** Deletes the Job after its pods (foreground) and its Service; gone already is fine. */
  async deleteJob(name: string): Promise<void> {
    const gone = (err: unknown) => (isNotFound(err) ? null : undefined);
    await apiCall(
      this.call('delete', `jobs/${name}`),
      () =>
        this.batch.deleteNamespacedJob({ name, namespace: this.namespace, propagationPolicy: 'Foreground' }),
      gone,
    );
    const service = serviceName(name);
    await apiCall(
      this.call('delete', `services/${service}`),
      () => this.core.deleteNamespacedService({ name: service, namespace: this.namespace }),
      gone,
    );
  }

  /**
   * Resolves once the Job `uid`, its pods and its Service no longer exist. Foreground deletion
   * removes the pods first, but the garbage collector may not have seen a pod created a moment
   * before; such a pod outlives the Job, and is deleted here rather than left to the collector.
   * The Service, a dependent too, may stay a moment after the Job under the collector's finalizer.
   * An aborted `signal` stops the wait (rejecting with its reason); the deletion goes on.
   */
  async waitJobGone(name: string, uid: string | undefined, signal?: AbortSignal): Promise<void> {
    const deadline = Date.now() + deletionTimeoutMs;
    for (let pauseMs = 250; ; pauseMs = Math.min(pauseMs * 2, 2000)) {
      signal?.throwIfAborted();
      const job = await this.readJob(name);
      const pods = await apiCall(this.call('list', `pods -l ${jobLabel}=${name}`), () =>
        this.core.listNamespacedPod({ namespace: this.namespace, labelSelector: `${jobLabel}=${name}` }),
      );
      const service = await this.readService(serviceName(name));
      const owned = (o: { metadata?: V1ObjectMeta } | null) =>
        o?.metadata?.ownerReferences?.some((r) => r.uid === uid);
      const left = pods.items.filter(owned);
      const jobGone = !job || job.metadata?.uid !== uid;
      if (jobGone && left.length === 0 && !owned(service)) return;
      if (jobGone)
        for (const pod of left.filter((p) => !p.metadata?.deletionTimestamp)) {
          const podName = pod.metadata!.name!;
          await apiCall(
            this.call('delete', `pods/${podName}`),
            () => this.core.deleteNamespacedPod({ name: podName, namespace: this.namespace }),
            (err) => (isNotFound(err) ? null : undefined),
          );
        }
      if (Date.now() > deadline)
        throw ApplicationFailure.create({
          type: kubernetesUnavailableErrorType,
          message: `job ${name} in namespace ${this.namespace} is still being deleted after ${deletionTimeoutMs / 1000} s (${left.length} pods left: kubectl -n ${this.namespace} get pods -l ${jobLabel}=${name})`,
        });
      await sleep(pauseMs, undefined, { signal });
    }
  }

  /** The job's Service, created if missing; one left over from an earlier Job is replaced. */
  ensureService(spec: TrainJobSpec, settings: KubernetesLauncherSpec, job: V1Job): Promise<void> {
    const owner = { name: spec.name, uid: job.metadata!.uid! };
    const name = serviceName(spec.name);
    return this.ensureOwned(spec, owner.uid, {
      what: `service ${name}`,
      resource: `services/${name}`,
      create: () =>
        this.core.createNamespacedService({
          namespace: this.namespace,
          body: serviceManifest(spec, settings, owner),
        }),
      read: () => this.core.readNamespacedService({ name, namespace: this.namespace }),
      remove: () => this.core.deleteNamespacedService({ name, namespace: this.namespace }),
    });
  }

  /**
   * The job's NetworkPolicy (networkPolicyManifest), created if missing; one left over from an
   * earlier Job of the same name (its collection pending) is replaced. Until it exists the job's
   * pods take no connection (the namespace's moerl-trainer policy): the ranks' rendezvous waits.
   */
  ensureNetworkPolicy(spec: TrainJobSpec, settings: KubernetesLauncherSpec, job: V1Job): Promise<void> {
    const owner = { name: spec.name, uid: job.metadata!.uid! };
    const name = networkPolicyName(spec.name);
    return this.ensureOwned(spec, owner.uid, {
      what: `network policy ${name}`,
      resource: `networkpolicies/${name}`,
      create: () =>
        this.networking.createNamespacedNetworkPolicy({
          namespace: this.namespace,
          body: networkPolicyManifest(spec, settings, owner),
        }),
      read: () => this.networking.readNamespacedNetworkPolicy({ name, namespace: this.namespace }),
      remove: () => this.networking.deleteNamespacedNetworkPolicy({ name, namespace: this.namespace }),
    });
  }

  // An object the Job owns, created if missing; one of the same name owned by another (an
  // earlier Job's, its collection pending) is deleted and made again, a few rounds at most.
  private async ensureOwned(
    spec: TrainJobSpec,
    ownerUid: string,
    object: {
      /** "service <name>", for the error. */
      what: string;
      resource: string;
      create: () => Promise<unknown>;
      read: () => Promise<{ metadata?: V1ObjectMeta }>;
      remove: () => Promise<unknown>;
    },
  ): Promise<void> {
    const gone = (err: unknown) => (isNotFound(err) ? null : undefined);
    for (let round = 0; round < 3; round++) {
      const created = await apiCall(this.call('create', object.resource), object.create, (err) =>
        isAlreadyExists(err) ? null : undefined,
      );
      if (created) return;
      const existing = await apiCall(this.call('get', object.resource), object.read, gone);
      if (!existing) continue;
      if (existing.metadata?.ownerReferences?.some((r) => r.uid === ownerUid)) return;
      await apiCall(this.call('delete', object.resource), object.remove, gone);
    }
    throw ApplicationFailure.create({
      type: kubernetesUnavailableErrorType,
      message: `${object.what} in namespace ${this.namespace} keeps being replaced while job ${spec.name} starts`,
    });
  }

  /**
   * The job's token Secret (tokenSecretManifest) with a fresh token. For a Job just created, a
   * Secret of the same name left by an earlier Job (its collection pending) is replaced; an
   * adopted Job keeps the Secret its pods already use, which is only created if it is missing.
   * Secrets are created and deleted here, never read.
   */
  async ensureTokenSecret(
    spec: TrainJobSpec,
    settings: KubernetesLauncherSpec,
    job: V1Job,
    replace: boolean,
  ): Promise<void> {
    const owner = { name: spec.name, uid: job.metadata!.uid! };
    const name = tokenSecretName(spec.name);
    for (let round = 0; round < 3; round++) {
      const created = await apiCall(
        this.call('create', `secrets/${name}`),
        () =>
          this.core.createNamespacedSecret({
            namespace: this.namespace,
            body: tokenSecretManifest(spec, settings, owner, newJobToken()),
          }),
        (err) => (isAlreadyExists(err) ? null : undefined),
      );
      if (created || !replace) return;
      await apiCall(
        this.call('delete', `secrets/${name}`),
        () => this.core.deleteNamespacedSecret({ name, namespace: this.namespace }),
        (err) => (isNotFound(err) ? null : undefined),
      );
    }
    throw ApplicationFailure.create({
      type: kubernetesUnavailableErrorType,
      message: `secret ${name} in namespace ${this.namespace} keeps coming back while job ${spec.name} starts`,
    });
  }

  /** The last lines of a pod's rank log; empty when it has none (never started, node gone). */
  async logTail(pod: string): Promise<string> {
    const text = await Promise.race([
      this.core
        .readNamespacedPodLog({
          name: pod,
          namespace: this.namespace,
          container: rankContainerName,
          tailLines: failureLogLines,
        })
        .catch(() => ''),
      sleep(10_000, ''),
    ]);
    return text.slice(-logTailChars).trim();
  }
}
