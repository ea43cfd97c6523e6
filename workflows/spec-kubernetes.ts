// The `launcher: { kind: kubernetes }` section of the campaign spec: how trainer pods (one per EP
// rank, an Indexed Job per training job) are placed, sized and given access to the store. Its own
// file so the pod settings, with the Kubernetes name and quantity rules they need, stay readable
// apart from the rest of the spec. Pure zod, like spec.ts: workflows import it.
import { z } from 'zod';
import { rendezvousFields } from './spec-rendezvous.js';

// Kubernetes' own validation rules (k8s.io/apimachinery/pkg/util/validation), so a spec that
// passes here is not rejected later by the API server in the middle of a campaign.
const dns1123Label = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const dns1123Subdomain = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const qualifiedName = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
// A resource quantity as Kubernetes writes it: a non-negative decimal with an optional binary
// (Ki…Ei), decimal (m, k, M…E) or exponent suffix: "500m", "64Gi", "1.5", "2e3".
const quantityPattern = /^(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$/;

/** Environment names the launcher sets itself on every rank (the rank contract). */
export const reservedEnvPrefix = 'MOERL_';
/** Label prefix of the launcher's owner labels, which find and delete a job's objects. */
export const reservedLabelPrefix = 'moerl.dev/';

const dnsLabel = (what: string) => {
  const message = `must be a DNS-1123 label (${what}): lowercase letters, digits and "-", at most 63`;
  return z.string().max(63, message).regex(dns1123Label, message);
};

const dnsSubdomain = (what: string) => {
  const message = `must be a DNS-1123 subdomain (${what}): lowercase letters, digits, "-" and ".", at most 253`;
  return z.string().max(253, message).regex(dns1123Subdomain, message);
};

const quantity = (example: string) =>
  z.string().regex(quantityPattern, `must be a Kubernetes quantity such as "${example}"`);

/** `[prefix/]name`: prefix a DNS-1123 subdomain, name ≤ 63 of letters, digits, "-", "_", "." */
function isQualifiedKey(key: string): boolean {
  const slash = key.lastIndexOf('/');
  const prefix = slash >= 0 ? key.slice(0, slash) : undefined;
  const name = slash >= 0 ? key.slice(slash + 1) : key;
  if (prefix !== undefined && (prefix.length > 253 || !dns1123Subdomain.test(prefix))) return false;
  return name.length <= 63 && qualifiedName.test(name);
}

const qualifiedKeyMessage =
  'must be a Kubernetes key: [DNS-1123 subdomain/]name, name at most 63 letters, digits, "-", "_" or ".", starting and ending alphanumeric';

const labelKey = z.string().refine(isQualifiedKey, qualifiedKeyMessage);
const labelValue = z
  .string()
  .regex(
    /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/,
    'must be a label value: empty, or at most 63 letters, digits, "-", "_" or ".", starting and ending alphanumeric',
  );

/**
 * A string map whose keys follow a rule. zod reports a bad record key without saying why, so
 * keys are checked here, each problem under the key's own path ("launcher.labels.<key>").
 */
function keyedMap<V extends z.ZodType>(keyProblem: (key: string) => string | undefined, value: V) {
  return z.record(z.string(), value).superRefine((map, ctx) => {
    for (const key of Object.keys(map)) {
      const problem = keyProblem(key);
      if (problem) ctx.addIssue({ code: 'custom', path: [key], message: `the key ${problem}` });
    }
  });
}

const labelKeyProblem = (key: string) => (isQualifiedKey(key) ? undefined : qualifiedKeyMessage);

/** Kueue's label naming a Job's LocalQueue; the launcher sets it from queueName. */
export const kueueQueueLabel = 'kueue.x-k8s.io/queue-name';

const podLabelKeyProblem = (key: string) =>
  key.startsWith(reservedLabelPrefix)
    ? `is under ${reservedLabelPrefix}, the launcher's own labels`
    : key === kueueQueueLabel
      ? 'is set by the launcher from launcher.queueName (which also creates the Job suspended)'
      : labelKeyProblem(key);

const envNameProblem = (name: string) => {
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name))
    return 'must be an environment variable name: letters, digits and "_", not starting with a digit';
  if (name.startsWith(reservedEnvPrefix))
    return `starts with ${reservedEnvPrefix}: those are set by the launcher (rank contract)`;
  return undefined;
};

