// A campaign spec is untrusted input: moerl's admission policies (k8s/base/admission) before a real
// kube-apiserver with kwok nodes. As the train worker (a token of its ServiceAccount, as its pod
// has) every way out of a trainer Job that `jobs: create` alone allows — another image or
// ServiceAccount, an API token, a Secret as a volume or in the environment, hostPath /,
// privilege, host namespaces, capabilities, an unconfined profile, a PriorityClass or a
// toleration the operator did not list — is first admitted by RBAC alone (the manifests
// before the policies), then denied with its rule's message once the policies are applied; the
// Job the launcher really writes is admitted and runs; only the job's own token Secret may be
// written; other identities are not judged; a worker given the operator's settings refuses such
// specs itself as bad input; k8s/base with its namespace renamed is bounded all the same; and the
// restricted Pod Security level is enforced where eks says so.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  AdmissionregistrationV1Api,
  BatchV1Api,
  CoreV1Api,
  KubeConfig,
  type V1Container,
  type V1Job,
  type V1Pod,
  type V1PodSpec,
} from '@kubernetes/client-node';
import { ApplicationFailure } from '@temporalio/common';
import { stringify } from 'yaml';
import { KubernetesLauncher } from '../../activities/launch/kubernetes.js';
import { apiStatus } from '../../activities/launch/kubernetes/errors.js';
import {
  jobManifest,
  tokenSecretName,
  trainerPolicyFromEnv,
  type TrainerPolicy,
} from '../../activities/launch/kubernetes/manifests.js';
import type { TrainJob, TrainJobSpec } from '../../activities/launch/types.js';
import { badInputErrorType } from '../../activities/types.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';
import { emptyTrainJob } from '../support/train-job-spec.js';
import { find, parseObjects, render, renderRenamedBase, type K8sObject } from './render.js';

const namespace = 'moerl';
const trainWorker = 'moerl-train';
const policyName = 'moerl-trainer-jobs';
const secretsPolicyName = 'moerl-trainer-token-secrets';
const paramsName = 'moerl-trainer-policy';
const admissionKinds = ['ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding'];
// The operator's store, as a cluster with a shared filesystem on every node would set it.
const storeHostPath = '/srv/moerl/store';
const storeClaim = 'moerl-store';
// The operator's placement lists: one PriorityClass, the EFA group's taint.
const priorityClasses = 'moerl-training';
const tolerations = 'moerl.dev/pool:NoSchedule';

let cluster: KubeCluster;
let local: K8sObject[];
let asWorker: KubeConfig;
let workerBatch: BatchV1Api;
let workerCore: CoreV1Api;
let batch: BatchV1Api;
let core: CoreV1Api;

const toYaml = (objects: K8sObject[]) => objects.map((o) => stringify(o)).join('---\n');

async function applyForReal(objects: K8sObject[]): Promise<void> {
  const out = await cluster.kubectl(['apply', '-f', '-'], { input: toYaml(objects) });
  assert.equal(out.code, 0, out.stderr);
}

/** A client configuration that authenticates as a ServiceAccount, as a worker pod would. */
async function serviceAccountConfig(name: string): Promise<KubeConfig> {
  const token = await core.createNamespacedServiceAccountToken({
    namespace,
    name,
    body: { spec: { audiences: [], expirationSeconds: 3600 } },
  });
  const config = cluster.kubeConfig();
  config.loadFromOptions({
    clusters: config.clusters,
    users: [{ name, token: token.status!.token }],
    contexts: [{ name, cluster: config.getCurrentCluster()!.name, user: name }],
    currentContext: name,
  });
  return config;
}

