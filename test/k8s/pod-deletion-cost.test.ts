// Scale-in that takes idle rollout pods first (workers/pod-deletion-cost.ts), before a real
// kube-apiserver with kwok nodes: a rollout worker's pod carries
// controller.kubernetes.io/pod-deletion-cost = the activities the worker runs, written with a
// token of the rollout ServiceAccount bound to that pod (what the kubelet mounts), through the
// Role of k8s/base/rbac/rollout; the admission policy of k8s/base/admission lets that account
// change that one annotation of its own pod and nothing else. The activities are gated test
// functions (no Temporal): what is checked is the annotation the API server holds at each step.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  AdmissionregistrationV1Api,
  AppsV1Api,
  CoreV1Api,
  KubeConfig,
  PatchStrategy,
  setHeaderOptions,
} from '@kubernetes/client-node';
import { stringify } from 'yaml';
import type { CampaignActivities, RolloutShardInput } from '../../activities/types.js';
import { podBusyMarker, podDeletionCostAnnotation } from '../../workers/pod-deletion-cost.js';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';
import { parseObjects, render, type K8sObject } from './render.js';

const namespace = 'moerl';
const policyName = 'moerl-rollout-pod-deletion-cost';

let cluster: KubeCluster;
let core: CoreV1Api;

async function applyForReal(objects: K8sObject[]): Promise<void> {
  const out = await cluster.kubectl(['apply', '-f', '-'], {
    input: objects.map((o) => stringify(o)).join('---\n'),
  });
  assert.equal(out.code, 0, out.stderr);
}

/** A pod of the rollout worker's account on a fake node; resolves with its uid once it runs. */
async function rolloutPod(name: string): Promise<string> {
  await core.createNamespacedPod({
    namespace,
    body: {
      metadata: { name, labels: { 'moerl.dev/role': 'rollout' } },
      spec: {
        serviceAccountName: 'moerl-rollout',
        containers: [{ name: 'worker', image: 'moerl-test/rollout:none' }],
      },
    },
  });
  let uid = '';
  await waitFor(`pod ${name} running`, 60_000, async () => {
    const pod = await core.readNamespacedPod({ namespace, name });
    uid = pod.metadata?.uid ?? '';
    return pod.status?.phase === 'Running' || `phase ${pod.status?.phase}`;
  });
  return uid;
}

/** A client configuration with a rollout ServiceAccount token, bound to `pod` as a kubelet's is. */
async function rolloutAccount(pod?: { name: string; uid: string }): Promise<KubeConfig> {
  const token = await core.createNamespacedServiceAccountToken({
    namespace,
    name: 'moerl-rollout',
    body: {
      spec: {
        audiences: [],
        expirationSeconds: 3600,
        ...(pod ? { boundObjectRef: { apiVersion: 'v1', kind: 'Pod', name: pod.name, uid: pod.uid } } : {}),
      },
    },
  });
  const config = cluster.kubeConfig();
  config.loadFromOptions({
    clusters: config.clusters,
    users: [{ name: 'rollout', token: token.status!.token }],
    contexts: [{ name: 'rollout', cluster: config.getCurrentCluster()!.name, user: 'rollout' }],
    currentContext: 'rollout',
  });
  return config;
}

const cost = async (pod: string) =>
  (await core.readNamespacedPod({ namespace, name: pod })).metadata?.annotations?.[podDeletionCostAnnotation];

/** Patches `pod` as `as`; resolves with the API server's refusal message, or undefined. */
async function patchAs(
  as: KubeConfig,
  pod: string,
  body: object,
  strategy: PatchStrategy = PatchStrategy.MergePatch,
): Promise<string | undefined> {
  try {
    await as
      .makeApiClient(CoreV1Api)
      .patchNamespacedPod({ namespace, name: pod, body }, setHeaderOptions('Content-Type', strategy));
    return undefined;
  } catch (err) {
    return String((err as { body?: unknown }).body ?? err);
  }
}

/** Test rollout shards that run until released, one gate per shard. */
function gatedShards() {
  const gates = new Map<number, () => void>();
  const rolloutShard = (input: RolloutShardInput) =>
    new Promise<never>((resolve) => gates.set(input.shard, () => resolve(undefined as never)));
  const activities = { rolloutShard } as unknown as CampaignActivities;
  return { activities, release: (shard: number) => gates.get(shard)!() };
}

