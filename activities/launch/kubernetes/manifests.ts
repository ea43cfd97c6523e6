// The objects the KubernetesLauncher creates for one training job, as pure builders: an Indexed
// Job with one pod per rank, and a headless Service through which the ranks reach rank 0. Kept
// free of API calls so the exact objects are unit-tested (test/unit/kubernetes-launcher-*).
import { createHash } from 'node:crypto';
import type {
  V1Container,
  V1EnvVar,
  V1Job,
  V1NetworkPolicy,
  V1OwnerReference,
  V1Secret,
  V1Service,
  V1Volume,
  V1VolumeMount,
} from '@kubernetes/client-node';
import { kueueQueueLabel } from '../../../workflows/spec-kubernetes.js';
import type { KubernetesLauncher as KubernetesLauncherSpec } from '../../../workflows/spec-kubernetes.js';
import { rankDeadlines } from '../../../workflows/spec-rendezvous.js';
import { deadlineEnv, rendezvousEnv } from '../rendezvous.js';
import { rankEnv, rankPeerLostExitCode, rankStoppedExitCode } from '../types.js';
import type { TrainJobSpec } from '../types.js';

/** The rank program in the trainer image, relative to its WORKDIR (/app in the Dockerfile). */
export const rankProgramCommand = ['node', 'dist/workers/rank.js'];
/** The container that runs the rank program; podFailurePolicy and logs name it. */
export const rankContainerName = 'rank';
/** Each rank's scratch directory (MOERL_WORK_DIR), an emptyDir of its own. */
export const rankWorkDir = '/var/lib/moerl/work';
/** The annotation (and label) of an Indexed Job's pod holding its completion index: the rank. */
export const completionIndexKey = 'batch.kubernetes.io/job-completion-index';
/** The failures of a pod's rank before the Job controller made it: counted, and ignored. */
export const indexFailureCountKey = 'batch.kubernetes.io/job-index-failure-count';
export const indexIgnoredFailureCountKey = 'batch.kubernetes.io/job-index-ignored-failure-count';
/** The label every object of one job carries: one selector finds (and deletes) all of them. */
export const jobLabel = 'moerl.dev/job';
/**
 * The annotation holding the campaign id as it is (its label may be shortened and hashed): the
 * control worker's sweep (kubernetes/sweep.ts) asks Temporal about the campaign by it.
 */
export const campaignIdAnnotation = 'moerl.dev/campaign-id';
/** activeDeadlineSeconds of a Job when neither the launcher settings nor the job name one. */
export const defaultActiveDeadlineSeconds = 24 * 3600;
/** The unprivileged user (and group) the Dockerfile's image runs as. */
export const rankUser = 65532;

const maxLabelValue = 63;
const dns1123Label = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/**
 * `value` as a label value (≤ 63 of letters, digits, "-", "_", ".", alphanumeric at both ends).
 * A value that had to change ends in a hash of the original, so two campaign ids that differ
 * only in dropped characters still get different labels.
 */
export function labelValue(value: string): string {
  const cleaned = value.replace(/[^A-Za-z0-9._-]/g, '-').replace(/^[^A-Za-z0-9]+|[^A-Za-z0-9]+$/g, '');
  if (cleaned === value && value.length <= maxLabelValue) return value;
  const hash = createHash('sha256').update(value).digest('hex').slice(0, 8);
  const head = cleaned.slice(0, maxLabelValue - hash.length - 1).replace(/[^A-Za-z0-9]+$/, '');
  return head ? `${head}-${hash}` : hash;
}

/**
 * What the operator lets a campaign spec choose for trainer pods: the train worker's
 * MOERL_TRAINER_* settings, from the same ConfigMap (k8s/base: moerl-trainer-policy) that is the
 * parameter of the API server's admission policy (k8s/base/admission/trainer_jobs_policy.yaml).
 * The launcher refuses a spec outside them before it creates anything; the API server would
 * refuse its Job anyway. Empty store fields allow no such volume; empty lists allow nothing.
 */
export interface TrainerPolicy {
  /** launcher.image must be `<imageRepository>:<tag>` or `<imageRepository>@<digest>`. */
  imageRepository: string;
  /** launcher.serviceAccount must be this one. */
  serviceAccount: string;
  /** The one directory launcher.storeVolume.hostPath may name; empty: none. */
  storeHostPath: string;
  /** The one claim launcher.storeVolume.claimName may name; empty: none. */
  storeClaim: string;
  /** The PriorityClasses launcher.priorityClassName may name (exact names); empty: none. */
  priorityClasses: string[];
  /**
   * The taints trainer pods may tolerate, as `key:Effect`: each of launcher.tolerations must name
   * a key and an effect that are listed (any operator and value); empty: no toleration.
   */
  tolerations: string[];
}

