// The objects the KubernetesLauncher creates, for a sample spec: the Indexed Job (pods, rank
// contract, failure policy, resources, security) and the headless Service; label values made
// valid from any campaign id; job names that cannot name pods refused.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  coordinatorAddress,
  jobManifest,
  labelValue,
  launchProblem,
  networkPolicyManifest,
  ownerLabels,
  serviceManifest,
  serviceName,
  trainerPolicyFromEnv,
} from '../../activities/launch/kubernetes/manifests.js';
import type { TrainJobSpec } from '../../activities/launch/types.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';

const settings = kubernetesLauncherSchema.parse({
  kind: 'kubernetes',
  namespace: 'trainers',
  image: 'registry.example/moerl:0.1.0',
  imagePullPolicy: 'Always',
  cpu: '16',
  memory: '64Gi',
  hugepages2Mi: '2Gi',
  shmSize: '8Gi',
  gpusPerRank: 8,
  efaPerRank: 4,
  nodeSelector: { 'node.kubernetes.io/instance-type': 'p5.48xlarge' },
  affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [] } } },
  tolerations: [{ key: 'nvidia.com/gpu', operator: 'Exists', effect: 'NoSchedule' }],
  priorityClassName: 'training',
  serviceAccount: 'moerl-trainer',
  backoffLimit: 5,
  activeDeadlineSeconds: 7200,
  ttlSecondsAfterFinished: 600,
  coordinatorPort: 29400,
  labels: { team: 'rl' },
  annotations: { 'example.com/owner': 'rl-team' },
  env: { FI_EFA_USE_DEVICE_RDMA: '1' },
  storeVolume: { claimName: 'moerl-store' },
});

const spec: TrainJobSpec = {
  name: 'grpo-math-u3-1a2b3c4d',
  worldSize: 4,
  job: {
    store: { kind: 'fs', path: '/mnt/store' },
    checkpoints: [],
    inputLists: [],
    steps: [['grpo', '--out', '{work}/out']],
    outputs: [],
  },
  env: { EXTRA: 'x', MOERL_RANK: 'must not win' },
  provider: 'efa',
  owner: { campaignId: 'GRPO math/v2', iteration: 3, attempt: 2 },
};

