// moerl's manifests before a real kube-apiserver (test/support/kube-cluster.ts, on 127.0.0.1):
// every overlay's rendered output passes a server-side dry run, with no Pod Security warning
// where the namespace asks for the restricted standard (eks's KEDA objects against KEDA's CRDs
// of the pinned release, scripts/tools.sh keda-crds); and the RBAC objects of the base,
// created for real, give the train worker exactly what the Kubernetes launcher needs in its
// namespace and nothing else (SubjectAccessReviews), and the other accounts nothing at all.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AuthorizationV1Api, type V1ResourceAttributes } from '@kubernetes/client-node';
import { stringify } from 'yaml';
import { repoRoot, resolveTool, type ToolName } from '../../cli/temporal-tools.js';
import { startKubeCluster, type KubeCluster } from '../support/kube-cluster.js';
import { parseObjects, render, type K8sObject, type KustomizationName } from './render.js';

let cluster: KubeCluster;

before(
  async () => {
    cluster = await startKubeCluster({ kwok: false });
    // The eks overlay's autoscaling (k8s/autoscaling) is KEDA's: its CRDs, from the pinned module.
    const crds = await resolveTool('keda-crds' as unknown as ToolName);
    const apply = await cluster.kubectl(['apply', '--server-side', '-f', crds]);
    assert.equal(apply.code, 0, apply.stderr);
    // kubectl wait fails at once on a CRD whose status has no conditions yet (just applied, the
    // API server not done with it): ask again until it answers, for at most a minute.
    for (const deadline = Date.now() + 60_000; ;) {
      const established = await cluster.kubectl([
        'wait',
        '--for=condition=Established',
        '--timeout=60s',
        'crd/scaledobjects.keda.sh',
        'crd/triggerauthentications.keda.sh',
      ]);
      if (established.code === 0) break;
      if (!/status\.conditions accessor error/.test(established.stderr) || Date.now() > deadline)
        assert.fail(established.stderr);
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  },
  { timeout: 600_000 },
);
after(async () => {
  await cluster?.stop();
});

const toYaml = (objects: K8sObject[]) => objects.map((o) => stringify(o)).join('---\n');

async function kubectl(args: string[], objects: K8sObject[]) {
  return cluster.kubectl(args, { input: toYaml(objects) });
}

/** Creates (or updates) these objects for real; fails with kubectl's message otherwise. */
async function applyForReal(objects: K8sObject[]): Promise<void> {
  const out = await kubectl(['apply', '-f', '-'], objects);
  assert.equal(out.code, 0, out.stderr);
}

async function dryRun(objects: K8sObject[]) {
  return kubectl(['apply', '--dry-run=server', '-f', '-'], objects);
}

describe('server-side dry run of every overlay', () => {
  // In this order: the eks namespace warns on the restricted standard, local's does not.
  for (const name of ['eks', 'local'] as KustomizationName[]) {
    it(`${name}: the API server accepts every object, with no warning`, async () => {
      const objects = parseObjects(await render(name));
      // A dry run cannot create the namespace the other objects are created in.
      await applyForReal(objects.filter((o) => o.kind === 'Namespace'));
      const rest = objects.filter((o) => o.kind !== 'Namespace');
      const out = await dryRun(rest);
      assert.equal(out.code, 0, out.stderr);
      assert.equal(out.stderr.trim(), '', 'no warnings (deprecated fields, Pod Security)');
      const accepted = out.stdout.split('\n').filter((l) => l.endsWith('(server dry run)'));
      assert.equal(accepted.length, rest.length, out.stdout);
    });
  }

  it("eks with KEDA's Temporal scaler (k8s/autoscaling/temporal-backlog): the API server accepts the trigger and its TriggerAuthentication", async () => {
    const at = mkdtempSync(join(tmpdir(), 'moerl-eks-backlog-'));
    try {
      const k8s = relative(at, join(repoRoot(), 'k8s'));
      writeFileSync(
        join(at, 'kustomization.yaml'),
        `resources:\n  - ${k8s}/overlays/eks\ncomponents:\n  - ${k8s}/autoscaling/temporal-backlog\n`,
      );
      const rendered = await cluster.kubectl(['kustomize', at]);
      assert.equal(rendered.code, 0, rendered.stderr);
      const keda = parseObjects(rendered.stdout).filter((o) => o.apiVersion.startsWith('keda.sh/'));
      assert.deepEqual(keda.map((o) => o.kind).sort(), ['ScaledObject', 'TriggerAuthentication']);
      await applyForReal(parseObjects(await render('eks')).filter((o) => o.kind === 'Namespace'));
      const out = await dryRun(keda);
      assert.equal(out.code, 0, out.stderr);
      assert.equal(out.stderr.trim(), '', 'no warnings');
    } finally {
      rmSync(at, { recursive: true, force: true });
    }
  });

  it("a ScaledObject that breaks KEDA's schema is refused: the CRDs are really checked", async () => {
    const so = parseObjects(await render('eks')).find((o) => o.kind === 'ScaledObject')!;
    const out = await dryRun([{ ...so, spec: { ...(so.spec as object), minReplicaCount: 'none' } }]);
    assert.notEqual(out.code, 0);
    assert.match(out.stderr, /minReplicaCount/);
  });

  it('a Pod Security violation is reported: the host-network local workers in the eks namespace', async () => {
    await applyForReal(parseObjects(await render('eks')).filter((o) => o.kind === 'Namespace'));
    const local = parseObjects(await render('local')).filter((o) => o.kind === 'Deployment');
    const out = await dryRun(local);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stderr, /would violate PodSecurity "restricted:latest": host namespaces/);
  });
});