/** The worker settings holding a TrainerPolicy, by field. */
export const trainerPolicyEnv = {
  imageRepository: 'MOERL_TRAINER_IMAGE_REPOSITORY',
  serviceAccount: 'MOERL_TRAINER_SERVICE_ACCOUNT',
  storeHostPath: 'MOERL_TRAINER_STORE_HOST_PATH',
  storeClaim: 'MOERL_TRAINER_STORE_CLAIM',
  priorityClasses: 'MOERL_TRAINER_PRIORITY_CLASSES',
  tolerations: 'MOERL_TRAINER_TOLERATIONS',
} as const satisfies Record<keyof TrainerPolicy, string>;

/**
 * The policy a worker's environment sets, or undefined when it sets none of the variables (a
 * worker outside the manifests of k8s/: no image, account or volume check of its own; the
 * placement lists are empty for it, see launchProblem). One variable set and the others not
 * allows nothing for the others. The lists are comma-separated.
 */
export function trainerPolicyFromEnv(env: NodeJS.ProcessEnv): TrainerPolicy | undefined {
  const names = Object.values(trainerPolicyEnv);
  if (!names.some((name) => env[name] !== undefined)) return undefined;
  const value = (name: string) => (env[name] ?? '').trim();
  const list = (name: string) =>
    value(name)
      .split(',')
      .map((item) => item.trim())
      .filter(Boolean);
  return {
    imageRepository: value(trainerPolicyEnv.imageRepository),
    serviceAccount: value(trainerPolicyEnv.serviceAccount),
    storeHostPath: value(trainerPolicyEnv.storeHostPath),
    storeClaim: value(trainerPolicyEnv.storeClaim),
    priorityClasses: list(trainerPolicyEnv.priorityClasses),
    tolerations: list(trainerPolicyEnv.tolerations),
  };
}

type Placement = Pick<TrainerPolicy, 'priorityClasses' | 'tolerations'>;
type Toleration = NonNullable<KubernetesLauncherSpec['tolerations']>[number];

/** A toleration as the spec wrote it, for a message. */
function describeToleration(t: Toleration): string {
  const fields = Object.entries(t).map(([k, v]) => `${k}: ${String(v)}`);
  return `{${fields.join(', ')}}`;
}

/**
 * What in the spec's placement the operator does not allow: a PriorityClass not listed (one of
 * system-node-critical or system-cluster-critical pre-empts other workloads, and any class can
 * outrank other teams' pods), or a toleration of a taint not listed (a toleration without a key
 * tolerates every taint, without an effect every effect of its key, so those are never listed).
 * Checked whatever else the worker's policy sets: without MOERL_TRAINER_* nothing is listed.
 */
function placementProblem(launcher: KubernetesLauncherSpec, allowed: Placement): string | undefined {
  const list = (field: keyof Placement) =>
    `${trainerPolicyEnv[field]}=${allowed[field].join(',')}${allowed[field].length ? '' : ' (empty: none)'}`;
  const priorityClass = launcher.priorityClassName;
  if (priorityClass !== undefined && !allowed.priorityClasses.includes(priorityClass))
    return `launcher.priorityClassName ${priorityClass} is not a PriorityClass this worker's operator allows (${list('priorityClasses')})`;
  for (const [index, t] of (launcher.tolerations ?? []).entries()) {
    const why =
      t.key === undefined
        ? 'tolerates every taint (no key)'
        : t.effect === undefined
          ? `tolerates every effect of ${t.key} (no effect)`
          : allowed.tolerations.includes(`${t.key}:${t.effect}`)
            ? undefined
            : `tolerates ${t.key}:${t.effect}`;
    if (why)
      return `launcher.tolerations[${index}] ${describeToleration(t)} ${why}, which this worker's operator does not allow (${list('tolerations')}, each key:Effect)`;
  }
  return undefined;
}

/** Pod annotations that would loosen a container's confinement; no spec sets them. */
const confinementAnnotationPrefixes = [
  'container.apparmor.security.beta.kubernetes.io/',
  'seccomp.security.alpha.kubernetes.io/',
];