before(
  async () => {
    cluster = await startKubeCluster({ kwok: true });
    // Trainer pods of the EFA example request EFA interfaces: the fake node has some.
    await cluster.addFakeNodes(1, {}, { 'vpc.amazonaws.com/efa': '32' });
    batch = cluster.kubeConfig().makeApiClient(BatchV1Api);
    core = cluster.kubeConfig().makeApiClient(CoreV1Api);
    local = parseObjects(await render('local'));
    // Everything of the local overlay but the workers and the admission policies (applied by
    // the tests below): the namespace, the accounts and their Roles, the operator's settings,
    // with an fs store's directory and claim as an operator would set them.
    const params = structuredClone(find(local, 'ConfigMap', paramsName)) as K8sObject & {
      data: Record<string, string>;
    };
    params.data.MOERL_TRAINER_STORE_HOST_PATH = storeHostPath;
    params.data.MOERL_TRAINER_STORE_CLAIM = storeClaim;
    params.data.MOERL_TRAINER_PRIORITY_CLASSES = priorityClasses;
    params.data.MOERL_TRAINER_TOLERATIONS = tolerations;
    await applyForReal(local.filter((o) => o.kind === 'Namespace'));
    await applyForReal([
      ...local.filter((o) => ['ServiceAccount', 'Role', 'RoleBinding'].includes(o.kind)),
      params,
    ]);
    asWorker = await serviceAccountConfig(trainWorker);
    workerBatch = asWorker.makeApiClient(BatchV1Api);
    workerCore = asWorker.makeApiClient(CoreV1Api);
  },
  { timeout: 600_000 },
);
after(async () => {
  await cluster?.stop();
});

/** The launcher section of a spec that the operator's settings allow: the EFA example's shape. */
function settings(overrides: Record<string, unknown> = {}) {
  return kubernetesLauncherSchema.parse({
    kind: 'kubernetes',
    namespace,
    image: 'localhost/moerl:0.1.0',
    serviceAccount: 'moerl-trainer',
    efaPerRank: 1,
    storeVolume: { hostPath: storeHostPath },
    annotations: { 'karpenter.sh/do-not-disrupt': 'true' },
    env: { FI_EFA_USE_DEVICE_RDMA: '1' },
    ...overrides,
  });
}

let jobs = 0;
function trainSpec(worldSize = 2): TrainJobSpec {
  jobs++;
  const spec = emptyTrainJob(`escape-u${jobs}-0a1b2c3d`, worldSize, {
    campaignId: 'Admission Test',
    iteration: jobs,
    attempt: 1,
  });
  return { ...spec, job: { ...spec.job, store: { kind: 'fs', path: '/mnt/store' } } };
}

/** The Job exactly as the launcher writes it for this spec and these settings. */
function launcherJob(spec = trainSpec(), launcher = settings()): V1Job {
  return jobManifest(spec, launcher);
}

type Escape = [what: string, change: (pod: V1PodSpec, c: V1Container, job: V1Job) => void, rule: RegExp];

const rules = {
  image:
    /^trainer pods run images of localhost\/moerl only \(MOERL_TRAINER_IMAGE_REPOSITORY in moerl-trainer-policy\), not /,
  account:
    /^trainer pods run as ServiceAccount moerl-trainer \(MOERL_TRAINER_SERVICE_ACCOUNT in moerl-trainer-policy\) without an API token mounted, not as /,
  volume:
    /^trainer pods mount emptyDir volumes and the store only \(hostPath "\/srv\/moerl\/store", claim "moerl-store" in moerl-trainer-policy; no Secret, projected or other hostPath volume\), not /,
  secretEnv:
    /^trainer pods take nothing from Secrets into their environment .* but MOERL_JOB_TOKEN from their Job's own Secret <job>-token$/,
  host: /^trainer pods share no host namespace \(hostNetwork, hostPID, hostIPC\) and no host port$/,
  privilege:
    /^trainer containers are unprivileged: not privileged, allowPrivilegeEscalation false, capabilities drop ALL and add none$/,
  root: /^trainer pods run as non-root \(runAsNonRoot true, never runAsUser 0\)$/,
  confined:
    /^trainer pods stay confined: seccomp RuntimeDefault or Localhost, no Unconfined AppArmor profile/,
  priority:
    /^trainer pods use only the PriorityClasses \[moerl-training\] \(MOERL_TRAINER_PRIORITY_CLASSES in moerl-trainer-policy\), not /,
  toleration:
    /^trainer pods tolerate only the taints \[moerl\.dev\/pool:NoSchedule\] \(MOERL_TRAINER_TOLERATIONS in moerl-trainer-policy, key:Effect\), not /,
};