const tolerationSchema = z
  .strictObject({
    key: labelKey.optional().describe('taint key; absent with operator Exists tolerates every taint'),
    operator: z.enum(['Exists', 'Equal']).default('Equal'),
    value: labelValue.optional(),
    effect: z
      .enum(['NoSchedule', 'PreferNoSchedule', 'NoExecute'])
      .optional()
      .describe('absent: every effect'),
    tolerationSeconds: z.number().int().min(0).optional().describe('only with effect NoExecute'),
  })
  .superRefine((t, ctx) => {
    if (t.operator === 'Exists' && t.value !== undefined)
      ctx.addIssue({ code: 'custom', path: ['value'], message: 'must be absent when operator is Exists' });
    if (t.operator === 'Equal' && t.key === undefined)
      ctx.addIssue({ code: 'custom', path: ['key'], message: 'is required unless operator is Exists' });
    if (t.tolerationSeconds !== undefined && t.effect !== 'NoExecute')
      ctx.addIssue({
        code: 'custom',
        path: ['tolerationSeconds'],
        message: 'is allowed only with effect NoExecute',
      });
  });

// The Affinity object is passed to the pods unchanged; only its shape is checked here (its
// fields are the API server's to judge, with `kubectl explain pod.spec.affinity`).
const affinityPart = z.record(z.string(), z.unknown());
const affinitySchema = z
  .strictObject({
    nodeAffinity: affinityPart.optional(),
    podAffinity: affinityPart.optional(),
    podAntiAffinity: affinityPart.optional(),
  })
  .describe(
    'a Kubernetes Affinity (nodeAffinity, podAffinity, podAntiAffinity), passed to every trainer pod as written',
  );

/** Where an fs store's shared filesystem comes from in a trainer pod. */
export type StoreVolume = { claimName: string } | { hostPath: string };