/** What in `launcher` the operator's policy does not allow, naming the setting; or undefined. */
function policyProblem(launcher: KubernetesLauncherSpec, policy: TrainerPolicy): string | undefined {
  const setting = (field: Exclude<keyof TrainerPolicy, keyof Placement>) =>
    `${trainerPolicyEnv[field]}=${policy[field]}`;
  const repository = policy.imageRepository;
  if (
    !repository ||
    !(launcher.image.startsWith(`${repository}:`) || launcher.image.startsWith(`${repository}@`))
  )
    return `launcher.image ${launcher.image} is not an image of the repository this worker's operator allows (${setting('imageRepository')})`;
  if (!policy.serviceAccount || launcher.serviceAccount !== policy.serviceAccount)
    return `launcher.serviceAccount ${launcher.serviceAccount ?? '(absent: the namespace default)'} is not the trainer ServiceAccount this worker's operator allows (${setting('serviceAccount')})`;
  const volume = launcher.storeVolume;
  if (volume && 'hostPath' in volume && (!policy.storeHostPath || volume.hostPath !== policy.storeHostPath))
    return `launcher.storeVolume.hostPath ${volume.hostPath} is not the store directory this worker's operator allows (${setting('storeHostPath')})`;
  if (volume && 'claimName' in volume && (!policy.storeClaim || volume.claimName !== policy.storeClaim))
    return `launcher.storeVolume.claimName ${volume.claimName} is not the store claim this worker's operator allows (${setting('storeClaim')})`;
  return undefined;
}

/**
 * What makes `spec` impossible to run with `launcher`, or undefined. The job name names the Job
 * and its pods' hostnames `<name>-<rank>`, which must be DNS-1123 labels of at most 63
 * characters; an fs store must come with the volume that holds it; annotations never loosen
 * AppArmor or seccomp; a PriorityClass and tolerations must be ones the operator's `policy`
 * lists (none without one); and with its `policy`, image, ServiceAccount and store volume must
 * be ones it allows.
 */
export function launchProblem(
  spec: TrainJobSpec,
  launcher: KubernetesLauncherSpec,
  policy?: TrainerPolicy,
): string | undefined {
  const longest = `${spec.name}-${spec.worldSize - 1}`;
  if (!dns1123Label.test(spec.name))
    return `job name ${JSON.stringify(spec.name)} must be a DNS-1123 label: lowercase letters, digits and "-", alphanumeric at both ends`;
  if (longest.length > 63)
    return `job name ${JSON.stringify(spec.name)} is too long for ${spec.worldSize} ranks: pod hostname ${longest} would pass 63 characters`;
  if (spec.job.store.kind === 'fs' && !launcher.storeVolume)
    return `launcher.storeVolume is required with an fs store (${spec.job.store.path}): trainer pods mount the shared filesystem holding it`;
  const confining = Object.keys(launcher.annotations ?? {}).find((key) =>
    confinementAnnotationPrefixes.some((prefix) => key.startsWith(prefix)),
  );
  if (confining)
    return `launcher.annotations.${confining}: trainer pods keep their AppArmor and seccomp profiles (RuntimeDefault); annotations under ${confinementAnnotationPrefixes.join(' or ')} are not allowed`;
  return (
    placementProblem(launcher, policy ?? { priorityClasses: [], tolerations: [] }) ??
    (policy ? policyProblem(launcher, policy) : undefined)
  );
}

/** The headless Service's name: the job's, unless that starts with a digit (a Service name must not). */
export function serviceName(jobName: string): string {
  return /^[a-z]/.test(jobName) ? jobName : `j${jobName}`.slice(0, 63);
}

/** Host and port of rank 0 as every rank resolves it through the headless Service. */
export function coordinatorAddress(jobName: string, namespace: string, port: number): string {
  return `${jobName}-0.${serviceName(jobName)}.${namespace}.svc:${port}`;
}

/** The launcher's own labels on the Job, its Service and its pods. */
export function ownerLabels(spec: TrainJobSpec): Record<string, string> {
  return {
    'app.kubernetes.io/name': 'moerl',
    'app.kubernetes.io/component': 'trainer',
    'app.kubernetes.io/part-of': 'moerl',
    'app.kubernetes.io/managed-by': 'moerl',
    'moerl.dev/campaign': labelValue(spec.owner.campaignId),
    'moerl.dev/iteration': String(spec.owner.iteration),
    'moerl.dev/attempt': String(spec.owner.attempt),
    [jobLabel]: spec.name,
  };
}