describe('kubernetes launcher manifests', () => {
  const job = jobManifest(spec, settings);
  const pod = job.spec!.template.spec!;
  const container = pod.containers[0]!;
  const env = Object.fromEntries((container.env ?? []).map((e) => [e.name, e.value ?? e.valueFrom]));

  it('builds an Indexed Job of one never-restarted pod per rank', () => {
    assert.equal(job.metadata?.name, spec.name);
    assert.equal(job.metadata?.namespace, 'trainers');
    assert.equal(job.spec?.completionMode, 'Indexed');
    assert.equal(job.spec?.completions, 4);
    assert.equal(job.spec?.parallelism, 4);
    assert.equal(job.spec?.backoffLimit, 5);
    // Per rank as well, so a replacement waits by its own rank's failures (a gang restart of
    // EP 8 fails eight pods); any rank out of retries fails the Job.
    assert.equal(job.spec?.backoffLimitPerIndex, 5);
    assert.equal(job.spec?.maxFailedIndexes, 0);
    assert.equal(job.spec?.activeDeadlineSeconds, 7200);
    assert.equal(job.spec?.ttlSecondsAfterFinished, 600);
    assert.equal(job.spec?.podReplacementPolicy, 'Failed');
    assert.equal(pod.restartPolicy, 'Never');
    assert.equal(pod.subdomain, serviceName(spec.name));
    assert.deepEqual(container.command, ['node', 'dist/workers/rank.js']);
    assert.equal(container.image, 'registry.example/moerl:0.1.0');
    assert.equal(container.imagePullPolicy, 'Always');
  });

  it('ignores disruptions, fails the Job at once on exit 2, ignores a rank stopped by SIGTERM (143) or by a lost peer (75)', () => {
    assert.deepEqual(job.spec?.podFailurePolicy?.rules, [
      { action: 'Ignore', onPodConditions: [{ type: 'DisruptionTarget', status: 'True' }] },
      { action: 'FailJob', onExitCodes: { containerName: 'rank', operator: 'In', values: [2] } },
      { action: 'Ignore', onExitCodes: { containerName: 'rank', operator: 'In', values: [143] } },
      { action: 'Ignore', onExitCodes: { containerName: 'rank', operator: 'In', values: [75] } },
    ]);
  });

  it('succeeds with its first rank, which the native trainer lets exit only once every rank has stored its outputs', () => {
    assert.deepEqual(job.spec?.successPolicy, { rules: [{ succeededCount: 1 }] });
    // The PyTorch trainer's ranks exit as each has stored its own: the Job waits for all.
    const pytorch = jobManifest({ ...spec, job: { ...spec.job, trainer: 'pytorch' } }, settings);
    assert.equal(pytorch.spec?.successPolicy, undefined);
  });

  it('always bounds how long the Job runs: the settings, else the job, else a day', () => {
    const plain = kubernetesLauncherSchema.parse({ kind: 'kubernetes', namespace: 'n', image: 'i:1' });
    assert.equal(jobManifest(spec, plain).spec?.activeDeadlineSeconds, 24 * 3600);
    assert.equal(jobManifest({ ...spec, maxRunSeconds: 57600 }, plain).spec?.activeDeadlineSeconds, 57600);
    assert.equal(jobManifest({ ...spec, maxRunSeconds: 57600 }, settings).spec?.activeDeadlineSeconds, 7200);
  });

  it('gives every rank the rank contract, its rank from the completion index', () => {
    assert.deepEqual(env.MOERL_RANK, {
      fieldRef: { fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']" },
    });
    assert.equal(env.MOERL_WORLD_SIZE, '4');
    assert.equal(env.MOERL_COORDINATOR, 'grpo-math-u3-1a2b3c4d-0.grpo-math-u3-1a2b3c4d.trainers.svc:29400');
    assert.equal(env.MOERL_FI_PROVIDER, 'efa');
    assert.deepEqual(JSON.parse(env.MOERL_JOB as string), spec.job);
    assert.equal(env.MOERL_WORK_DIR, '/var/lib/moerl/work');
    assert.equal(env.EXTRA, 'x');
    assert.equal(env.FI_EFA_USE_DEVICE_RDMA, '1');
    const names = (container.env ?? []).map((e) => e.name);
    assert.equal(new Set(names).size, names.length, `duplicate variables: ${names.join(' ')}`);
  });

  it("runs a PyTorch trainer's job as any other: the spec's image, the rank program, the interpreter the image's", () => {
    const job = { ...spec.job, trainer: 'pytorch' as const, hfCheckpoint: { dir: 'hf-out', initArgs: [] } };
    const image = 'registry.example/moerl:0.1.0-pytorch';
    const rank = jobManifest({ ...spec, job }, { ...settings, image }).spec!.template.spec!.containers[0]!;
    assert.equal(rank.image, image);
    assert.deepEqual(rank.command, ['node', 'dist/workers/rank.js']);
    const vars = Object.fromEntries((rank.env ?? []).map((e) => [e.name, e.value]));
    assert.deepEqual(JSON.parse(vars.MOERL_JOB!), job);
    assert.equal(vars.MOERL_PYTORCH_PYTHON, undefined, 'the image sets it (the Dockerfile pytorch target)');
  });

  it('requests the spec resources, limits equal to requests', () => {
    const amounts = {
      cpu: '16',
      memory: '64Gi',
      'hugepages-2Mi': '2Gi',
      'nvidia.com/gpu': '8',
      'vpc.amazonaws.com/efa': '4',
    };
    assert.deepEqual(container.resources, { requests: amounts, limits: amounts });
    assert.equal(
      jobManifest(spec, {
        ...settings,
        cpu: undefined,
        memory: undefined,
        hugepages2Mi: undefined,
        gpusPerRank: 0,
        efaPerRank: 0,
      }).spec?.template.spec?.containers[0]?.resources,
      undefined,
    );
  });

  it('mounts scratch, a memory-backed /dev/shm and the fs store at its path', () => {
    assert.deepEqual(pod.volumes, [
      { name: 'work', emptyDir: {} },
      { name: 'dshm', emptyDir: { medium: 'Memory', sizeLimit: '8Gi' } },
      { name: 'store', persistentVolumeClaim: { claimName: 'moerl-store' } },
    ]);
    assert.deepEqual(container.volumeMounts, [
      { name: 'work', mountPath: '/var/lib/moerl/work' },
      { name: 'dshm', mountPath: '/dev/shm' },
      { name: 'store', mountPath: '/mnt/store' },
    ]);
    const hostPath = jobManifest(spec, { ...settings, storeVolume: { hostPath: '/srv/moerl' } });
    assert.deepEqual(hostPath.spec?.template.spec?.volumes?.[2], {
      name: 'store',
      hostPath: { path: '/srv/moerl', type: 'Directory' },
    });
    const s3 = jobManifest(
      {
        ...spec,
        job: {
          ...spec.job,
          store: { kind: 's3', bucket: 'b', prefix: '', region: 'us-east-1', forcePathStyle: false },
        },
      },
      settings,
    );
    assert.deepEqual(
      s3.spec?.template.spec?.volumes?.map((v) => v.name),
      ['work', 'dshm'],
    );
  });

  it('places pods as the spec says', () => {
    assert.deepEqual(pod.nodeSelector, { 'node.kubernetes.io/instance-type': 'p5.48xlarge' });
    assert.deepEqual(pod.affinity, settings.affinity);
    assert.deepEqual(pod.tolerations, [{ key: 'nvidia.com/gpu', operator: 'Exists', effect: 'NoSchedule' }]);
    assert.equal(pod.priorityClassName, 'training');
    assert.equal(pod.serviceAccountName, 'moerl-trainer');
  });

  it('mounts no API token, whatever the ServiceAccount says', () => {
    assert.equal(pod.automountServiceAccountToken, false);
  });

  it("builds a NetworkPolicy owned by the Job: its pods reach, and are reached by, the job's own pods only", () => {
    const policy = networkPolicyManifest(spec, settings, { name: spec.name, uid: 'uid-1' });
    assert.equal(policy.metadata?.name, `${spec.name}-ranks`);
    assert.equal(policy.metadata?.namespace, 'trainers');
    assert.deepEqual(policy.metadata?.ownerReferences, [
      { apiVersion: 'batch/v1', kind: 'Job', name: spec.name, uid: 'uid-1' },
    ]);
    const ranks = { matchLabels: { 'moerl.dev/job': spec.name, 'app.kubernetes.io/component': 'trainer' } };
    const labels = job.spec!.template.metadata!.labels!;
    assert.ok(
      Object.entries(ranks.matchLabels).every(([k, v]) => labels[k] === v),
      'selects the pods',
    );
    assert.deepEqual(policy.spec?.podSelector, ranks);
    assert.deepEqual(policy.spec?.policyTypes, ['Ingress', 'Egress']);
    assert.deepEqual(policy.spec?.ingress, [{ _from: [{ podSelector: ranks }] }]);
    assert.deepEqual(policy.spec?.egress, [{ to: [{ podSelector: ranks }] }]);
  });

  it('runs unprivileged, with EFA too: no capability added', () => {
    assert.equal(pod.securityContext?.runAsNonRoot, true);
    // The Dockerfile's USER 65532:65532.
    assert.equal(pod.securityContext?.runAsUser, 65532);
    assert.equal(pod.securityContext?.runAsGroup, 65532);
    assert.deepEqual(pod.securityContext?.seccompProfile, { type: 'RuntimeDefault' });
    assert.equal(container.securityContext?.allowPrivilegeEscalation, false);
    assert.deepEqual(container.securityContext?.capabilities, { drop: ['ALL'] });
    const tcp = jobManifest(spec, { ...settings, efaPerRank: 0 }).spec?.template.spec?.containers[0];
    assert.deepEqual(tcp?.securityContext?.capabilities, { drop: ['ALL'] });
  });

  it('labels the Job, its pods and its Service with the owner, plus the spec labels and annotations; the campaign id as it is in an annotation', () => {
    const owner = {
      'app.kubernetes.io/name': 'moerl',
      'app.kubernetes.io/component': 'trainer',
      'app.kubernetes.io/part-of': 'moerl',
      'app.kubernetes.io/managed-by': 'moerl',
      'moerl.dev/campaign': labelValue('GRPO math/v2'),
      'moerl.dev/iteration': '3',
      'moerl.dev/attempt': '2',
      'moerl.dev/job': spec.name,
    };
    assert.deepEqual(ownerLabels(spec), owner);
    const service = serviceManifest(spec, settings, { name: spec.name, uid: 'uid-1' });
    for (const meta of [job.metadata, job.spec?.template.metadata, service.metadata]) {
      assert.deepEqual(meta?.labels, { team: 'rl', ...owner });
      assert.deepEqual(meta?.annotations, {
        'example.com/owner': 'rl-team',
        'moerl.dev/campaign-id': 'GRPO math/v2',
      });
    }
  });

  it('builds a headless Service owned by the Job, publishing ranks that are not ready', () => {
    const service = serviceManifest(spec, settings, { name: spec.name, uid: 'uid-1' });
    assert.equal(service.metadata?.name, spec.name);
    assert.deepEqual(service.metadata?.ownerReferences, [
      { apiVersion: 'batch/v1', kind: 'Job', name: spec.name, uid: 'uid-1' },
    ]);
    assert.equal(service.spec?.clusterIP, 'None');
    assert.equal(service.spec?.publishNotReadyAddresses, true);
    assert.deepEqual(service.spec?.selector, {
      'moerl.dev/job': spec.name,
      'app.kubernetes.io/component': 'trainer',
    });
    assert.deepEqual(service.spec?.ports, [
      { name: 'coordinator', port: 29400, targetPort: 29400, protocol: 'TCP' },
    ]);
  });

  it('names the Service of a job whose name starts with a digit so that it is a valid Service name', () => {
    assert.equal(serviceName('2024-run-u1-abcd'), 'j2024-run-u1-abcd');
    assert.equal(
      coordinatorAddress('2024-run-u1-abcd', 'ns', 1234),
      '2024-run-u1-abcd-0.j2024-run-u1-abcd.ns.svc:1234',
    );
  });
});

describe('kubernetes launcher names and labels', () => {
  it('keeps valid label values and makes any other value valid, distinct and at most 63 long', () => {
    assert.equal(labelValue('grpo-math_v2.1'), 'grpo-math_v2.1');
    const values = ['GRPO math/v2', 'GRPO math v2', '-leading', 'x'.repeat(80), 'x'.repeat(81), '///', 'é'];
    const labels = values.map(labelValue);
    for (const [i, label] of labels.entries()) {
      assert.ok(label.length <= 63, `${values[i]} → ${label} is too long`);
      assert.match(label, /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/, `${values[i]} → ${label}`);
    }
    assert.equal(new Set(labels).size, labels.length, `collisions: ${labels.join(' ')}`);
    assert.match(labelValue('GRPO math/v2'), /^GRPO-math-v2-[0-9a-f]{8}$/);
  });

  it('refuses job names that cannot name the Job and its pods, and an fs store without its volume', () => {
    const unplaced = { ...settings, tolerations: undefined, priorityClassName: undefined };
    assert.equal(launchProblem(spec, unplaced), undefined);
    assert.match(
      launchProblem({ ...spec, name: 'Upper' }, unplaced) ?? '',
      /"Upper" must be a DNS-1123 label/,
    );
    assert.match(
      launchProblem({ ...spec, name: 'a'.repeat(60), worldSize: 1000 }, unplaced) ?? '',
      /too long for 1000 ranks: pod hostname a+-999 would pass 63/,
    );
    assert.match(
      launchProblem(spec, { ...unplaced, storeVolume: undefined }) ?? '',
      /storeVolume is required with an fs store \(\/mnt\/store\)/,
    );
  });
});

describe("kubernetes launcher placement: the operator's lists (MOERL_TRAINER_PRIORITY_CLASSES, MOERL_TRAINER_TOLERATIONS)", () => {
  const policy = (env: Record<string, string>) =>
    trainerPolicyFromEnv({
      MOERL_TRAINER_IMAGE_REPOSITORY: 'registry.example/moerl',
      MOERL_TRAINER_SERVICE_ACCOUNT: 'moerl-trainer',
      MOERL_TRAINER_STORE_CLAIM: 'moerl-store',
      ...env,
    });
  const allowing = policy({
    MOERL_TRAINER_PRIORITY_CLASSES: ' training , batch-low',
    MOERL_TRAINER_TOLERATIONS: 'nvidia.com/gpu:NoSchedule, moerl.dev/pool:NoSchedule',
  });
  const place = (placement: Partial<typeof settings>) => ({
    ...settings,
    tolerations: undefined,
    priorityClassName: undefined,
    ...placement,
  });

  it('reads comma-separated lists, empty when unset', () => {
    assert.deepEqual(allowing?.priorityClasses, ['training', 'batch-low']);
    assert.deepEqual(allowing?.tolerations, ['nvidia.com/gpu:NoSchedule', 'moerl.dev/pool:NoSchedule']);
    assert.deepEqual(policy({})?.priorityClasses, []);
    assert.deepEqual(policy({})?.tolerations, []);
  });

  it('allows what is listed', () => {
    assert.equal(launchProblem(spec, settings, allowing), undefined);
    assert.equal(
      launchProblem(
        spec,
        place({
          tolerations: [{ key: 'moerl.dev/pool', operator: 'Equal', value: 'train', effect: 'NoSchedule' }],
        }),
        allowing,
      ),
      undefined,
    );
  });

  it('allows no PriorityClass and no toleration by default, with or without the other settings', () => {
    for (const p of [undefined, policy({})]) {
      assert.match(
        launchProblem(spec, place({ priorityClassName: 'training' }), p) ?? '',
        /^launcher\.priorityClassName training is not a PriorityClass this worker's operator allows \(MOERL_TRAINER_PRIORITY_CLASSES= \(empty: none\)\)$/,
      );
      assert.match(
        launchProblem(
          spec,
          place({ tolerations: [{ key: 'nvidia.com/gpu', operator: 'Exists', effect: 'NoSchedule' }] }),
          p,
        ) ?? '',
        /^launcher\.tolerations\[0\] \{key: nvidia\.com\/gpu, operator: Exists, effect: NoSchedule\} tolerates nvidia\.com\/gpu:NoSchedule, which this worker's operator does not allow \(MOERL_TRAINER_TOLERATIONS= \(empty: none\), each key:Effect\)$/,
      );
    }
  });

  it('refuses system-node-critical unless listed by name', () => {
    assert.match(
      launchProblem(spec, place({ priorityClassName: 'system-node-critical' }), allowing) ?? '',
      /priorityClassName system-node-critical is not a PriorityClass .*\(MOERL_TRAINER_PRIORITY_CLASSES=training,batch-low\)/,
    );
    const listed = policy({ MOERL_TRAINER_PRIORITY_CLASSES: 'system-node-critical' });
    assert.equal(
      launchProblem(spec, place({ priorityClassName: 'system-node-critical' }), listed),
      undefined,
    );
  });

  it('refuses a toleration of every taint, of every effect, or of a taint not listed, naming it and the list', () => {
    const cases: [NonNullable<typeof settings.tolerations>[number], RegExp][] = [
      [{ operator: 'Exists' }, /\[1\] \{operator: Exists\} tolerates every taint \(no key\)/],
      [
        { key: 'moerl.dev/pool', operator: 'Exists' },
        /\[1\] \{key: moerl\.dev\/pool, operator: Exists\} tolerates every effect of moerl\.dev\/pool \(no effect\)/,
      ],
      [
        { key: 'moerl.dev/spot', operator: 'Equal', value: 'true', effect: 'NoSchedule' },
        /tolerates moerl\.dev\/spot:NoSchedule/,
      ],
      [
        { key: 'moerl.dev/pool', operator: 'Exists', effect: 'NoExecute' },
        /tolerates moerl\.dev\/pool:NoExecute/,
      ],
    ];
    const first = { key: 'nvidia.com/gpu', operator: 'Exists', effect: 'NoSchedule' } as const;
    for (const [toleration, message] of cases) {
      const problem = launchProblem(spec, place({ tolerations: [first, toleration] }), allowing) ?? '';
      assert.match(problem, message);
      assert.match(
        problem,
        /\(MOERL_TRAINER_TOLERATIONS=nvidia\.com\/gpu:NoSchedule,moerl\.dev\/pool:NoSchedule, each key:Effect\)$/,
      );
    }
  });
});
