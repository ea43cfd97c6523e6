// moerl's Kubernetes manifests as `kubectl apply -k` sends them: each kustomization's rendered
// output against its golden file (MOERL_UPDATE_GOLDEN=1 rewrites them), and the rules the
// rendered objects must keep — pinned images, labels, least privilege, hardened worker pods
// whose command the worker really accepts, and an EKS overlay, eksctl config and example spec
// that agree with each other. The API server's own verdict is in manifests-server.test.ts.
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { before, describe, it } from 'node:test';
import { parse as parseYaml } from 'yaml';
import { cacheLimitsFromEnv } from '../../activities/checkpoints.js';
import {
  launchProblem,
  trainerPolicyFromEnv,
  type TrainerPolicy,
} from '../../activities/launch/kubernetes/manifests.js';
import { loadSpecFile } from '../../cli/spec-file.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import { parseWorkerArgs } from '../../workers/main.js';
import { emptyTrainJob } from '../support/train-job-spec.js';
import {
  find,
  kustomizations,
  parseObjects,
  readYaml,
  render,
  workerDeployments,
  type Deployment,
  type K8sObject,
  type KustomizationName,
  type PodSpec,
} from './render.js';

const names = Object.keys(kustomizations) as KustomizationName[];
const rendered = {} as Record<KustomizationName, { text: string; objects: K8sObject[] }>;

before(async () => {
  for (const name of names) {
    const text = await render(name);
    rendered[name] = { text, objects: parseObjects(text) };
  }
});

const goldenPath = (name: KustomizationName) =>
  join(repoRoot(), 'test', 'k8s', 'golden', `${name}.yaml.golden`);

/** The first line where two texts differ, with a few lines of each around it. */
function firstDifference(want: string, got: string): string {
  const a = want.split('\n');
  const b = got.split('\n');
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  const around = (lines: string[]) => lines.slice(Math.max(0, i - 3), i + 3).join('\n');
  return `first difference at line ${i + 1}\n--- golden\n${around(a)}\n--- rendered\n${around(b)}`;
}

describe('rendered kustomizations match their golden files', () => {
  for (const name of names) {
    it(`${kustomizations[name]} → test/k8s/golden/${name}.yaml.golden`, () => {
      const { text } = rendered[name];
      if (process.env.MOERL_UPDATE_GOLDEN === '1') writeFileSync(goldenPath(name), text);
      const golden = readFileSync(goldenPath(name), 'utf8');
      assert.ok(
        golden === text,
        `${kustomizations[name]} renders differently; if the change is intended, rerun with ` +
          `MOERL_UPDATE_GOLDEN=1 and review the diff of test/k8s/golden/.\n${firstDifference(golden, text)}`,
      );
    });
  }
});