describe('RBAC of the base, before the real authorizer', () => {
  let authz: AuthorizationV1Api;
  const namespace = 'moerl';

  before(async () => {
    const rbacKinds = ['Namespace', 'ServiceAccount', 'Role', 'RoleBinding'];
    await applyForReal(parseObjects(await render('base')).filter((o) => rbacKinds.includes(o.kind)));
    authz = cluster.kubeConfig().makeApiClient(AuthorizationV1Api);
  });

  async function allowed(account: string, attributes: V1ResourceAttributes): Promise<boolean> {
    const review = await authz.createSubjectAccessReview({
      body: {
        apiVersion: 'authorization.k8s.io/v1',
        kind: 'SubjectAccessReview',
        spec: {
          // What the API server sees for a pod running as this ServiceAccount.
          user: `system:serviceaccount:${namespace}:${account}`,
          groups: ['system:serviceaccounts', `system:serviceaccounts:${namespace}`, 'system:authenticated'],
          resourceAttributes: attributes,
        },
      },
    });
    return review.status?.allowed === true;
  }

  const describeAttributes = (a: V1ResourceAttributes) =>
    `${a.verb} ${a.group ? a.group + '/' : ''}${a.resource}${a.subresource ? '/' + a.subresource : ''} in ${a.namespace || 'the cluster'}`;

  async function expectAll(account: string, cases: V1ResourceAttributes[], expected: boolean): Promise<void> {
    const wrong: string[] = [];
    for (const attributes of cases)
      if ((await allowed(account, attributes)) !== expected) wrong.push(describeAttributes(attributes));
    assert.deepEqual(wrong, [], `${account} should ${expected ? '' : 'not '}be allowed to`);
  }

  const inNs = (group: string, resource: string, verbs: string[], subresource?: string) =>
    verbs.map((verb) => ({ group, resource, verb, namespace, ...(subresource ? { subresource } : {}) }));

  it('the train worker may manage Jobs and Services, create and delete token Secrets and NetworkPolicies, read and delete pods, read logs, in moerl', async () => {
    await expectAll(
      'moerl-train',
      [
        ...inNs('batch', 'jobs', ['create', 'get', 'list', 'watch', 'delete']),
        ...inNs('', 'services', ['create', 'get', 'list', 'watch', 'delete']),
        ...inNs('', 'secrets', ['create', 'delete']),
        ...inNs('networking.k8s.io', 'networkpolicies', ['create', 'get', 'delete']),
        ...inNs('', 'pods', ['get', 'list', 'watch', 'delete']),
        ...inNs('', 'pods', ['get'], 'log'),
      ],
      true,
    );
  });

  it('the train worker may do nothing else: other verbs, other resources, other namespaces', async () => {
    await expectAll(
      'moerl-train',
      [
        ...inNs('batch', 'jobs', ['update', 'patch', 'deletecollection']),
        ...inNs('batch', 'jobs', ['update'], 'status'),
        ...inNs('batch', 'cronjobs', ['create']),
        ...inNs('', 'pods', ['create', 'update', 'patch']),
        ...inNs('', 'pods', ['create'], 'exec'),
        ...inNs('', 'pods', ['create'], 'eviction'),
        ...inNs('', 'pods', ['create'], 'attach'),
        ...inNs('', 'services', ['update', 'patch']),
        ...inNs('', 'secrets', ['get', 'list', 'watch']),
        ...inNs('networking.k8s.io', 'networkpolicies', ['list', 'update', 'patch']),
        ...inNs('', 'configmaps', ['get', 'create']),
        ...inNs('', 'serviceaccounts', ['create']),
        ...inNs('', 'serviceaccounts', ['create'], 'token'),
        ...inNs('rbac.authorization.k8s.io', 'roles', ['create', 'bind', 'escalate']),
        ...inNs('rbac.authorization.k8s.io', 'rolebindings', ['create']),
        { group: 'batch', resource: 'jobs', verb: 'create', namespace: 'default' },
        { group: 'batch', resource: 'jobs', verb: 'list', namespace: 'kube-system' },
        { group: '', resource: 'pods', verb: 'get', subresource: 'log', namespace: 'default' },
        { group: 'batch', resource: 'jobs', verb: 'list', namespace: '' },
        { group: '', resource: 'pods', verb: 'list', namespace: '' },
        { group: '', resource: 'nodes', verb: 'list' },
        { group: '', resource: 'namespaces', verb: 'create' },
      ],
      false,
    );
  });

  it('the control worker may list and delete Jobs and Services in moerl (the sweep), nothing else', async () => {
    await expectAll(
      'moerl-control',
      [...inNs('batch', 'jobs', ['list', 'delete']), ...inNs('', 'services', ['list', 'delete'])],
      true,
    );
    await expectAll(
      'moerl-control',
      [
        ...inNs('batch', 'jobs', ['create', 'update', 'patch', 'deletecollection']),
        ...inNs('', 'services', ['create', 'update']),
        ...inNs('', 'pods', ['get', 'list', 'delete']),
        ...inNs('', 'pods', ['get'], 'log'),
        ...inNs('', 'secrets', ['get', 'list']),
        { group: 'batch', resource: 'jobs', verb: 'delete', namespace: 'default' },
        { group: 'batch', resource: 'jobs', verb: 'list', namespace: '' },
      ],
      false,
    );
  });

  it('the rollout workers may patch pods in their namespace only (their deletion cost), the trainer pods nothing', async () => {
    const anything = [
      ...inNs('batch', 'jobs', ['create', 'list']),
      ...inNs('', 'pods', ['get', 'list', 'delete']),
      ...inNs('', 'pods', ['get'], 'log'),
      ...inNs('', 'services', ['create']),
      ...inNs('', 'secrets', ['get']),
    ];
    for (const account of ['moerl-rollout', 'moerl-trainer']) await expectAll(account, anything, false);
    await expectAll('moerl-rollout', inNs('', 'pods', ['patch']), true);
    await expectAll(
      'moerl-rollout',
      [
        ...inNs('', 'pods', ['update', 'create']),
        ...inNs('', 'pods', ['patch'], 'status'),
        { group: '', resource: 'pods', verb: 'patch', namespace: 'default' },
      ],
      false,
    );
    await expectAll('moerl-trainer', inNs('', 'pods', ['patch']), false);
  });
});