const secretVolume = { name: 'stolen', secret: { secretName: 'moerl-temporal-tls' } };
const escapes: Escape[] = [
  ['another image', (_p, c) => (c.image = 'docker.io/library/busybox:1.37'), rules.image],
  ['an image of a look-alike repository', (_p, c) => (c.image = 'localhost/moerl-tools:0.1.0'), rules.image],
  [
    'an init container of another image',
    (p) =>
      (p.initContainers = [{ name: 'first', image: 'docker.io/library/busybox:1.37', command: ['true'] }]),
    rules.image,
  ],
  ["the train worker's own ServiceAccount", (p) => (p.serviceAccountName = trainWorker), rules.account],
  ["the namespace's default ServiceAccount", (p) => delete p.serviceAccountName, rules.account],
  ['an API token mounted', (p) => (p.automountServiceAccountToken = true), rules.account],
  [
    'a Secret volume',
    (p, c) => {
      p.volumes!.push(secretVolume);
      c.volumeMounts!.push({ name: 'stolen', mountPath: '/stolen' });
    },
    rules.volume,
  ],
  [
    'a projected ServiceAccount token for another audience',
    (p) =>
      p.volumes!.push({
        name: 'aws',
        projected: { sources: [{ serviceAccountToken: { audience: 'sts.amazonaws.com', path: 'token' } }] },
      }),
    rules.volume,
  ],
  [
    'hostPath /',
    (p, c) => {
      p.volumes!.push({ name: 'host-root', hostPath: { path: '/' } });
      c.volumeMounts!.push({ name: 'host-root', mountPath: '/host' });
    },
    rules.volume,
  ],
  [
    "the directory above the operator's store",
    (p) => (p.volumes!.find((v) => v.name === 'store')!.hostPath!.path = '/srv/moerl'),
    rules.volume,
  ],
  [
    'another PersistentVolumeClaim',
    (p) => p.volumes!.push({ name: 'other', persistentVolumeClaim: { claimName: 'someone-elses-data' } }),
    rules.volume,
  ],
  [
    'an env value from a Secret',
    (_p, c) =>
      c.env!.push({ name: 'KEY', valueFrom: { secretKeyRef: { name: 'moerl-temporal', key: 'api-key' } } }),
    rules.secretEnv,
  ],
  [
    'MOERL_JOB_TOKEN from another Secret',
    (_p, c) =>
      (c.env!.find((e) => e.name === 'MOERL_JOB_TOKEN')!.valueFrom!.secretKeyRef!.name = 'moerl-temporal'),
    rules.secretEnv,
  ],
  [
    'env from a whole Secret',
    (_p, c) => (c.envFrom = [{ secretRef: { name: 'moerl-temporal' } }]),
    rules.secretEnv,
  ],
  ['hostNetwork', (p) => (p.hostNetwork = true), rules.host],
  ['hostPID', (p) => (p.hostPID = true), rules.host],
  ['hostIPC', (p) => (p.hostIPC = true), rules.host],
  ['a host port', (_p, c) => (c.ports![0]!.hostPort = 29500), rules.host],
  [
    'a privileged container',
    (_p, c) => {
      c.securityContext!.privileged = true;
      delete c.securityContext!.allowPrivilegeEscalation; // false with privileged is invalid
    },
    rules.privilege,
  ],
  ['privilege escalation', (_p, c) => (c.securityContext!.allowPrivilegeEscalation = true), rules.privilege],
  ['an added capability', (_p, c) => (c.securityContext!.capabilities!.add = ['SYS_ADMIN']), rules.privilege],
  [
    'IPC_LOCK, as the EFA trainer pods were given',
    (_p, c) => (c.securityContext!.capabilities!.add = ['IPC_LOCK']),
    rules.privilege,
  ],
  ['capabilities not dropped', (_p, c) => delete c.securityContext!.capabilities, rules.privilege],
  ['root in the container', (_p, c) => (c.securityContext!.runAsUser = 0), rules.root],
  ['runAsNonRoot false', (p) => (p.securityContext!.runAsNonRoot = false), rules.root],
  [
    'seccomp Unconfined',
    (_p, c) => (c.securityContext!.seccompProfile = { type: 'Unconfined' }),
    rules.confined,
  ],
  [
    'AppArmor unconfined by annotation (a spec may set annotations)',
    (_p, _c, job) =>
      (job.spec!.template.metadata!.annotations!['container.apparmor.security.beta.kubernetes.io/rank'] =
        'unconfined'),
    rules.confined,
  ],
  ['an SELinux type', (p) => (p.securityContext!.seLinuxOptions = { type: 'spc_t' }), rules.confined],
  [
    'a sysctl',
    (p) => (p.securityContext!.sysctls = [{ name: 'kernel.msgmax', value: '65536' }]),
    rules.confined,
  ],
  ['the API token left to the ServiceAccount', (p) => delete p.automountServiceAccountToken, rules.account],
  [
    'priority class system-node-critical (pre-empts other workloads)',
    (p) => (p.priorityClassName = 'system-node-critical'),
    rules.priority,
  ],
  ['a toleration of every taint', (p) => (p.tolerations = [{ operator: 'Exists' }]), rules.toleration],
  [
    'a toleration of every effect of the allowed key',
    (p) => (p.tolerations = [{ key: 'moerl.dev/pool', operator: 'Exists' }]),
    rules.toleration,
  ],
  [
    "a toleration of the rollout group's taint",
    (p) =>
      (p.tolerations = [
        { key: 'moerl.dev/pool', operator: 'Exists', effect: 'NoSchedule' },
        { key: 'moerl.dev/spot', operator: 'Equal', value: 'true', effect: 'NoSchedule' },
      ]),
    rules.toleration,
  ],
];