const roles = ['control', 'rollout', 'train'] as const;
/** Kinds without a namespace: the namespace itself and the admission policies (admission/). */
const clusterScoped = ['Namespace', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding'];

/** A CPU quantity ("4", "500m") in CPUs. */
function cpus(quantity: string | undefined): number {
  const m = /^(\d+(?:\.\d+)?)(m?)$/.exec(quantity ?? '');
  assert.ok(m, `a CPU quantity, got ${quantity}`);
  return Number(m[1]) / (m[2] === 'm' ? 1000 : 1);
}

function deploymentFor(objects: K8sObject[], role: string): Deployment {
  return find(objects, 'Deployment', `moerl-${role}`) as Deployment;
}

/** The operator's settings for trainer pods (the moerl-trainer-policy ConfigMap) as the train worker reads them. */
function trainerPolicy(objects: K8sObject[]): TrainerPolicy {
  const map = find(objects, 'ConfigMap', 'moerl-trainer-policy') as K8sObject & {
    data: Record<string, string>;
  };
  const policy = trainerPolicyFromEnv(map.data);
  assert.ok(policy, 'moerl-trainer-policy sets MOERL_TRAINER_*');
  return policy;
}

function configData(objects: K8sObject[]): { name: string; data: Record<string, string> } {
  const maps = objects.filter((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('moerl-config-'));
  assert.equal(maps.length, 1, 'one moerl-config ConfigMap (with its content hash)');
  const map = maps[0] as K8sObject & { data: Record<string, string> };
  return { name: map.metadata.name, data: map.data };
}

describe('every kustomization', () => {
  for (const name of names) {
    describe(name, () => {
      it('labels every object with app.kubernetes.io/name and part-of, and a component', () => {
        const nodeSetup = seccompInstaller(rendered[name].objects);
        for (const o of rendered[name].objects) {
          const labels = o.metadata.labels ?? {};
          const what = `${o.kind} ${o.metadata.name}`;
          assert.equal(labels['app.kubernetes.io/name'], 'moerl', what);
          assert.equal(labels['app.kubernetes.io/part-of'], 'moerl', what);
          if (!['Namespace', 'ConfigMap'].includes(o.kind))
            assert.ok(labels['app.kubernetes.io/component'], `${what} has a component`);
          if (clusterScoped.includes(o.kind)) assert.equal(o.metadata.namespace, undefined, what);
          else
            assert.equal(
              o.metadata.namespace,
              nodeSetup.includes(o) ? 'moerl-node-setup' : 'moerl',
              `${what} namespace`,
            );
        }
      });

      it('runs one Deployment per worker role, with the role as its command says', () => {
        const { objects } = rendered[name];
        assert.deepEqual(
          workerDeployments(objects)
            .map((d) => d.metadata.name)
            .sort(),
          ['moerl-control', 'moerl-rollout', 'moerl-train'],
        );
        const config = configData(objects);
        for (const role of roles) {
          const d = deploymentFor(objects, role);
          const pod = d.spec.template.spec;
          const c = pod.containers[0];
          assert.ok(c, `${role}: a container`);
          for (const [k, v] of Object.entries(d.spec.selector.matchLabels))
            assert.equal(
              d.spec.template.metadata.labels[k],
              v,
              `${role}: the selector matches its pods (${k})`,
            );
          assert.equal(d.spec.template.metadata.labels['moerl.dev/role'], role);
          assert.deepEqual(c.command, ['node', 'dist/workers/main.js']);
          assert.ok(
            c.envFrom?.some((e) => e.configMapRef?.name === config.name),
            `${role} reads ${config.name}`,
          );
          // The worker's own parser accepts the arguments and the ConfigMap as its environment.
          const args = parseWorkerArgs(c.args ?? [], { ...config.data });
          assert.deepEqual(args.roles, [role]);
          assert.equal(args.temporal.address, config.data.TEMPORAL_ADDRESS);
          // The pod's grace must outlast the worker's: its grace, the SDK's 5 s force time, closing.
          const grace = pod.terminationGracePeriodSeconds ?? 30;
          assert.ok(
            grace * 1000 >= args.shutdownGraceMs + 15_000,
            `${role}: terminationGracePeriodSeconds ${grace} must exceed the shutdown grace ${args.shutdownGraceMs / 1000}s + 15s`,
          );
          assert.equal(pod.serviceAccountName, `moerl-${role}`);
        }
      });

      it('hardens every worker pod: non-root 65532, read-only root, no capabilities, RuntimeDefault or the rewards profile', () => {
        for (const d of workerDeployments(rendered[name].objects)) {
          const pod: PodSpec = d.spec.template.spec;
          const what = d.metadata.name;
          assert.equal(pod.securityContext?.runAsNonRoot, true, what);
          assert.equal(pod.securityContext?.runAsUser, 65532, what);
          // eks's rollout workers run reward code: the profile that lets its jail start (k8s/seccomp).
          assert.deepEqual(
            pod.securityContext?.seccompProfile,
            name === 'eks' && what === 'moerl-rollout'
              ? { type: 'Localhost', localhostProfile: 'moerl/rewards.json' }
              : { type: 'RuntimeDefault' },
            what,
          );
          for (const c of pod.containers) {
            assert.equal(c.securityContext?.readOnlyRootFilesystem, true, what);
            assert.equal(c.securityContext?.allowPrivilegeEscalation, false, what);
            assert.deepEqual(c.securityContext?.capabilities?.drop, ['ALL'], what);
            for (const r of ['cpu', 'memory']) {
              assert.ok(c.resources?.requests?.[r], `${what}: ${r} request`);
              assert.ok(c.resources?.limits?.[r], `${what}: ${r} limit`);
            }
            // The only writable paths: /tmp and the cache that MOERL_CACHE_DIR names.
            const mounts = new Map((c.volumeMounts ?? []).map((m) => [m.mountPath, m.name]));
            const cacheDir = configData(rendered[name].objects).data.MOERL_CACHE_DIR as string;
            for (const path of ['/tmp', cacheDir]) {
              const volume = pod.volumes?.find((v) => v.name === mounts.get(path));
              assert.ok(volume?.emptyDir?.sizeLimit, `${what}: a bounded emptyDir at ${path}`);
            }
          }
        }
      });

      it("states the rollout worker's rank capacity as its CPU request, within its CPU limit", () => {
        const c = deploymentFor(rendered[name].objects, 'rollout').spec.template.spec.containers[0]!;
        const env = c.env?.find((e) => e.name === 'MOERL_ROLLOUT_RANKS');
        assert.deepEqual(env?.valueFrom, {
          resourceFieldRef: { containerName: c.name, resource: 'requests.cpu', divisor: '1' },
        });
        // What the kubelet sets it to: the request in whole CPUs, rounded up. More ranks than the
        // CPU limit would run them on a throttled quota.
        const request = cpus(c.resources?.requests?.cpu);
        const ranks = Math.ceil(request);
        assert.ok(
          ranks <= cpus(c.resources?.limits?.cpu),
          `${name}: ${ranks} rollout ranks, CPU limit ${c.resources?.limits?.cpu}`,
        );
        if (request >= 1) assert.equal(ranks, request, `${name}: a whole number of CPUs, one per rank`);
        assert.equal(
          parseWorkerArgs(['--role', 'rollout'], { MOERL_ROLLOUT_RANKS: String(ranks) }).rolloutRanks,
          ranks,
        );
      });

      it("sizes each worker's checkpoint cache by its cache volume: one number, the volume's sizeLimit", () => {
        for (const role of roles) {
          const pod = deploymentFor(rendered[name].objects, role).spec.template.spec;
          const c = pod.containers[0]!;
          const volume = pod.volumes?.find((v) => v.name === 'cache')?.emptyDir?.sizeLimit;
          const mount = c.volumeMounts?.find((m) => m.name === 'cache')?.mountPath;
          const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value]));
          assert.ok(volume, `${name} ${role}: the cache volume has a sizeLimit`);
          assert.equal(env.MOERL_CACHE_VOLUME_SIZE, volume, `${name} ${role}`);
          assert.equal(env.MOERL_CACHE_MAX_BYTES, undefined, `${name} ${role}: no second number`);
          assert.equal(mount, configData(rendered[name].objects).data.MOERL_CACHE_DIR, `${name} ${role}`);
          const limits = cacheLimitsFromEnv({ MOERL_CACHE_VOLUME_SIZE: String(volume) });
          assert.ok(limits.maxBytes < Infinity && limits.maxBytes > 0, `${name} ${role}: ${limits.maxBytes}`);
        }
      });

      it('pins every image tag, never latest', () => {
        for (const d of workerDeployments(rendered[name].objects))
          for (const c of d.spec.template.spec.containers) {
            assert.match(c.image, /:[\w][\w.-]*$/, `${d.metadata.name}: ${c.image} has a tag`);
            assert.doesNotMatch(c.image, /:latest$/, `${d.metadata.name}: ${c.image}`);
          }
      });

      it('gives an API token to the train worker (trainer Jobs), the control worker (their sweep) and the rollout worker (its pod deletion cost) only', () => {
        const { objects } = rendered[name];
        const withToken = ['moerl-control', 'moerl-rollout', 'moerl-train'];
        for (const sa of objects.filter((o) => o.kind === 'ServiceAccount')) {
          const automount = (sa as K8sObject & { automountServiceAccountToken?: boolean })
            .automountServiceAccountToken;
          assert.equal(automount, withToken.includes(sa.metadata.name), `${sa.metadata.name} token`);
        }
        for (const role of roles)
          assert.equal(deploymentFor(objects, role).spec.template.spec.automountServiceAccountToken, true);
        const bindings = objects.filter((o) => o.kind === 'RoleBinding' || o.kind === 'ClusterRoleBinding');
        assert.deepEqual(bindings.map((b) => `${b.kind}/${b.metadata.name}`).sort(), [
          'RoleBinding/moerl-control',
          'RoleBinding/moerl-rollout',
          'RoleBinding/moerl-train',
        ]);
        assert.ok(!objects.some((o) => o.kind === 'ClusterRole'), 'no cluster-wide permissions');
        assert.ok(find(objects, 'ServiceAccount', 'moerl-trainer'), 'trainer pods have their own account');
      });

      it("bounds the train worker's trainer Jobs by the operator's settings, which the worker reads too", () => {
        const { objects } = rendered[name];
        const policy = trainerPolicy(objects);
        // The admission policies judge the train worker's own requests: its account, as RBAC names
        // it, in any namespace (a renamed one included: admission.test.ts), and no other account.
        const binding = find(objects, 'RoleBinding', 'moerl-train') as K8sObject & {
          subjects: { kind: string; name: string; namespace: string }[];
        };
        const [subject] = binding.subjects;
        const user = `system:serviceaccount:${subject?.namespace}:${subject?.name}`;
        for (const vap of ['moerl-trainer-jobs', 'moerl-trainer-token-secrets']) {
          const o = find(objects, 'ValidatingAdmissionPolicy', vap) as K8sObject & {
            spec: { failurePolicy: string; matchConditions: { expression: string }[] };
          };
          assert.equal(o.spec.failurePolicy, 'Fail', vap);
          assert.deepEqual(
            o.spec.matchConditions.map((c) => c.expression),
            [`request.userInfo.username.matches('^system:serviceaccount:[^:]+:${subject?.name}$')`],
            vap,
          );
          const pattern = new RegExp(/matches\('(.*)'\)$/.exec(o.spec.matchConditions[0]!.expression)![1]!);
          assert.match(user, pattern);
          assert.match(`system:serviceaccount:ml-trainers:${subject?.name}`, pattern);
          for (const other of [
            `${user}-x`,
            `system:serviceaccount:moerl:x-${subject?.name}`,
            subject?.name ?? '',
          ])
            assert.doesNotMatch(other, pattern);
          const b = find(objects, 'ValidatingAdmissionPolicyBinding', vap) as K8sObject & {
            spec: { policyName: string; validationActions: string[] };
          };
          assert.equal(b.spec.policyName, vap);
          assert.deepEqual(b.spec.validationActions, ['Deny']);
        }
        // One image for workers and trainer ranks: the policy allows the workers' repository.
        const image = deploymentFor(objects, 'train').spec.template.spec.containers[0]?.image ?? '';
        assert.equal(policy.imageRepository, image.slice(0, image.lastIndexOf(':')), 'image repository');
        find(objects, 'ServiceAccount', policy.serviceAccount);
        const train = deploymentFor(objects, 'train').spec.template.spec.containers[0]!;
        assert.ok(
          train.envFrom?.some((e) => e.configMapRef?.name === 'moerl-trainer-policy'),
          'the train worker reads the same settings',
        );
      });

      it('enforces a Pod Security level on the namespace', () => {
        const labels = find(rendered[name].objects, 'Namespace', 'moerl').metadata.labels ?? {};
        // The local test cluster's workers use the node's network: its trainer Jobs are bounded
        // by the admission policies alone.
        assert.equal(
          labels['pod-security.kubernetes.io/enforce'],
          name === 'local' ? 'privileged' : 'restricted',
        );
      });
    });
  }
});