function metadata(spec: TrainJobSpec, launcher: KubernetesLauncherSpec, name: string) {
  return {
    name,
    namespace: launcher.namespace,
    // The spec's labels cannot use moerl.dev/ (validated), so they never replace the owner labels.
    labels: { ...launcher.labels, ...ownerLabels(spec) },
    annotations: { ...launcher.annotations, [campaignIdAnnotation]: spec.owner.campaignId },
  };
}

/** The environment of every rank: the job's extras, the spec's, and the rank contract last. */
function rankEnvironment(spec: TrainJobSpec, launcher: KubernetesLauncherSpec): V1EnvVar[] {
  const values: Record<string, string> = {
    ...spec.env,
    ...launcher.env,
    [rankEnv.worldSize]: String(spec.worldSize),
    [rankEnv.coordinator]: coordinatorAddress(spec.name, launcher.namespace, launcher.coordinatorPort),
    [rankEnv.provider]: spec.provider,
    [rankEnv.job]: JSON.stringify(spec.job),
    [rankEnv.workDir]: rankWorkDir,
    ...deadlineEnv(rankDeadlines(launcher)),
  };
  for (const name of [rankEnv.rank, rendezvousEnv.bindAddress, rendezvousEnv.jobToken]) delete values[name];
  return [
    // Each pod's index, set by the Job controller on the pod: the pods share one template.
    {
      name: rankEnv.rank,
      valueFrom: { fieldRef: { fieldPath: `metadata.annotations['${completionIndexKey}']` } },
    },
    // Rank 0 listens on its own pod IP, the address its Service name resolves to, and no other.
    { name: rendezvousEnv.bindAddress, valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
    // The job's secret, from the job's own Secret: never in the Job or pod objects themselves.
    {
      name: rendezvousEnv.jobToken,
      valueFrom: { secretKeyRef: { name: tokenSecretName(spec.name), key: tokenSecretKey } },
    },
    ...Object.entries(values).map(([name, value]) => ({ name, value })),
  ];
}

function resources(launcher: KubernetesLauncherSpec): V1Container['resources'] {
  // Requests equal limits: ranks of one collective should not be throttled unevenly, and
  // extended resources and huge pages allow nothing else.
  const amounts: Record<string, string> = {};
  if (launcher.cpu) amounts.cpu = launcher.cpu;
  if (launcher.memory) amounts.memory = launcher.memory;
  if (launcher.hugepages2Mi) amounts['hugepages-2Mi'] = launcher.hugepages2Mi;
  if (launcher.gpusPerRank > 0) amounts['nvidia.com/gpu'] = String(launcher.gpusPerRank);
  if (launcher.efaPerRank > 0) amounts['vpc.amazonaws.com/efa'] = String(launcher.efaPerRank);
  return Object.keys(amounts).length ? { requests: { ...amounts }, limits: { ...amounts } } : undefined;
}

function volumes(
  spec: TrainJobSpec,
  launcher: KubernetesLauncherSpec,
): { volumes: V1Volume[]; mounts: V1VolumeMount[] } {
  const list: V1Volume[] = [
    { name: 'work', emptyDir: {} },
    // The container runtime's /dev/shm is 64 MiB; libfabric's shm provider needs more.
    { name: 'dshm', emptyDir: { medium: 'Memory', sizeLimit: launcher.shmSize } },
  ];
  const mounts: V1VolumeMount[] = [
    { name: 'work', mountPath: rankWorkDir },
    { name: 'dshm', mountPath: '/dev/shm' },
  ];
  const store = spec.job.store;
  const volume = launcher.storeVolume;
  if (store.kind === 'fs' && volume) {
    list.push(
      'claimName' in volume
        ? { name: 'store', persistentVolumeClaim: { claimName: volume.claimName } }
        : { name: 'store', hostPath: { path: volume.hostPath, type: 'Directory' } },
    );
    mounts.push({ name: 'store', mountPath: store.path });
  }
  return { volumes: list, mounts };
}

/**
 * The Indexed Job: one pod per rank (index = rank), never restarted in place; the Job replaces
 * a failed pod up to backoffLimit times, but not for a disruption (a Spot reclaim, an
 * eviction, a rank stopped by SIGTERM) and never after exit 2 (bad input: the same input fails
 * again).
 */
export function jobManifest(spec: TrainJobSpec, launcher: KubernetesLauncherSpec): V1Job {
  const meta = metadata(spec, launcher, spec.name);
  // With a Kueue queue the Job is created suspended and Kueue admits it by unsuspending it; the
  // label goes on the Job only (Kueue reads it there), not on its pods or Service.
  const queue = launcher.queueName;
  const { volumes: podVolumes, mounts } = volumes(spec, launcher);
  const container: V1Container = {
    name: rankContainerName,
    image: launcher.image,
    imagePullPolicy: launcher.imagePullPolicy,
    command: rankProgramCommand,
    env: rankEnvironment(spec, launcher),
    ports: [{ name: 'coordinator', containerPort: launcher.coordinatorPort, protocol: 'TCP' }],
    resources: resources(launcher),
    volumeMounts: mounts,
    securityContext: {
      allowPrivilegeEscalation: false,
      // No capability, with EFA either: an added one (IPC_LOCK for registering buffers) never
      // reaches a non-root process (Kubernetes sets no ambient capabilities), and both the
      // restricted and the baseline Pod Security levels refuse it. The ranks' locked memory is
      // the node's container runtime's RLIMIT_MEMLOCK.
      capabilities: { drop: ['ALL'] },
    },
  };
  return {
    apiVersion: 'batch/v1',
    kind: 'Job',
    metadata: queue ? { ...meta, labels: { ...meta.labels, [kueueQueueLabel]: queue } } : meta,
    spec: {
      ...(queue ? { suspend: true } : {}),
      completionMode: 'Indexed',
      completions: spec.worldSize,
      parallelism: spec.worldSize,
      backoffLimit: launcher.backoffLimit,
      // Per rank too, for the delay before a replacement: the Job controller then waits by that
      // rank's own failures (10 s, doubling), not by every pod failed since the last success.
      // After a gang restart of EP 8 (eight failed pods, seven of them ignored) the Job-wide
      // delay would be 10 s × 2^7, capped at 10 minutes. maxFailedIndexes 0: a rank out of
      // retries fails the Job at once, as backoffLimit does.
      backoffLimitPerIndex: launcher.backoffLimit,
      maxFailedIndexes: 0,
      // A replacement starts only once the pod it replaces has stopped: two pods of one rank
      // must never run at once.
      podReplacementPolicy: 'Failed',
      // The native trainer's ranks keep their group until every rank has stored its outputs
      // (workers/rank.ts): the first rank to succeed means that all have, and the Job is done
      // (it stops any pod still running). Without it, a rank lost after its peers succeeded
      // would be replaced alone, and a lone rank never meets its group again: it waits out its
      // start-up deadline, backoffLimit + 1 times, before the Job fails and is retried whole.
      ...(spec.job.trainer === 'pytorch' ? {} : { successPolicy: { rules: [{ succeededCount: 1 }] } }),
      podFailurePolicy: {
        rules: [
          // First: a disrupted pod is replaced whatever its exit code (SIGTERM on eviction).
          { action: 'Ignore', onPodConditions: [{ type: 'DisruptionTarget', status: 'True' }] },
          {
            action: 'FailJob',
            onExitCodes: { containerName: rankContainerName, operator: 'In', values: [2] },
          },
          // A rank stopped by SIGTERM exits 143 (workers/rank.ts): a preemption (Kueue suspends
          // the Job) or a drain is not the rank's failure, and must not use up backoffLimit.
          {
            action: 'Ignore',
            onExitCodes: { containerName: rankContainerName, operator: 'In', values: [rankStoppedExitCode] },
          },
          // A rank whose peer was lost exits 75: the job is a gang, every rank restarts and meets
          // again in a new rendezvous; only the lost rank's own exit counts (once), never its
          // peers', so one lost pod cannot use up backoffLimit at any world size.
          {
            action: 'Ignore',
            onExitCodes: { containerName: rankContainerName, operator: 'In', values: [rankPeerLostExitCode] },
          },
        ],
      },
      ttlSecondsAfterFinished: launcher.ttlSecondsAfterFinished,
      // Always bounded: a Job whose activity is gone (a cancel that could not delete it) ends
      // by itself at the latest after the time its activity could have run.
      activeDeadlineSeconds:
        launcher.activeDeadlineSeconds ?? spec.maxRunSeconds ?? defaultActiveDeadlineSeconds,
      template: {
        metadata: { labels: meta.labels, annotations: meta.annotations },
        spec: {
          restartPolicy: 'Never',
          // With the Indexed Job's hostname `<job>-<index>`, rank 0 is `<job>-0.<service>`.
          subdomain: serviceName(spec.name),
          containers: [container],
          volumes: podVolumes,
          securityContext: {
            runAsNonRoot: true,
            runAsUser: rankUser,
            runAsGroup: rankUser,
            fsGroup: rankUser,
            // A large shared store volume is not walked to change ownership on every pod start.
            fsGroupChangePolicy: 'OnRootMismatch',
            seccompProfile: { type: 'RuntimeDefault' },
          },
          ...(launcher.serviceAccount ? { serviceAccountName: launcher.serviceAccount } : {}),
          // Never an API token, whatever the ServiceAccount says: spec code runs in these pods.
          automountServiceAccountToken: false,
          ...(launcher.priorityClassName ? { priorityClassName: launcher.priorityClassName } : {}),
          ...(launcher.nodeSelector ? { nodeSelector: { ...launcher.nodeSelector } } : {}),
          ...(launcher.affinity ? { affinity: structuredClone(launcher.affinity) } : {}),
          ...(launcher.tolerations ? { tolerations: launcher.tolerations.map((t) => ({ ...t })) } : {}),
        },
      },
    },
  };
}

/**
 * The headless Service: DNS records for every rank pod (ready or not: ranks connect to rank 0
 * while it starts), owned by the Job so the garbage collector removes it with the Job (its
 * TTL included).
 */
export function serviceManifest(
  spec: TrainJobSpec,
  launcher: KubernetesLauncherSpec,
  job: { name: string; uid: string },
): V1Service {
  const owner: V1OwnerReference = { apiVersion: 'batch/v1', kind: 'Job', name: job.name, uid: job.uid };
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { ...metadata(spec, launcher, serviceName(spec.name)), ownerReferences: [owner] },
    spec: {
      clusterIP: 'None',
      publishNotReadyAddresses: true,
      selector: { [jobLabel]: spec.name, 'app.kubernetes.io/component': 'trainer' },
      ports: [
        {
          name: 'coordinator',
          port: launcher.coordinatorPort,
          targetPort: launcher.coordinatorPort,
          protocol: 'TCP',
        },
      ],
    },
  };
}