// One object with exactly one of the two fields (not a zod union), so a spec naming both or
// neither is told exactly that.
const storeVolumeSchema = z
  .strictObject({
    claimName: dnsSubdomain('a PersistentVolumeClaim name')
      .optional()
      .describe('a ReadWriteMany PersistentVolumeClaim in the namespace (EFS, FSx for Lustre, NFS)'),
    hostPath: z
      .string()
      .regex(/^\//, 'must be an absolute path')
      .optional()
      .describe('a directory on every node (a shared mount, or a one-node cluster)'),
  })
  .superRefine((v, ctx) => {
    if ((v.claimName === undefined) === (v.hostPath === undefined))
      ctx.addIssue({ code: 'custom', message: 'give exactly one of claimName or hostPath' });
  })
  .transform((v): StoreVolume =>
    v.claimName !== undefined ? { claimName: v.claimName } : { hostPath: v.hostPath as string },
  )
  .describe(
    "for an fs store only: the shared filesystem holding it, mounted in every trainer pod at the store's path, which must then be absolute. An s3 store needs no volume: credentials come from the serviceAccount (IRSA or EKS Pod Identity)",
  );

export const kubernetesLauncherSchema = z.strictObject({
  kind: z.literal('kubernetes'),
  namespace: dnsLabel('a namespace').describe('namespace of the trainer Jobs, Services and pods'),
  image: z
    .string()
    .min(1)
    .refine((s) => !s.endsWith(':latest') && s.includes(':'), 'must carry a pinned tag, not latest')
    .describe('trainer image (the Dockerfile at the repository root), with a pinned tag or digest'),
  imagePullPolicy: z.enum(['IfNotPresent', 'Always', 'Never']).default('IfNotPresent'),
  cpu: quantity('16').optional().describe('CPU request and limit of each trainer pod'),
  memory: quantity('64Gi').optional().describe('memory request and limit of each trainer pod'),
  hugepages2Mi: quantity('2Gi')
    .optional()
    .describe('2 MiB huge pages per pod (request = limit), for libfabric/EFA registered buffers'),
  shmSize: quantity('1Gi')
    .default('1Gi')
    .describe('size limit of the memory-backed /dev/shm (the shm provider and libfabric use it)'),
  gpusPerRank: z.number().int().min(0).max(16).default(0).describe('nvidia.com/gpu per pod'),
  efaPerRank: z
    .number()
    .int()
    .min(0)
    .max(32)
    .default(0)
    .describe('vpc.amazonaws.com/efa per pod; above 0 the ranks use the efa libfabric provider'),
  nodeSelector: keyedMap(labelKeyProblem, labelValue)
    .optional()
    .describe('node labels every trainer pod requires'),
  affinity: affinitySchema.optional(),
  tolerations: z.array(tolerationSchema).optional().describe('tolerations of every trainer pod'),
  priorityClassName: dnsSubdomain('a PriorityClass name').optional(),
  serviceAccount: dnsSubdomain('a ServiceAccount name')
    .optional()
    .describe(
      "trainer pods' ServiceAccount (k8s/base: moerl-trainer); on EKS its IRSA role or Pod Identity association gives the ranks S3 access. Absent: the namespace's default",
    ),
  backoffLimit: z
    .number()
    .int()
    .min(0)
    .max(100)
    .default(3)
    .describe(
      'pod failures the Job retries itself; exit 2 (bad input) fails it at once, disruptions (Spot reclaim, eviction) are not counted',
    ),
  activeDeadlineSeconds: z
    .number()
    .int()
    .min(1)
    .optional()
    .describe('the Job fails once it has run this long'),
  ttlSecondsAfterFinished: z
    .number()
    .int()
    .min(0)
    .max(30 * 24 * 3600)
    .default(3600)
    .describe('a finished Job and its pods are deleted this long after (logs are in the store)'),
  unschedulableTimeoutSeconds: z
    .number()
    .int()
    .min(1)
    .max(7 * 24 * 3600)
    .default(600)
    .describe(
      'a trainer pod still Pending/Unschedulable after this fails the update with the scheduler’s reason',
    ),
  ...rendezvousFields,
  coordinatorPort: z
    .number()
    .int()
    .min(1024)
    .max(65535)
    .default(29500)
    .describe("rank 0's bootstrap port, reached through the Job's headless Service"),
  labels: keyedMap(podLabelKeyProblem, labelValue)
    .optional()
    .describe(`extra labels on every trainer pod (keys under ${reservedLabelPrefix} are reserved)`),
  annotations: keyedMap(labelKeyProblem, z.string())
    .optional()
    .describe('extra annotations on every trainer pod'),
  env: keyedMap(envNameProblem, z.string())
    .optional()
    .describe(
      `extra environment for every rank (FI_* tuning, NCCL_*, …); ${reservedEnvPrefix}* is the launcher's`,
    ),
  storeVolume: storeVolumeSchema.optional(),
  queueName: dnsLabel('a Kueue LocalQueue name')
    .optional()
    .describe(
      'a Kueue LocalQueue in the namespace: each trainer Job is created suspended with the kueue.x-k8s.io/queue-name label and runs once Kueue admits it within its ClusterQueue’s quota (the update heartbeats `queued` until then). Absent: Jobs start at once',
    ),
});

export type KubernetesLauncher = z.output<typeof kubernetesLauncherSchema>;

/**
 * The store a kubernetes launcher's pods reach: an fs store must be on a volume every pod
 * mounts at the same absolute path; storeVolume means nothing for s3 (credentials come from
 * the serviceAccount). Returns [field path, message] pairs.
 */
export function kubernetesStoreProblems(
  launcher: KubernetesLauncher,
  store: { kind: 'fs'; path: string } | { kind: 's3' },
): [string[], string][] {
  if (store.kind === 's3')
    return launcher.storeVolume
      ? [
          [
            ['launcher', 'storeVolume'],
            'is for an fs store only; an s3 store is reached with the serviceAccount’s credentials',
          ],
        ]
      : [];
  const problems: [string[], string][] = [];
  if (!launcher.storeVolume)
    problems.push([
      ['launcher', 'storeVolume'],
      'is required with an fs store: trainer pods mount the shared filesystem holding it ({ claimName } or { hostPath })',
    ]);
  if (!store.path.startsWith('/'))
    problems.push([
      ['store', 'path'],
      `must be an absolute path with the kubernetes launcher (pods mount the store there), not "${store.path}"`,
    ]);
  return problems;
}