interface NodeGroup {
  name: string;
  spot?: boolean;
  efaEnabled?: boolean;
  instanceType?: string;
  availabilityZones?: string[];
  labels?: Record<string, string>;
  taints?: { key: string; value?: string; effect: string }[];
  overrideBootstrapCommand?: string;
  disableIMDSv1?: boolean;
  disablePodIMDS?: boolean;
}
interface ClusterConfig {
  availabilityZones: string[];
  iam: { serviceAccounts: { metadata: { name: string; namespace: string }; roleName: string }[] };
  managedNodeGroups: NodeGroup[];
}

type Toleration = NonNullable<PodSpec['tolerations']>[number];
/** One entry of an OCI runtime spec's process.rlimits. */
type Rlimit = { type: string; soft: number; hard: number };

/** Kubernetes' toleration rule: a pod may land on a node only if it tolerates each taint. */
function tolerates(tolerations: Toleration[] = [], taint: NonNullable<NodeGroup['taints']>[number]): boolean {
  return tolerations.some(
    (t) =>
      (t.effect === undefined || t.effect === taint.effect) &&
      (t.operator === 'Exists'
        ? t.key === undefined || t.key === taint.key
        : t.key === taint.key && (t.value ?? '') === (taint.value ?? '')),
  );
}

/** The node group a pod with this node selector and these tolerations can land on (exactly one). */
function groupFor(
  cluster: ClusterConfig,
  selector: Record<string, string>,
  tolerations?: Toleration[],
): NodeGroup {
  const fits = cluster.managedNodeGroups.filter((g) => {
    const labels: Record<string, string> = {
      ...g.labels,
      'eks.amazonaws.com/capacityType': g.spot ? 'SPOT' : 'ON_DEMAND',
    };
    return (
      Object.entries(selector).every(([k, v]) => labels[k] === v) &&
      (g.taints ?? []).every((taint) => tolerates(tolerations, taint))
    );
  });
  assert.equal(fits.length, 1, `one node group for ${JSON.stringify(selector)}: ${fits.map((g) => g.name)}`);
  return fits[0] as NodeGroup;
}

