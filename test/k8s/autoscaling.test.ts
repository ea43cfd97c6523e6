// k8s/autoscaling, the Component that has KEDA size the rollout Deployment by the campaigns'
// demand, rendered with the pinned kubectl in the eks overlay (which uses it), alone and with
// k8s/monitoring and temporal-backlog/ added: the ScaledObject scales the rollout Deployment,
// which no longer sets replicas; its metrics-api trigger reads the metric the control worker
// exports, through a Service that selects the control pods on the port their worker serves (by
// the worker's own argument parser); one pod's ranks are its CPU request; the fleet's maximum
// is the Spot group's; the components together give no container an environment variable twice.
// test/k8s/manifests-server.test.ts has the API server check these objects with KEDA's CRDs.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import { after, describe, it } from 'node:test';
import { repoRoot } from '../../cli/temporal-tools.js';
import { rolloutRanksWantedMetric } from '../../workers/demand.js';
import { parseWorkerArgs } from '../../workers/main.js';
import {
  find,
  kubectlPath,
  parseObjects,
  readYaml,
  render,
  workerDeployments,
  type K8sObject,
} from './render.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-autoscaling-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** The eks overlay with more components, as a user's kustomization would add them. */
async function eksWith(components: string[]): Promise<K8sObject[]> {
  const at = join(dir, components.join('+').replace(/\//g, '_'));
  const k8s = relative(at, join(repoRoot(), 'k8s'));
  rmSync(at, { recursive: true, force: true });
  mkdirSync(at, { recursive: true });
  writeFileSync(
    join(at, 'kustomization.yaml'),
    `resources:\n  - ${k8s}/overlays/eks\ncomponents:\n${components.map((c) => `  - ${k8s}/${c}\n`).join('')}`,
  );
  const { stdout } = await promisify(execFile)(await kubectlPath(), ['kustomize', at], {
    maxBuffer: 16 * 1024 * 1024,
  });
  return parseObjects(stdout);
}

interface Trigger {
  type: string;
  name: string;
  metricType?: string;
  metadata: Record<string, string>;
  authenticationRef?: { name: string };
}
interface ScaledObject extends K8sObject {
  spec: {
    scaleTargetRef: { name: string; kind?: string };
    minReplicaCount: number;
    maxReplicaCount: number;
    cooldownPeriod: number;
    pollingInterval: number;
    triggers: Trigger[];
    advanced: { horizontalPodAutoscalerConfig: { behavior: { scaleDown: { policies: unknown[] } } } };
  };
}
interface Service extends K8sObject {
  spec: { selector: Record<string, string>; ports: { port: number; targetPort: string | number }[] };
}

const scaledObject = (objects: K8sObject[]) => find(objects, 'ScaledObject', 'moerl-rollout') as ScaledObject;
const envOf = (c: { env?: { name: string; value?: string }[] }) =>
  Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value ?? '']));