before(
  async () => {
    cluster = await startKubeCluster({ kwok: true });
    await cluster.addFakeNodes(1);
    core = cluster.kubeConfig().makeApiClient(CoreV1Api);
    const local = parseObjects(await render('local'));
    await applyForReal(local.filter((o) => o.kind === 'Namespace'));
    await applyForReal(
      local.filter(
        (o) =>
          ['ServiceAccount', 'Role', 'RoleBinding'].includes(o.kind) ||
          (o.kind.startsWith('ValidatingAdmissionPolicy') && o.metadata.name === policyName),
      ),
    );
    const admission = cluster.kubeConfig().makeApiClient(AdmissionregistrationV1Api);
    // The controller manager type-checks the expressions against Pod: a misspelt field would be
    // a warning here, and an error (a refusal) at admission.
    await waitFor(`the type check of ${policyName}`, 60_000, async () => {
      const policy = await admission.readValidatingAdmissionPolicy({ name: policyName });
      if (policy.status?.observedGeneration !== policy.metadata?.generation) return 'not checked yet';
      assert.deepEqual(policy.status?.typeChecking?.expressionWarnings ?? [], []);
      return true;
    });
  },
  { timeout: 600_000 },
);
after(async () => {
  await cluster?.stop();
});

describe('rollout pods marked busy or idle for scale-in (real control plane, kwok nodes)', () => {
  it('the annotation follows the running activities: 0 idle, the count while shards run', async () => {
    const uid = await rolloutPod('rollout-a');
    const asPod = await rolloutAccount({ name: 'rollout-a', uid });
    const log: string[] = [];
    const marker = podBusyMarker({
      pod: { name: 'rollout-a', namespace },
      kubeConfig: asPod,
      log: (l) => log.push(l),
    });
    const shards = gatedShards();
    const activities = marker.instrument(shards.activities);
    // The API server's admission plugin learns of the policy through its informer: until then
    // the first patch may go through unjudged, which is as good for this step.
    await marker.settled();
    assert.equal(await cost('rollout-a'), '0', `idle from the start; log: ${log.join('; ')}`);

    const running = [0, 1].map((shard) => activities.rolloutShard({ shard } as RolloutShardInput));
    await marker.settled();
    assert.equal(await cost('rollout-a'), '2', 'two shards running');
    shards.release(0);
    await running[0];
    await marker.settled();
    assert.equal(await cost('rollout-a'), '1', 'one shard running');
    shards.release(1);
    await running[1];
    await marker.settled();
    assert.equal(await cost('rollout-a'), '0', 'idle again');
    assert.deepEqual(log, [], 'no patch failed');
  });

  it('a scale-in by the real ReplicaSet controller deletes the idle pods and keeps the one mid-shard', async () => {
    const apps = cluster.kubeConfig().makeApiClient(AppsV1Api);
    const labels = { 'moerl.dev/role': 'rollout', 'moerl.dev/test': 'scale-in' };
    await apps.createNamespacedDeployment({
      namespace,
      body: {
        metadata: { name: 'scale-in' },
        spec: {
          replicas: 3,
          selector: { matchLabels: labels },
          template: {
            metadata: { labels },
            spec: {
              serviceAccountName: 'moerl-rollout',
              containers: [{ name: 'worker', image: 'moerl-test/rollout:none' }],
            },
          },
        },
      },
    });
    const pods = async () =>
      (await core.listNamespacedPod({ namespace, labelSelector: 'moerl.dev/test=scale-in' })).items.filter(
        (p) => !p.metadata?.deletionTimestamp,
      );
    await waitFor('3 ready pods', 60_000, async () => {
      const ready = (await pods()).filter((p) =>
        p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'),
      );
      return ready.length === 3 || `${ready.length} ready`;
    });
    // The newest pod is the one a scale-in takes first when all else is equal: make it the busy one.
    const byAge = (await pods()).sort((a, b) =>
      `${a.metadata!.creationTimestamp!.toISOString()}${a.metadata!.name}`.localeCompare(
        `${b.metadata!.creationTimestamp!.toISOString()}${b.metadata!.name}`,
      ),
    );
    const markers = [];
    for (const pod of byAge) {
      const name = pod.metadata!.name!;
      const asPod = await rolloutAccount({ name, uid: pod.metadata!.uid! });
      markers.push(
        podBusyMarker({ pod: { name, namespace }, kubeConfig: asPod, log: (l) => assert.fail(l) }),
      );
    }
    const busy = byAge.at(-1)!.metadata!.name!;
    const shards = gatedShards();
    const running = markers
      .at(-1)!
      .instrument(shards.activities)
      .rolloutShard({ shard: 0 } as RolloutShardInput);
    await Promise.all(markers.map((m) => m.settled()));
    assert.deepEqual(
      await Promise.all(byAge.map((p) => cost(p.metadata!.name!))),
      ['0', '0', '1'],
      'two idle pods and the busy one',
    );

    await apps.patchNamespacedDeployment(
      { namespace, name: 'scale-in', body: { spec: { replicas: 1 } } },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    );
    await waitFor('the scale-in to 1', 60_000, async () => {
      const left = await pods();
      return left.length === 1 || `${left.length} pods`;
    });
    assert.deepEqual(
      (await pods()).map((p) => p.metadata!.name),
      [busy],
      'the pod mid-shard is kept',
    );
    shards.release(0);
    await running;
  });

  it('the rollout account may set that annotation of its own pod only', async () => {
    const uidB = await rolloutPod('rollout-b');
    await rolloutPod('rollout-c');
    const asB = await rolloutAccount({ name: 'rollout-b', uid: uidB });
    const costOf = (n: string) => ({ metadata: { annotations: { [podDeletionCostAnnotation]: n } } });
    await waitFor('the policy to deny another pod', 30_000, async () =>
      (await patchAs(asB, 'rollout-c', costOf('5'))) ? true : 'still admitted',
    );
    // Tries admitted before the policy took effect are undone (the admin is not judged).
    await core.patchNamespacedPod(
      {
        namespace,
        name: 'rollout-c',
        body: { metadata: { annotations: { [podDeletionCostAnnotation]: null } } },
      },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    );
    assert.match((await patchAs(asB, 'rollout-c', costOf('5')))!, /may change its own pod only/);
    assert.match(
      (await patchAs(await rolloutAccount(), 'rollout-b', costOf('5')))!,
      /may change its own pod only/,
      'a token not bound to a pod',
    );
    const onlyCost = /may change only the annotation controller.kubernetes.io\/pod-deletion-cost/;
    const escapes: [string, object, PatchStrategy?][] = [
      ['a label', { metadata: { labels: { 'moerl.dev/role': 'train' } } }],
      ['another annotation', { metadata: { annotations: { 'example.com/x': 'y' } } }],
      [
        'its image',
        [{ op: 'replace', path: '/spec/containers/0/image', value: 'attacker/image:1' }],
        PatchStrategy.JsonPatch,
      ],
      ['a finalizer', { metadata: { finalizers: ['example.com/hold'] } }],
    ];
    for (const [what, body, strategy] of escapes)
      assert.match((await patchAs(asB, 'rollout-b', body, strategy))!, onlyCost, what);
    assert.equal(await patchAs(asB, 'rollout-b', costOf('3')), undefined, 'its own deletion cost');
    assert.equal(await cost('rollout-b'), '3');
    assert.equal(await cost('rollout-c'), undefined, 'the other pod untouched');

    // A marker given another pod than its token's logs the refusal; the activity is unharmed.
    const log: string[] = [];
    const marker = podBusyMarker({
      pod: { name: 'rollout-c', namespace },
      kubeConfig: asB,
      log: (l) => log.push(l),
    });
    const shards = gatedShards();
    const running = marker.instrument(shards.activities).rolloutShard({ shard: 0 } as RolloutShardInput);
    shards.release(0);
    await running;
    await marker.settled();
    assert.ok(log.length > 0, 'the refusal is logged');
    for (const line of log)
      assert.equal(
        line.replace(/=\d failed/, '=N failed'),
        `marking pod moerl/rollout-c with ${podDeletionCostAnnotation}=N failed: 403 pods "rollout-c" is forbidden: ValidatingAdmissionPolicy '${policyName}' with binding '${policyName}' denied request: the rollout worker may change its own pod only`,
      );
    assert.equal(await cost('rollout-c'), undefined);
  });
});
