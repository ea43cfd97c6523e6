// Trainer pods' network in every rendered kustomization: the namespace's NetworkPolicies select
// exactly the pods the launcher creates (its owner labels), admit no connection to them (each
// job's own policy, from the launcher, admits the job's pods only), let them reach DNS and the
// operator's store only, never the node's instance metadata service; and the train worker may
// create and delete the job token Secrets but read none.
import assert from 'node:assert/strict';
import { BlockList, isIPv6 } from 'node:net';
import { before, describe, it } from 'node:test';
import { jobManifest, networkPolicyManifest } from '../../activities/launch/kubernetes/manifests.js';
import type { TrainJobSpec } from '../../activities/launch/types.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import {
  find,
  kustomizations,
  parseObjects,
  render,
  workerDeployments,
  type K8sObject,
  type KustomizationName,
} from './render.js';

interface Peer {
  podSelector?: { matchLabels: Record<string, string> };
  namespaceSelector?: { matchLabels: Record<string, string> };
  ipBlock?: { cidr: string; except?: string[] };
}
interface NetworkPolicy extends K8sObject {
  spec: {
    podSelector: { matchLabels: Record<string, string> };
    policyTypes: string[];
    ingress?: { from?: Peer[] }[];
    egress?: { to?: Peer[]; ports?: { protocol: string; port: number }[] }[];
  };
}
interface Role extends K8sObject {
  rules: { apiGroups: string[]; resources: string[]; verbs: string[] }[];
}

const spec: TrainJobSpec = {
  name: 'grpo-u1-0a1b2c3d',
  worldSize: 2,
  job: { store: { kind: 'fs', path: '/store' }, checkpoints: [], inputLists: [], steps: [], outputs: [] },
  env: {},
  provider: 'tcp',
  owner: { campaignId: 'c', iteration: 1, attempt: 1 },
};
const trainerPodLabels = jobManifest(
  spec,
  kubernetesLauncherSchema.parse({
    kind: 'kubernetes',
    namespace: 'moerl',
    image: 'moerl:0.1.0',
    storeVolume: { hostPath: '/store' },
  }),
).spec!.template.metadata!.labels!;

const matches = (selector: Record<string, string>, labels: Record<string, string>) =>
  Object.entries(selector).every(([k, v]) => labels[k] === v);

const names = Object.keys(kustomizations) as KustomizationName[];
const rendered = {} as Record<KustomizationName, K8sObject[]>;
before(async () => {
  for (const name of names) rendered[name] = parseObjects(await render(name));
});

/** The instance metadata service's addresses (EC2: the node's IAM role). */
const metadataService = ['169.254.169.254', 'fd00:ec2::254'];

/** Whether `block` lets a pod reach `address` (its cidr holds it and no `except` does). */
function reaches(block: { cidr: string; except?: string[] }, address: string): boolean {
  const family = isIPv6(address) ? 'ipv6' : 'ipv4';
  const within = (cidr: string) => {
    const [net, bits] = cidr.split('/');
    if (isIPv6(net!) !== (family === 'ipv6')) return false;
    const list = new BlockList();
    list.addSubnet(net!, Number(bits), family);
    return list.check(address, family);
  };
  return within(block.cidr) && !(block.except ?? []).some(within);
}

describe("trainer pods' network", () => {
  for (const name of names) {
    it(`${kustomizations[name]}: trainer pods take no connection, and reach DNS and the store only`, () => {
      const objects = rendered[name];
      const policy = find(objects, 'NetworkPolicy', 'moerl-trainer') as NetworkPolicy;
      assert.equal(policy.metadata.namespace, 'moerl');
      assert.ok(matches(policy.spec.podSelector.matchLabels, trainerPodLabels), 'selects the trainer pods');
      assert.deepEqual(policy.spec.policyTypes, ['Ingress', 'Egress']);
      assert.deepEqual(
        policy.spec.ingress ?? [],
        [],
        'no connection in: the job policies admit their own pods',
      );
      assert.deepEqual(policy.spec.egress, [
        {
          to: [
            {
              namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'kube-system' } },
              podSelector: { matchLabels: { 'k8s-app': 'kube-dns' } },
            },
          ],
          ports: [
            { protocol: 'UDP', port: 53 },
            { protocol: 'TCP', port: 53 },
          ],
        },
      ]);
      const store = find(objects, 'NetworkPolicy', 'moerl-trainer-store') as NetworkPolicy;
      assert.ok(
        matches(store.spec.podSelector.matchLabels, trainerPodLabels),
        'the store policy selects them',
      );
      assert.deepEqual(store.spec.policyTypes, ['Egress']);
      assert.deepEqual(
        objects.filter((o) => o.kind === 'NetworkPolicy').map((o) => o.metadata.name),
        ['moerl-trainer', 'moerl-trainer-store'],
      );
      for (const rule of store.spec.egress ?? [])
        for (const peer of rule.to ?? []) {
          assert.ok(peer.ipBlock, `the store is an address block, not pods: ${JSON.stringify(peer)}`);
          for (const address of metadataService)
            assert.ok(!reaches(peer.ipBlock, address), `${JSON.stringify(peer.ipBlock)} reaches ${address}`);
        }
      for (const worker of workerDeployments(objects)) {
        const labels = worker.spec.template.metadata?.labels ?? {};
        assert.ok(
          !matches(policy.spec.podSelector.matchLabels, labels),
          `${worker.metadata.name} is not a trainer pod`,
        );
      }
    });

    it(`${kustomizations[name]}: the train worker creates and deletes token Secrets, reads none`, () => {
      const role = find(rendered[name], 'Role', 'moerl-train') as Role;
      const secrets = role.rules.filter((r) => r.resources.includes('secrets'));
      assert.deepEqual(
        secrets.flatMap((r) => r.verbs),
        ['create', 'delete'],
      );
    });
  }
});

describe("a job's own NetworkPolicy (the launcher's)", () => {
  const policy = networkPolicyManifest(
    spec,
    kubernetesLauncherSchema.parse({ kind: 'kubernetes', namespace: 'moerl', image: 'moerl:0.1.0' }),
    { name: spec.name, uid: 'uid' },
  );
  const selector = policy.spec!.podSelector!.matchLabels!;
  const otherJob = { ...trainerPodLabels, 'moerl.dev/job': 'other-u1-0a1b2c3d' };

  it("selects its job's pods and no other job's", () => {
    assert.ok(matches(selector, trainerPodLabels));
    assert.ok(!matches(selector, otherJob));
  });

  it("admits and reaches its job's pods only, in its own namespace", () => {
    const peers = [
      ...policy.spec!.ingress!.flatMap((r) => r._from!),
      ...policy.spec!.egress!.flatMap((r) => r.to!),
    ];
    assert.equal(peers.length, 2);
    for (const peer of peers) {
      assert.equal(peer.namespaceSelector, undefined, 'no other namespace');
      assert.equal(peer.ipBlock, undefined, 'no address block');
      assert.ok(matches(peer.podSelector!.matchLabels!, trainerPodLabels), 'its own pods');
      assert.ok(!matches(peer.podSelector!.matchLabels!, otherJob), "not another job's pods");
    }
  });
});