/** The objects of k8s/seccomp that install the profiles on the nodes (none where it is not used). */
function seccompInstaller(objects: K8sObject[]): K8sObject[] {
  return objects.filter(
    (o) => o.metadata.name === 'moerl-node-setup' || o.metadata.namespace === 'moerl-node-setup',
  );
}

describe('eks overlay: reward code under the seccomp profile of k8s/seccomp', () => {
  it('installs the profile the rollout workers name, as it is in k8s/seccomp, on every node, where the kubelet reads it', () => {
    const objects = rendered.eks.objects;
    const installer = find(objects, 'DaemonSet', 'moerl-seccomp-installer') as K8sObject & {
      spec: { template: { spec: PodSpec } };
    };
    const pod = installer.spec.template.spec;
    assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }], 'every node, whatever its taints');
    const hostPath = pod.volumes?.find((v) => v.hostPath)?.hostPath?.path;
    assert.equal(hostPath, '/var/lib/kubelet/seccomp');
    const profiles = pod.volumes?.find((v) => v.configMap)?.configMap?.name;
    const map = find(objects, 'ConfigMap', profiles ?? '') as K8sObject & { data: Record<string, string> };
    const named = deploymentFor(objects, 'rollout').spec.template.spec.securityContext?.seccompProfile;
    const [folder, file] = (named?.localhostProfile ?? '').split('/');
    assert.equal(folder, 'moerl', 'the installer writes /host/seccomp/moerl/');
    assert.equal(
      map.data[file ?? ''],
      readFileSync(join(repoRoot(), 'k8s', 'seccomp', 'rewards.json'), 'utf8'),
    );
    // Its own namespace: moerl's stays restricted, which forbids a hostPath volume.
    const namespace = find(objects, 'Namespace', 'moerl-node-setup').metadata.labels ?? {};
    assert.equal(namespace['pod-security.kubernetes.io/enforce'], 'privileged');
    assert.equal(installer.metadata.namespace, 'moerl-node-setup');
    for (const c of pod.containers) {
      assert.deepEqual(c.securityContext?.capabilities?.drop, ['ALL']);
      assert.equal(c.securityContext?.allowPrivilegeEscalation, false);
    }
  });

  it('the profile refuses what a jail has no use for and names no syscall twice', () => {
    const profile = JSON.parse(readFileSync(join(repoRoot(), 'k8s', 'seccomp', 'rewards.json'), 'utf8')) as {
      syscalls: { names: string[]; action: string }[];
    };
    const refused = profile.syscalls.filter((r) => r.action === 'SCMP_ACT_ERRNO').flatMap((r) => r.names);
    for (const call of [
      'ptrace',
      'bpf',
      'setns',
      'keyctl',
      'init_module',
      'io_uring_setup',
      'process_vm_readv',
    ])
      assert.ok(refused.includes(call), `${call} is refused`);
    for (const call of ['unshare', 'clone', 'mount', 'pivot_root'])
      assert.ok(!refused.includes(call), `${call}: bwrap needs it`);
    assert.equal(new Set(refused).size, refused.length);
  });
});