/** The job's NetworkPolicy's name. */
export function networkPolicyName(jobName: string): string {
  return `${jobName}-ranks`;
}

/**
 * The job's NetworkPolicy, owned by the Job so the garbage collector removes it with the Job: its
 * pods take connections from the pods of the same job only, and may connect to them. The
 * namespace's moerl-trainer policy (k8s/base/network) denies trainer pods everything else but
 * DNS and the store, so no other campaign's pods reach these over the pod network (EFA traffic
 * bypasses it: a NetworkPolicy does not cover that).
 */
export function networkPolicyManifest(
  spec: TrainJobSpec,
  launcher: KubernetesLauncherSpec,
  job: { name: string; uid: string },
): V1NetworkPolicy {
  const owner: V1OwnerReference = { apiVersion: 'batch/v1', kind: 'Job', name: job.name, uid: job.uid };
  const ranks = {
    podSelector: { matchLabels: { [jobLabel]: spec.name, 'app.kubernetes.io/component': 'trainer' } },
  };
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { ...metadata(spec, launcher, networkPolicyName(spec.name)), ownerReferences: [owner] },
    spec: {
      ...structuredClone(ranks),
      policyTypes: ['Ingress', 'Egress'],
      ingress: [{ _from: [structuredClone(ranks)] }],
      egress: [{ to: [structuredClone(ranks)] }],
    },
  };
}

/** The Secret holding a job's token (MOERL_JOB_TOKEN), and its key. */
export function tokenSecretName(jobName: string): string {
  return `${jobName}-token`;
}
export const tokenSecretKey = 'token';

/**
 * The job's token Secret, owned by the Job so the garbage collector removes it with the Job. A
 * Secret, not an env value, so that reading Jobs and pods (the built-in `view` role) does not
 * reveal it; the train worker may create and delete Secrets, never read them.
 */
export function tokenSecretManifest(
  spec: TrainJobSpec,
  launcher: KubernetesLauncherSpec,
  job: { name: string; uid: string },
  token: string,
): V1Secret {
  const owner: V1OwnerReference = { apiVersion: 'batch/v1', kind: 'Job', name: job.name, uid: job.uid };
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { ...metadata(spec, launcher, tokenSecretName(spec.name)), ownerReferences: [owner] },
    type: 'Opaque',
    immutable: true,
    stringData: { [tokenSecretKey]: token },
  };
}
