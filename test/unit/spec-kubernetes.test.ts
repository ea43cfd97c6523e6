// The kubernetes launcher section of the campaign spec: pod defaults, every pod setting an EKS
// user writes, and problems that name the field, the bad value and what Kubernetes allows.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { stringify } from 'yaml';
import { parseSpecText } from '../../cli/spec-file.js';
import { SpecError, campaignSpecJsonSchema } from '../../workflows/spec.js';
import { validSpecDoc } from '../support/spec-docs.js';

const validDoc = validSpecDoc;

function problemsAfter(edit: (doc: Record<string, unknown>) => void): string[] {
  const doc = validDoc();
  edit(doc);
  try {
    parseSpecText(stringify(doc), 'bad.yaml');
  } catch (err) {
    assert.ok(err instanceof SpecError, `expected SpecError, got ${String(err)}`);
    return err.problems;
  }
  assert.fail('the spec was accepted');
}

function assertOneProblem(problems: string[], ...patterns: RegExp[]): void {
  assert.equal(problems.length, 1, `expected one problem, got:\n${problems.join('\n')}`);
  for (const pattern of patterns) assert.match(problems[0] as string, pattern);
}

describe('kubernetes launcher', () => {
  const s3 = { kind: 's3', bucket: 'moerl-campaigns', region: 'us-west-2' };
  const minimal = { kind: 'kubernetes', namespace: 'moerl', image: 'moerl/moerl:0.1.0' };

  /** Problems of the valid document with this launcher section (and an s3 store unless given). */
  function launcherProblems(launcher: Record<string, unknown>, store: unknown = s3): string[] {
    return problemsAfter((d) => {
      d.launcher = { ...minimal, ...launcher };
      d.store = store;
    });
  }

  it('fills the pod defaults', () => {
    const spec = parseSpecText(stringify({ ...validDoc(), launcher: minimal, store: s3 }), 'ok.yaml');
    assert.deepEqual(spec.launcher, {
      ...minimal,
      imagePullPolicy: 'IfNotPresent',
      shmSize: '1Gi',
      gpusPerRank: 0,
      efaPerRank: 0,
      backoffLimit: 3,
      ttlSecondsAfterFinished: 3600,
      unschedulableTimeoutSeconds: 600,
      coordinatorPort: 29500,
    });
  });

  it('accepts every pod setting a demanding EKS user writes', () => {
    const launcher = {
      ...minimal,
      imagePullPolicy: 'Always',
      cpu: '90',
      memory: '1800Gi',
      hugepages2Mi: '5120Mi',
      shmSize: '64Gi',
      gpusPerRank: 8,
      efaPerRank: 32,
      nodeSelector: { 'node.kubernetes.io/instance-type': 'p5en.48xlarge', 'moerl.dev/pool': 'train' },
      affinity: {
        podAntiAffinity: {
          requiredDuringSchedulingIgnoredDuringExecution: [
            { labelSelector: { matchLabels: { app: 'x' } }, topologyKey: 'kubernetes.io/hostname' },
          ],
        },
      },
      tolerations: [
        { key: 'nvidia.com/gpu', operator: 'Exists', effect: 'NoSchedule' },
        {
          key: 'vpc.amazonaws.com/efa',
          operator: 'Equal',
          value: 'true',
          effect: 'NoExecute',
          tolerationSeconds: 60,
        },
        { operator: 'Exists' },
      ],
      priorityClassName: 'moerl-training',
      serviceAccount: 'moerl-trainer',
      backoffLimit: 0,
      activeDeadlineSeconds: 86400,
      ttlSecondsAfterFinished: 0,
      unschedulableTimeoutSeconds: 1800,
      coordinatorPort: 29400,
      labels: { team: 'rl', 'example.com/cost-center': 'a-1' },
      annotations: { 'karpenter.sh/do-not-disrupt': 'true' },
      env: { FI_EFA_USE_DEVICE_RDMA: '1', NCCL_DEBUG: 'WARN' },
    };
    const spec = parseSpecText(stringify({ ...validDoc(), launcher, store: s3 }), 'ok.yaml');
    assert.deepEqual(spec.launcher, launcher);
  });

  it('resource quantities must be Kubernetes quantities', () => {
    const problems = launcherProblems({ memory: '64GB', cpu: 'lots', shmSize: '-1Gi', hugepages2Mi: '2 Gi' });
    for (const [field, value] of [
      ['memory', '64GB'],
      ['cpu', 'lots'],
      ['shmSize', '-1Gi'],
      ['hugepages2Mi', '2 Gi'],
    ])
      assert.ok(
        problems.some((p) => p.includes(`launcher.${field}: got "${value}"; must be a Kubernetes quantity`)),
        `${field} in:\n${problems.join('\n')}`,
      );
    assert.equal(problems.length, 4, problems.join('\n'));
  });

  it('names are DNS-1123 where Kubernetes needs it', () => {
    assertOneProblem(
      launcherProblems({ namespace: 'Moerl' }),
      /launcher\.namespace: got "Moerl"; must be a DNS-1123 label/,
    );
    assertOneProblem(
      launcherProblems({ serviceAccount: 'moerl_trainer' }),
      /launcher\.serviceAccount: got "moerl_trainer"; must be a DNS-1123 subdomain/,
    );
    assertOneProblem(
      launcherProblems({ priorityClassName: 'High' }),
      /launcher\.priorityClassName: .*DNS-1123 subdomain/,
    );
    assertOneProblem(
      launcherProblems({ namespace: 'a'.repeat(64) }),
      /launcher\.namespace: .*(at most 63|too big)/i,
    );
  });

  it('image pull policy lists the allowed values', () => {
    assertOneProblem(
      launcherProblems({ imagePullPolicy: 'always' }),
      /launcher\.imagePullPolicy: got "always"/,
      /"IfNotPresent"\|"Always"\|"Never"/,
    );
  });

  it('labels, annotations and node selectors are checked as Kubernetes keys and values', () => {
    assertOneProblem(
      launcherProblems({ labels: { 'bad key': 'x' } }),
      /launcher\.labels\.bad key: .*Kubernetes key/,
    );
    assertOneProblem(
      launcherProblems({ labels: { team: 'x'.repeat(64) } }),
      /launcher\.labels\.team: .*label value/,
    );
    assertOneProblem(
      launcherProblems({ labels: { team: 'a b' } }),
      /launcher\.labels\.team: got "a b"; must be a label value/,
    );
    assertOneProblem(
      launcherProblems({ labels: { 'moerl.dev/job': 'mine' } }),
      /launcher\.labels\.moerl\.dev\/job: .*the launcher's own/,
    );
    assertOneProblem(
      launcherProblems({ annotations: { 'Example.com/x': 'y' } }),
      /launcher\.annotations\.Example\.com\/x: .*Kubernetes key/,
    );
    assertOneProblem(
      launcherProblems({ nodeSelector: { pool: 'a/b' } }),
      /launcher\.nodeSelector\.pool: .*label value/,
    );
  });

  it('tolerations are checked loosely: operator, effect, and the rules between fields', () => {
    assertOneProblem(
      launcherProblems({ tolerations: [{ key: 'spot', operator: 'In', value: 'x' }] }),
      /launcher\.tolerations\.0\.operator: got "In"/,
      /"Exists"\|"Equal"/,
    );
    assertOneProblem(
      launcherProblems({ tolerations: [{ key: 'spot', operator: 'Exists', value: 'x' }] }),
      /launcher\.tolerations\.0\.value: got "x"; must be absent when operator is Exists/,
    );
    assertOneProblem(
      launcherProblems({ tolerations: [{ value: 'x' }] }),
      /launcher\.tolerations\.0\.key: got missing; is required unless operator is Exists/,
    );
    assertOneProblem(
      launcherProblems({
        tolerations: [{ key: 'a', value: 'b', effect: 'NoSchedule', tolerationSeconds: 5 }],
      }),
      /launcher\.tolerations\.0\.tolerationSeconds: .*only with effect NoExecute/,
    );
    assertOneProblem(
      launcherProblems({ tolerations: [{ key: 'a', efect: 'NoSchedule' }] }),
      /unknown field\(s\) "efect"/,
    );
    assertOneProblem(
      launcherProblems({ tolerations: { key: 'a' } }),
      /launcher\.tolerations: .*expected array/,
    );
  });

  it('affinity must be an Affinity object', () => {
    assertOneProblem(
      launcherProblems({ affinity: 'zone-a' }),
      /launcher\.affinity: got "zone-a"; .*expected object/,
    );
    assertOneProblem(
      launcherProblems({ affinity: { nodeAfinity: {} } }),
      /launcher\.affinity: unknown field\(s\) "nodeAfinity"/,
    );
    assertOneProblem(
      launcherProblems({ affinity: { nodeAffinity: [] } }),
      /launcher\.affinity\.nodeAffinity: .*expected record/,
    );
  });

  it('numbers have ranges: backoff, deadlines, the coordinator port', () => {
    assertOneProblem(
      launcherProblems({ coordinatorPort: 80 }),
      /launcher\.coordinatorPort: got 80; .*>=\s*1024/,
    );
    assertOneProblem(launcherProblems({ backoffLimit: -1 }), /launcher\.backoffLimit: got -1/);
    assertOneProblem(
      launcherProblems({ unschedulableTimeoutSeconds: 0 }),
      /launcher\.unschedulableTimeoutSeconds: got 0/,
    );
    assertOneProblem(
      launcherProblems({ activeDeadlineSeconds: 1.5 }),
      /launcher\.activeDeadlineSeconds: got 1\.5; .*int/,
    );
  });

  it('extra rank environment: valid names, none of the rank contract', () => {
    assertOneProblem(
      launcherProblems({ env: { '1X': 'a' } }),
      /launcher\.env\.1X: .*environment variable name/,
    );
    assertOneProblem(
      launcherProblems({ env: { MOERL_RANK: '3' } }),
      /launcher\.env\.MOERL_RANK: .*set by the launcher/,
    );
    assertOneProblem(
      launcherProblems({ env: { FI_LOG_LEVEL: 3 } }),
      /launcher\.env\.FI_LOG_LEVEL: got 3; .*expected string/,
    );
  });

  it('an fs store needs a shared volume and an absolute path; s3 needs none', () => {
    const fsRelative = { kind: 'fs', path: 'store' };
    const problems = launcherProblems({}, fsRelative);
    assert.equal(problems.length, 2, problems.join('\n'));
    assert.ok(
      problems.some((p) => /launcher\.storeVolume: got missing; is required with an fs store/.test(p)),
    );
    assert.ok(
      problems.some((p) =>
        /store\.path: got "store"; must be an absolute path with the kubernetes launcher/.test(p),
      ),
    );
    const fsShared = { kind: 'fs', path: '/mnt/moerl' };
    for (const storeVolume of [{ claimName: 'moerl-store' }, { hostPath: '/mnt/moerl' }]) {
      const spec = parseSpecText(
        stringify({ ...validDoc(), launcher: { ...minimal, storeVolume }, store: fsShared }),
        'ok.yaml',
      );
      assert.deepEqual(spec.launcher.kind === 'kubernetes' && spec.launcher.storeVolume, storeVolume);
    }
    assertOneProblem(
      launcherProblems({ storeVolume: { claimName: 'moerl-store' } }),
      /launcher\.storeVolume: .*fs store only/,
    );
    assertOneProblem(
      launcherProblems({ storeVolume: { hostPath: 'mnt' } }, fsShared),
      /launcher\.storeVolume\.hostPath: got "mnt"; must be an absolute path/,
    );
    assertOneProblem(
      launcherProblems({ storeVolume: { claimName: 'a', hostPath: '/b' } }, fsShared),
      /launcher\.storeVolume: got \{"claimName":"a","hostPath":"\/b"\}; give exactly one of claimName or hostPath/,
    );
    assertOneProblem(
      launcherProblems({ storeVolume: {} }, fsShared),
      /launcher\.storeVolume: got \{\}; give exactly one of claimName or hostPath/,
    );
  });

  it('the JSON Schema describes the pod settings', () => {
    const text = JSON.stringify(campaignSpecJsonSchema());
    for (const phrase of [
      'vpc.amazonaws.com/efa per pod',
      'memory-backed /dev/shm',
      'IRSA',
      'mounted in every trainer pod',
    ])
      assert.ok(text.includes(phrase), phrase);
  });
});
