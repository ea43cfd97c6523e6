// k8s/monitoring, the Component that turns on the workers' metrics, as an overlay that adds it
// renders it with the pinned kubectl: every worker serves both metrics ports (as the worker
// parses its environment), the PodMonitor selects exactly the worker pods and names ports they
// have, and the dashboard ConfigMap carries the dashboard file unchanged.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import { after, describe, it } from 'node:test';
import { repoRoot } from '../../cli/temporal-tools.js';
import { parseWorkerArgs } from '../../workers/main.js';
import { find, kubectlPath, parseObjects, workerDeployments, type K8sObject } from './render.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-monitoring-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** `overlay` with the monitoring component added, as a user's kustomization would add it. */
async function renderWithMonitoring(overlay: string): Promise<K8sObject[]> {
  const at = join(dir, overlay);
  const k8s = relative(at, join(repoRoot(), 'k8s'));
  rmSync(at, { recursive: true, force: true });
  mkdirSync(at, { recursive: true });
  writeFileSync(
    join(at, 'kustomization.yaml'),
    `resources:\n  - ${k8s}/overlays/${overlay}\ncomponents:\n  - ${k8s}/monitoring\n`,
  );
  const { stdout } = await promisify(execFile)(await kubectlPath(), ['kustomize', at], {
    maxBuffer: 16 * 1024 * 1024,
  });
  return parseObjects(stdout);
}

interface PodMonitor extends K8sObject {
  spec: {
    selector: {
      matchLabels?: Record<string, string>;
      matchExpressions?: { key: string; operator: string; values: string[] }[];
    };
    podMetricsEndpoints: { port: string; path: string; relabelings?: { sourceLabels: string[] }[] }[];
  };
}

/** Whether a label selector (matchLabels and In expressions) selects `labels`. */
function selects(selector: PodMonitor['spec']['selector'], labels: Record<string, string>): boolean {
  return (
    Object.entries(selector.matchLabels ?? {}).every(([k, v]) => labels[k] === v) &&
    (selector.matchExpressions ?? []).every((e) => {
      assert.equal(e.operator, 'In', 'only In expressions are checked here');
      return labels[e.key] !== undefined && e.values.includes(labels[e.key]!);
    })
  );
}

describe('k8s/monitoring added to an overlay', () => {
  for (const overlay of ['eks', 'local'])
    it(`overlays/${overlay} + monitoring: metrics on, scraped by the PodMonitor, dashboard shipped`, async () => {
      const objects = await renderWithMonitoring(overlay);
      const workers = workerDeployments(objects);
      assert.equal(workers.length, 3);
      const monitor = find(objects, 'PodMonitor', 'moerl-workers') as PodMonitor;
      assert.equal(monitor.metadata.namespace, 'moerl');
      for (const d of workers) {
        const pod = d.spec.template;
        const c = pod.spec.containers[0]!;
        const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value ?? '']));
        // What the worker makes of its environment, by its own parser.
        assert.deepEqual(parseWorkerArgs([], env).metrics, {
          port: 9464,
          sdkPort: 9465,
          host: '0.0.0.0',
          demandIntervalMs: 10_000,
        });
        const ports = (c as { ports?: { name: string; containerPort: number }[] }).ports ?? [];
        assert.deepEqual(
          ports.map((p) => [p.name, p.containerPort]).sort(), // k8s/autoscaling may have added the first
          [
            ['metrics', 9464],
            ['sdk-metrics', 9465],
          ],
          d.metadata.name,
        );
        assert.ok(
          selects(monitor.spec.selector, pod.metadata.labels),
          `the PodMonitor selects ${d.metadata.name}`,
        );
        for (const endpoint of monitor.spec.podMetricsEndpoints)
          assert.ok(
            ports.some((p) => p.name === endpoint.port),
            `${d.metadata.name} has port ${endpoint.port}`,
          );
        // The role label comes from the pod label Kubernetes discovery exposes under this name.
        assert.ok(pod.metadata.labels['moerl.dev/role']);
      }
      for (const endpoint of monitor.spec.podMetricsEndpoints)
        assert.deepEqual(endpoint.relabelings?.[0]?.sourceLabels, [
          '__meta_kubernetes_pod_label_moerl_dev_role',
        ]);
      // A trainer rank's pod (labels of activities/launch/kubernetes/manifests.ts) is not selected.
      assert.ok(
        !selects(monitor.spec.selector, {
          'app.kubernetes.io/name': 'moerl',
          'app.kubernetes.io/component': 'trainer',
        }),
      );
      const dashboard = find(objects, 'ConfigMap', 'moerl-grafana-dashboard') as K8sObject & {
        data: Record<string, string>;
      };
      assert.equal(dashboard.metadata.labels?.grafana_dashboard, '1');
      assert.equal(
        dashboard.data['moerl-campaigns.json'],
        readFileSync(join(repoRoot(), 'k8s', 'monitoring', 'grafana-dashboard.json'), 'utf8'),
      );
    });
});