describe('k8s/autoscaling in the eks overlay', () => {
  it('KEDA scales the rollout Deployment by moerl_rollout_ranks_wanted, read from the control workers', async () => {
    const objects = parseObjects(await render('eks'));
    const so = scaledObject(objects);
    assert.equal(so.metadata.namespace, 'moerl');
    const rollout = workerDeployments(objects).find((d) => d.metadata.name === so.spec.scaleTargetRef.name);
    assert.ok(rollout, 'the target is the rollout Deployment');
    assert.equal(
      rollout.spec.replicas,
      undefined,
      "replicas are the autoscaler's, not reset by kubectl apply",
    );
    assert.equal(so.spec.minReplicaCount, 0, 'scales to zero between campaigns');

    const [trigger, ...others] = so.spec.triggers;
    assert.deepEqual(others, [], 'the demand alone (temporal-backlog/ adds the backlog)');
    assert.equal(trigger?.type, 'metrics-api');
    assert.equal(trigger.metricType, 'AverageValue');
    assert.equal(trigger.metadata.format, 'prometheus');
    assert.equal(trigger.metadata.valueLocation, rolloutRanksWantedMetric);
    assert.equal(trigger.metadata.activationTargetValue, '0', 'any demand brings the first pod');

    // The URL's Service selects the control pods, on the port their worker serves metrics at.
    const url = new URL(trigger.metadata.url!);
    const [serviceName, serviceNamespace, svc] = url.hostname.split('.');
    assert.equal(svc, 'svc');
    assert.equal(url.pathname, '/metrics');
    const service = find(objects, 'Service', serviceName!) as Service;
    assert.equal(service.metadata.namespace, serviceNamespace);
    const servicePort = service.spec.ports.find((p) => p.port === Number(url.port));
    assert.ok(servicePort, `the Service has port ${url.port}`);
    const control = workerDeployments(objects).find((d) => d.metadata.name === 'moerl-control')!;
    for (const [k, v] of Object.entries(service.spec.selector))
      assert.equal(control.spec.template.metadata.labels[k], v, `the Service selects control pods (${k})`);
    assert.notEqual(
      rollout.spec.template.metadata.labels['moerl.dev/role'],
      service.spec.selector['moerl.dev/role'],
    );
    const container = control.spec.template.spec
      .containers[0]! as (typeof control.spec.template.spec.containers)[0] & {
      ports?: { name: string; containerPort: number }[];
    };
    const port = container.ports?.find((p) => p.name === servicePort.targetPort);
    assert.ok(port, `the control container names port ${servicePort.targetPort}`);
    const metrics = parseWorkerArgs(['--role', 'control'], envOf(container)).metrics;
    assert.equal(metrics.port, port.containerPort, 'the worker serves its metrics there');
    assert.equal(metrics.host, '0.0.0.0', 'on the pod address');

    // One pod runs its CPU request in ranks (the Downward API rounds up).
    const rolloutContainer = rollout.spec.template.spec.containers[0]!;
    const cpu = Math.ceil(Number(rolloutContainer.resources?.requests?.cpu));
    assert.equal(Number(trigger.metadata.targetValue), cpu, 'targetValue = ranks per rollout pod');
    // One pod per node of the Spot group: the fleet's maximum is the group's.
    const cluster = readYaml('k8s/overlays/eks/cluster.yaml') as {
      managedNodeGroups: { name: string; maxSize: number }[];
    };
    const spot = cluster.managedNodeGroups.find((g) => g.name === 'rollout-spot')!;
    assert.equal(so.spec.maxReplicaCount, spot.maxSize);
  });

  it('with k8s/monitoring and temporal-backlog: no variable twice, the backlog trigger with its credentials', async () => {
    for (const components of [['monitoring'], ['autoscaling/temporal-backlog', 'monitoring']]) {
      const objects = await eksWith(components);
      for (const d of workerDeployments(objects))
        for (const c of d.spec.template.spec.containers) {
          const names = (c.env ?? []).map((e) => e.name);
          assert.deepEqual(
            names,
            [...new Set(names)],
            `${d.metadata.name}: each variable once (${components})`,
          );
          const parsed = parseWorkerArgs([], envOf(c)).metrics;
          assert.equal(parsed.port, 9464, `${d.metadata.name} serves metrics`);
        }
    }
    const objects = await eksWith(['autoscaling/temporal-backlog']);
    const triggers = scaledObject(objects).spec.triggers;
    assert.deepEqual(
      triggers.map((t) => t.type),
      ['metrics-api', 'temporal'],
    );
    const temporal = triggers[1]!;
    // Its name carries a content hash.
    const config = objects.find(
      (o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('moerl-config-'),
    ) as (K8sObject & { data: Record<string, string> }) | undefined;
    assert.ok(config, "the workers' moerl-config");
    assert.equal(temporal.metadata.taskQueue, `${config.data.MOERL_TASK_QUEUE_PREFIX ?? ''}rollout`);
    assert.equal(temporal.metadata.endpoint, config.data.TEMPORAL_ADDRESS);
    assert.equal(temporal.metadata.namespace, config.data.TEMPORAL_NAMESPACE);
    assert.equal(temporal.metadata.queueTypes, 'activity');
    assert.equal(temporal.metadata.enableTLS, config.data.TEMPORAL_TLS);
    const auth = find(objects, 'TriggerAuthentication', temporal.authenticationRef!.name) as K8sObject & {
      spec: { secretTargetRef: { parameter: string; name: string; key: string }[] };
    };
    assert.equal(auth.metadata.namespace, 'moerl');
    // The API key the workers read (TEMPORAL_API_KEY from Secret moerl-temporal, key api-key).
    const rollout = workerDeployments(objects).find((d) => d.metadata.name === 'moerl-rollout')!;
    const apiKey = (
      rollout.spec.template.spec.containers[0]!.env as {
        name: string;
        valueFrom?: { secretKeyRef?: { name: string; key: string } };
      }[]
    ).find((e) => e.name === 'TEMPORAL_API_KEY')?.valueFrom?.secretKeyRef;
    assert.deepEqual(auth.spec.secretTargetRef, [
      { parameter: 'apiKey', name: apiKey?.name, key: apiKey?.key },
    ]);
  });
});