/** The launcher's Job with one escape applied. */
function escapedJob(change: Escape[1]): V1Job {
  const job = launcherJob();
  const pod = job.spec!.template.spec!;
  change(pod, pod.containers[0]!, job);
  return job;
}

/** Creates the Job as the train worker; resolves with the API server's refusal, or undefined. */
async function createAsWorker(
  job: V1Job,
  dryRun = false,
): Promise<{ code?: number; message: string } | undefined> {
  try {
    await workerBatch.createNamespacedJob({ namespace, body: job, ...(dryRun ? { dryRun: 'All' } : {}) });
    return undefined;
  } catch (err) {
    const { code, body } = apiStatus(err);
    return { code, message: body.message ?? String(err) };
  }
}

/** The rule's message in a refusal by the trainer Job policy. */
function deniedBy(refusal: { message: string } | undefined, policy = policyName): string | undefined {
  const prefix = `ValidatingAdmissionPolicy '${policy}' with binding '${policy}' denied request: `;
  const at = refusal?.message.indexOf(prefix) ?? -1;
  return at >= 0 ? refusal!.message.slice(at + prefix.length) : undefined;
}

describe('trainer Jobs of the train worker (k8s/base/admission)', () => {
  it('without the policies, RBAC alone admits every escape (the manifests before them)', async () => {
    const admitted: string[] = [];
    for (const [what, change] of escapes) {
      const refusal = await createAsWorker(escapedJob(change), true);
      if (!refusal) admitted.push(what);
      else assert.fail(`${what}: refused by RBAC alone: ${refusal.message}`);
    }
    assert.equal(admitted.length, escapes.length);
  });

  it('the policies type-check against the objects they judge, and take effect', async () => {
    await applyForReal(local.filter((o) => admissionKinds.includes(o.kind)));
    const admission = cluster.kubeConfig().makeApiClient(AdmissionregistrationV1Api);
    // The controller manager type-checks each expression against the kinds the policy matches:
    // a misspelt field would be a warning here, and an error (a refusal) at admission.
    for (const name of [policyName, secretsPolicyName])
      await waitFor(`the type check of ${name}`, 60_000, async () => {
        const policy = await admission.readValidatingAdmissionPolicy({ name });
        if (policy.status?.observedGeneration !== policy.metadata?.generation) return 'not checked yet';
        assert.deepEqual(policy.status?.typeChecking?.expressionWarnings ?? [], [], name);
        return true;
      });
    // The API server's admission plugin learns of a new policy through its informer.
    await waitFor('the trainer Job policy to deny', 30_000, async () =>
      deniedBy(await createAsWorker(escapedJob(escapes[0]![1]), true)) ? true : 'still admitted',
    );
  });

  for (const [what, change, rule] of escapes)
    it(`denies ${what}, with its rule's message, as invalid`, async () => {
      const job = escapedJob(change);
      const refusal = await createAsWorker(job);
      const message = deniedBy(refusal);
      assert.ok(message, `denied by ${policyName}: ${refusal?.message ?? 'admitted'}`);
      assert.match(message, rule);
      assert.equal(refusal?.code, 422, 'reason Invalid: the launcher reports bad input, not retried');
      assert.deepEqual(await jobsNamed(job.metadata!.name!), [], 'nothing was created');
    });

  it('names what it refuses: the image, the account, the volume', async () => {
    const message = (change: Escape[1]) => createAsWorker(escapedJob(change), true).then(deniedBy);
    assert.match((await message(escapes[0]![1])) ?? '', /, not docker\.io\/library\/busybox:1\.37$/);
    assert.match((await message(escapes[3]![1])) ?? '', /, not as moerl-train$/);
    assert.match((await message(escapes[4]![1])) ?? '', /, not as the namespace default$/);
    assert.match((await message(escapes[8]![1])) ?? '', /, not host-root$/);
    const named = (what: string) => message(escapes.find(([w]) => w.startsWith(what))![1]);
    assert.match(
      (await named('the API token left')) ?? '',
      /, not as moerl-trainer with automountServiceAccountToken not false$/,
    );
    assert.match((await named('priority class')) ?? '', /, not system-node-critical$/);
    assert.match((await named('a toleration of every taint')) ?? '', /, not \(every key\):\(every effect\)$/);
    assert.match(
      (await named('a toleration of every effect')) ?? '',
      /, not moerl\.dev\/pool:\(every effect\)$/,
    );
    assert.match(
      (await named("a toleration of the rollout group's")) ?? '',
      /, not moerl\.dev\/spot:NoSchedule$/,
    );
  });

  it('admits the Job the launcher writes (EFA, an fs store, spec labels and annotations); it runs and is cleaned up', async () => {
    const launcher = new KubernetesLauncher(asWorker, settings({ labels: { team: 'rl' } }));
    const spec = trainSpec(2);
    const job = await launcher.launch(spec);
    try {
      const pods = await runningPods(spec.name, 2);
      for (const pod of pods) await cluster.setPodExitCode(namespace, pod.metadata!.name!, 0);
      assert.equal((await finished(job)).state, 'succeeded');
    } finally {
      await job.cleanUp();
    }
    // The same with a claim for the store, and a Job whose image is pinned by digest.
    const claimed = jobManifest(
      trainSpec(),
      settings({
        storeVolume: { claimName: storeClaim },
        image: `localhost/moerl@sha256:${'a'.repeat(64)}`,
      }),
    );
    assert.equal(await createAsWorker(claimed, true), undefined);
    // The operator's PriorityClass and the EFA group's taint, tolerated as the eks example does.
    const placed = jobManifest(
      trainSpec(),
      settings({
        priorityClassName: priorityClasses,
        tolerations: [{ key: 'moerl.dev/pool', operator: 'Equal', value: 'train', effect: 'NoSchedule' }],
      }),
    );
    assert.equal(await createAsWorker(placed, true), undefined);
  });

  it('does not judge other identities: an administrator may create any Job', async () => {
    for (const [, change] of escapes)
      await batch.createNamespacedJob({ namespace, body: escapedJob(change), dryRun: 'All' });
  });

  it("lets the train worker write only its Jobs' own token Secrets", async () => {
    const owner = { apiVersion: 'batch/v1', kind: 'Job', name: 'escape-u99-0a1b2c3d', uid: 'a-uid' };
    const create = async (body: object) => {
      try {
        await workerCore.createNamespacedSecret({ namespace, body, dryRun: 'All' });
        return undefined;
      } catch (err) {
        return { message: apiStatus(err).body.message ?? String(err) };
      }
    };
    const token = {
      metadata: { name: tokenSecretName(owner.name), ownerReferences: [owner] },
      type: 'Opaque',
      stringData: { token: 'x' },
    };
    assert.equal(await create(token), undefined, "the launcher's token Secret");
    const refused = [
      // The token controller would fill it with moerl-control's API token, under key "token".
      {
        ...token,
        type: 'kubernetes.io/service-account-token',
        metadata: {
          ...token.metadata,
          annotations: { 'kubernetes.io/service-account.name': 'moerl-control' },
        },
      },
      { ...token, metadata: { name: 'moerl-temporal' } },
      { ...token, metadata: { name: tokenSecretName(owner.name) } },
      { ...token, metadata: { ...token.metadata, name: 'other-token' } },
    ];
    for (const body of refused)
      assert.equal(
        deniedBy(await create(body), secretsPolicyName),
        'the train worker writes only Opaque Secrets named <job>-token, each owned by its Job',
        JSON.stringify(body),
      );
  });
});