describe('eks overlay, eksctl cluster config and examples/eks.yaml agree', () => {
  const cluster = () => readYaml('k8s/overlays/eks/cluster.yaml') as ClusterConfig;

  it("no pod of any node group reaches the instance metadata service (the node's IAM role)", () => {
    // eksctl: IMDSv2 only (httpTokens required) and a hop limit of 1 (httpPutResponseHopLimit).
    for (const group of cluster().managedNodeGroups) {
      assert.equal(group.disableIMDSv1, true, `${group.name}: disableIMDSv1`);
      assert.equal(group.disablePodIMDS, true, `${group.name}: disablePodIMDS`);
    }
  });

  it('rollout workers land on the Spot group only; control and train workers on on-demand', () => {
    const { objects } = rendered.eks;
    for (const role of roles) {
      const pod = deploymentFor(objects, role).spec.template.spec;
      const group = groupFor(cluster(), pod.nodeSelector ?? {}, pod.tolerations);
      assert.equal(group.spot === true, role === 'rollout', `${role} on ${group.name}`);
    }
  });

  it('every ServiceAccount assumes the IAM role that cluster.yaml creates for exactly that account', () => {
    const accounts = cluster().iam.serviceAccounts;
    for (const sa of rendered.eks.objects.filter((o) => o.kind === 'ServiceAccount')) {
      const arn = sa.metadata.annotations?.['eks.amazonaws.com/role-arn'] ?? '';
      const match = /^arn:aws:iam::\d{12}:role\/(.+)$/.exec(arn);
      assert.ok(match, `${sa.metadata.name}: role ARN, got "${arn}"`);
      const entry = accounts.find((a) => a.roleName === match[1]);
      assert.deepEqual(entry?.metadata, { name: sa.metadata.name, namespace: sa.metadata.namespace });
    }
  });

  it('the EFA group is one zone of the cluster, EFA-enabled, p5-class', () => {
    const c = cluster();
    const efa = c.managedNodeGroups.filter((g) => g.efaEnabled);
    assert.equal(efa.length, 1);
    const group = efa[0] as NodeGroup;
    assert.equal(group.availabilityZones?.length, 1, 'EFA traffic cannot cross zones');
    assert.ok(c.availabilityZones.includes(group.availabilityZones?.[0] as string));
    assert.match(group.instanceType ?? '', /^p5(en|e)?\.48xlarge$/);
  });

  it("the EFA group's containers may lock what efa pins, and keep the AMI's open-file limits", () => {
    const group = cluster().managedNodeGroups.find((g) => g.efaEnabled) as NodeGroup;
    // nodeadm's NodeConfig: containerd's base runtime spec, merged into the AMI's.
    const nodeConfig = parseYaml(group.overrideBootstrapCommand ?? '') as {
      spec?: { containerd?: { baseRuntimeSpec?: { process?: { rlimits?: Rlimit[] } } } };
    };
    const rlimits = nodeConfig?.spec?.containerd?.baseRuntimeSpec?.process?.rlimits ?? [];
    const byType = new Map(rlimits.map((r) => [r.type, r]));
    // nodeadm merges through float64 numbers: a value above 2^53 (2^64-1, "unlimited") comes
    // back changed, and containerd cannot read 2^64.
    for (const r of rlimits) assert.ok(Number.isSafeInteger(r.soft) && Number.isSafeInteger(r.hard), r.type);
    // At least p5en.48xlarge's 2 TiB of memory: no limit in practice, far above the 1 GiB a rank
    // on efa requires (native/transport/locked_memory.h).
    const memlock = byType.get('RLIMIT_MEMLOCK');
    assert.ok(memlock && memlock.soft >= 2 * 2 ** 40 && memlock.hard >= memlock.soft, 'RLIMIT_MEMLOCK');
    // The list replaces the AMI's (RLIMIT_NOFILE only, nodeadm's base-runtime-spec.json).
    assert.deepEqual(byType.get('RLIMIT_NOFILE'), { type: 'RLIMIT_NOFILE', soft: 65536, hard: 1048576 });
  });

  it("the example's trainer pods land on the EFA group, with the workers' image and namespace", () => {
    const spec = loadSpecFile(join(repoRoot(), 'examples', 'eks.yaml'));
    assert.equal(spec.launcher.kind, 'kubernetes');
    if (spec.launcher.kind !== 'kubernetes') return;
    const group = groupFor(cluster(), spec.launcher.nodeSelector ?? {}, spec.launcher.tolerations);
    assert.equal(group.efaEnabled, true, `trainer pods on ${group.name}`);
    assert.ok(spec.launcher.efaPerRank > 0);
    assert.equal(spec.store.kind, 's3');
    const { objects } = rendered.eks;
    const trainer = find(objects, 'ServiceAccount', spec.launcher.serviceAccount ?? 'default');
    assert.ok(
      trainer.metadata.annotations?.['eks.amazonaws.com/role-arn'],
      'trainer account has an IAM role',
    );
    assert.equal(spec.launcher.namespace, trainer.metadata.namespace);
    const image = deploymentFor(objects, 'train').spec.template.spec.containers[0]?.image;
    assert.equal(spec.launcher.image, image, 'one image for workers and trainer ranks');
    // What the operator's settings allow (the train worker's check; the admission policy's is the same).
    const job = emptyTrainJob('eks-u1-0a1b2c3d', 2, { campaignId: spec.name, iteration: 1, attempt: 1 });
    assert.equal(launchProblem(job, spec.launcher, trainerPolicy(objects)), undefined);
  });
});

