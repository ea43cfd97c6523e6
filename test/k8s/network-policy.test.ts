// The rank port in every rendered kustomization: a NetworkPolicy lets trainer pods take
// connections from trainer pods only, selecting exactly the pods the launcher creates (its
// owner labels), and the train worker may create and delete the job token Secrets but read none.
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { jobManifest } from '../../activities/launch/kubernetes/manifests.js';
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

interface NetworkPolicy extends K8sObject {
  spec: {
    podSelector: { matchLabels: Record<string, string> };
    policyTypes: string[];
    ingress: {
      from: { podSelector?: { matchLabels: Record<string, string> }; namespaceSelector?: unknown }[];
    }[];
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

describe('the rank port', () => {
  for (const name of names) {
    it(`${kustomizations[name]}: trainer pods take connections from trainer pods only`, () => {
      const objects = rendered[name];
      const policy = find(objects, 'NetworkPolicy', 'moerl-trainer') as NetworkPolicy;
      assert.equal(policy.metadata.namespace, 'moerl');
      assert.ok(matches(policy.spec.podSelector.matchLabels, trainerPodLabels), 'selects the trainer pods');
      assert.deepEqual(policy.spec.policyTypes, ['Ingress']);
      assert.equal(policy.spec.ingress.length, 1);
      const from = policy.spec.ingress[0]!.from;
      assert.equal(from.length, 1);
      assert.equal(from[0]!.namespaceSelector, undefined, 'no other namespace');
      assert.ok(matches(from[0]!.podSelector!.matchLabels, trainerPodLabels), 'admits trainer pods');
      for (const worker of workerDeployments(objects)) {
        const labels = worker.spec.template.metadata?.labels ?? {};
        assert.ok(
          !matches(from[0]!.podSelector!.matchLabels, labels),
          `${worker.metadata.name} is not admitted`,
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