describe("the launcher refuses such specs itself, with the operator's settings (MOERL_TRAINER_*)", () => {
  const policy = (): TrainerPolicy => {
    const params = find(local, 'ConfigMap', paramsName) as K8sObject & { data: Record<string, string> };
    // What the train worker's environment holds (envFrom the ConfigMap), the store set as above.
    return trainerPolicyFromEnv({
      ...params.data,
      MOERL_TRAINER_STORE_HOST_PATH: storeHostPath,
      MOERL_TRAINER_STORE_CLAIM: storeClaim,
      MOERL_TRAINER_PRIORITY_CLASSES: priorityClasses,
      MOERL_TRAINER_TOLERATIONS: tolerations,
    })!;
  };

  const refusedSpecs: [string, Record<string, unknown>, RegExp][] = [
    [
      'another image',
      { image: 'docker.io/library/busybox:1.37' },
      /MOERL_TRAINER_IMAGE_REPOSITORY=localhost\/moerl/,
    ],
    ['a look-alike repository', { image: 'localhost/moerl-tools:1' }, /MOERL_TRAINER_IMAGE_REPOSITORY/],
    [
      "the train worker's account",
      { serviceAccount: trainWorker },
      /MOERL_TRAINER_SERVICE_ACCOUNT=moerl-trainer/,
    ],
    ['no account', { serviceAccount: undefined }, /\(absent: the namespace default\)/],
    ['hostPath /', { storeVolume: { hostPath: '/' } }, /MOERL_TRAINER_STORE_HOST_PATH=\/srv\/moerl\/store/],
    ['another claim', { storeVolume: { claimName: 'other' } }, /MOERL_TRAINER_STORE_CLAIM=moerl-store/],
    [
      'an unconfined AppArmor annotation',
      { annotations: { 'container.apparmor.security.beta.kubernetes.io/rank': 'unconfined' } },
      /trainer pods keep their AppArmor and seccomp profiles/,
    ],
    [
      'priority class system-node-critical',
      { priorityClassName: 'system-node-critical' },
      /launcher\.priorityClassName system-node-critical is not a PriorityClass .*\(MOERL_TRAINER_PRIORITY_CLASSES=moerl-training\)/,
    ],
    [
      'a toleration of every taint',
      { tolerations: [{ operator: 'Exists' }] },
      /launcher\.tolerations\[0\] \{operator: Exists\} tolerates every taint \(no key\), .*\(MOERL_TRAINER_TOLERATIONS=moerl\.dev\/pool:NoSchedule, each key:Effect\)/,
    ],
  ];

  for (const [what, overrides, message] of refusedSpecs)
    it(`${what}: bad input naming the setting, before any API call`, async () => {
      const spec = trainSpec();
      const launcher = new KubernetesLauncher(asWorker, settings(overrides), { policy: policy() });
      await assert.rejects(launcher.launch(spec), (err) => {
        assert.ok(err instanceof ApplicationFailure, String(err));
        assert.equal(err.type, badInputErrorType);
        assert.equal(err.nonRetryable, true);
        assert.match(err.message, message);
        return true;
      });
      assert.deepEqual(await jobsNamed(spec.name), []);
    });

  it("a worker without the settings gets the API server's refusal: bad input with the rule's message", async () => {
    const launcher = new KubernetesLauncher(asWorker, settings({ serviceAccount: trainWorker }));
    await assert.rejects(launcher.launch(trainSpec()), (err) => {
      assert.ok(err instanceof ApplicationFailure, String(err));
      assert.equal(err.type, badInputErrorType);
      assert.equal(err.nonRetryable, true);
      assert.match(
        err.message,
        /\(422\): .*denied request: trainer pods run as ServiceAccount moerl-trainer/,
      );
      return true;
    });
  });

  it('the settings come from the train worker Deployment, reading the ConfigMap the policy reads', () => {
    const train = find(local, 'Deployment', 'moerl-train') as K8sObject & {
      spec: { template: { spec: { containers: { envFrom?: { configMapRef?: { name: string } }[] }[] } } };
    };
    const sources = train.spec.template.spec.containers[0]!.envFrom?.map((e) => e.configMapRef?.name);
    assert.ok(sources?.includes(paramsName), JSON.stringify(sources));
    const binding = find(local, 'ValidatingAdmissionPolicyBinding', policyName) as K8sObject & {
      spec: { paramRef: { name: string; namespace: string } };
    };
    // No namespace: the ConfigMap of the Job's own namespace, wherever the kustomization puts it.
    assert.deepEqual(binding.spec.paramRef, { name: paramsName, parameterNotFoundAction: 'Deny' });
  });
});