describe('local overlay', () => {
  it('uses the imported image only, one small worker per role on the node network, Temporal on loopback', () => {
    const { objects } = rendered.local;
    assert.match(configData(objects).data.TEMPORAL_ADDRESS ?? '', /^127\.0\.0\.1:\d+$/);
    for (const role of roles) {
      const d = deploymentFor(objects, role);
      const pod = d.spec.template.spec;
      assert.equal(d.spec.replicas, 1);
      assert.equal(pod.hostNetwork, true);
      assert.equal(pod.containers[0]?.imagePullPolicy, 'Never');
      assert.match(pod.containers[0]?.image ?? '', /^localhost\//);
    }
    assert.ok(
      !objects.some((o) => o.kind === 'PodDisruptionBudget'),
      'no budget that blocks draining one node',
    );
  });

  it('base and eks keep a disruption budget for the control workers', () => {
    for (const name of ['base', 'eks'] as const) {
      const pdb = find(rendered[name].objects, 'PodDisruptionBudget', 'moerl-control') as K8sObject & {
        spec: { minAvailable: number; selector: { matchLabels: Record<string, string> } };
      };
      const control = deploymentFor(rendered[name].objects, 'control');
      assert.ok(control.spec.replicas > pdb.spec.minAvailable, `${name}: a drain can proceed`);
      assert.deepEqual(pdb.spec.selector.matchLabels, control.spec.selector.matchLabels);
    }
  });
});