describe('a renamed namespace (k8s/base with another `namespace:`) is bounded all the same', () => {
  const renamed = 'ml-trainers';
  let objects: K8sObject[];
  let asRenamedWorker: BatchV1Api;

  before(async () => {
    objects = parseObjects(await renderRenamedBase(renamed));
    await applyForReal(objects.filter((o) => o.kind === 'Namespace'));
    await applyForReal(
      objects.filter((o) => ['ServiceAccount', 'Role', 'RoleBinding', 'ConfigMap'].includes(o.kind)),
    );
    // The same cluster-scoped policies as the moerl namespace's: nothing in them names a namespace.
    const admission = (list: K8sObject[]) => list.filter((o) => admissionKinds.includes(o.kind));
    assert.deepEqual(admission(objects), admission(local));
    await applyForReal(admission(objects));
    const token = await core.createNamespacedServiceAccountToken({
      namespace: renamed,
      name: trainWorker,
      body: { spec: { audiences: [], expirationSeconds: 3600 } },
    });
    const config = cluster.kubeConfig();
    config.loadFromOptions({
      clusters: config.clusters,
      users: [{ name: 'renamed', token: token.status!.token }],
      contexts: [{ name: 'renamed', cluster: config.getCurrentCluster()!.name, user: 'renamed' }],
      currentContext: 'renamed',
    });
    asRenamedWorker = config.makeApiClient(BatchV1Api);
  });

  /** The Job the launcher writes in the renamed namespace, with the base's settings. */
  const renamedJob = (change?: Escape[1]): V1Job => {
    const spec = trainSpec();
    const s3 = { kind: 's3', bucket: 'b', prefix: '', region: 'us-west-2', forcePathStyle: false } as const;
    const job = jobManifest(
      { ...spec, job: { ...spec.job, store: s3 } },
      settings({ namespace: renamed, image: 'moerl:0.1.0', storeVolume: undefined }),
    );
    const pod = job.spec!.template.spec!;
    change?.(pod, pod.containers[0]!, job);
    return job;
  };
  const create = async (job: V1Job) => {
    try {
      await asRenamedWorker.createNamespacedJob({ namespace: renamed, body: job, dryRun: 'All' });
      return undefined;
    } catch (err) {
      const { code, body } = apiStatus(err);
      return { code, message: body.message ?? String(err) };
    }
  };

  it("the train worker's Role follows it, and its Job is admitted, judged by the namespace's own settings", async () => {
    const refusal = await create(renamedJob());
    assert.equal(refusal, undefined, refusal?.message);
  });

  // The base's settings: the placeholder repository, no store volume, no class, no toleration.
  const refused: [string, RegExp][] = [
    ['another image', /^trainer pods run images of moerl only .*, not docker\.io\/library\/busybox:1\.37$/],
    ['hostPath /', /^trainer pods mount emptyDir volumes and the store only \(hostPath "", claim ""/],
    [
      'priority class system-node-critical',
      /^trainer pods use only the PriorityClasses \[\] .*, not system-node-critical$/,
    ],
    [
      'a toleration of every taint',
      /^trainer pods tolerate only the taints \[\] .*, not \(every key\):\(every effect\)$/,
    ],
  ];
  for (const [what, rule] of refused)
    it(`denies ${what}, with its rule's message`, async () => {
      const change = escapes.find(([w]) => w.startsWith(what))![1];
      const refusal = await create(renamedJob(change));
      const message = deniedBy(refusal);
      assert.ok(message, `denied by ${policyName}: ${refusal?.message ?? 'admitted'}`);
      assert.match(message, rule);
    });
});

describe('Pod Security: restricted, enforced (the eks overlay and the base)', () => {
  let restricted: string;

  before(async () => {
    const eks = parseObjects(await render('eks'));
    const labels = find(eks, 'Namespace', namespace).metadata.labels ?? {};
    assert.equal(labels['pod-security.kubernetes.io/enforce'], 'restricted');
    restricted = 'restricted';
    await applyForReal([
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: restricted, labels } },
      // The pods name it; the ServiceAccount admission plugin refuses a pod whose account is missing.
      {
        apiVersion: 'v1',
        kind: 'ServiceAccount',
        metadata: { name: 'moerl-trainer', namespace: restricted },
        automountServiceAccountToken: false,
      },
    ]);
  });

  /** A server-side dry run of creating `pod` in the restricted namespace. */
  const tryPod = (pod: V1Pod) =>
    cluster.kubectl(['-n', restricted, 'create', '--dry-run=server', '-f', '-'], {
      input: JSON.stringify({ apiVersion: 'v1', kind: 'Pod', ...pod }),
    });

  /** A pod of the launcher's trainer Job (the template as the Job controller copies it). */
  const trainerPod = (job: V1Job): V1Pod => ({
    metadata: { name: 'rank-0', labels: job.spec!.template.metadata!.labels },
    spec: job.spec!.template.spec,
  });

  it('admits a trainer pod as the launcher writes it, EFA included, without a warning', async () => {
    // The eks example's s3 store: no store volume.
    const spec = trainSpec();
    const s3 = { kind: 's3', bucket: 'b', prefix: '', region: 'us-west-2', forcePathStyle: false } as const;
    const job = launcherJob(
      { ...spec, job: { ...spec.job, store: s3 } },
      settings({ storeVolume: undefined }),
    );
    const out = await tryPod(trainerPod(job));
    assert.equal(out.code, 0, out.stderr);
    assert.equal(out.stderr.trim(), '', 'no Pod Security warning');
  });

  it('refuses pods that break it: the old IPC_LOCK of EFA pods, a hostPath store, host network', async () => {
    const ipcLock = escapes.find(([what]) => what.startsWith('IPC_LOCK'))![1];
    const cases: [string, V1Pod, RegExp][] = [
      ['IPC_LOCK', trainerPod(escapedJob(ipcLock)), /capabilities .*"IPC_LOCK"/],
      [
        'a hostPath store',
        trainerPod(launcherJob()),
        /restricted volume types \(volume "store" uses restricted volume type "hostPath"\)/,
      ],
      ['hostNetwork', trainerPod(escapedJob((p) => (p.hostNetwork = true))), /host namespaces/],
    ];
    for (const [what, pod, reason] of cases) {
      const out = await tryPod(pod);
      assert.notEqual(out.code, 0, `${what}: refused`);
      assert.match(out.stderr, /violates PodSecurity "restricted:latest"/, what);
      assert.match(out.stderr, reason, what);
    }
  });
});

/** The names of the Jobs named `name` in the namespace (none, or one). */
async function jobsNamed(name: string): Promise<string[]> {
  const list = await batch.listNamespacedJob({ namespace, fieldSelector: `metadata.name=${name}` });
  return list.items.map((j) => j.metadata!.name!);
}

async function runningPods(name: string, count: number): Promise<V1Pod[]> {
  let running: V1Pod[] = [];
  await waitFor(`${count} running pods of job ${name}`, 60_000, async () => {
    running = (
      await core.listNamespacedPod({ namespace, labelSelector: `moerl.dev/job=${name}` })
    ).items.filter((p) => p.status?.phase === 'Running' && !p.metadata?.deletionTimestamp);
    return running.length === count || `${running.length} running`;
  });
  return running;
}

async function finished(job: TrainJob, ms = 90_000) {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`job ${job.name} still ${JSON.stringify(job.status())}`)), ms);
  });
  try {
    return await Promise.race([job.wait(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
