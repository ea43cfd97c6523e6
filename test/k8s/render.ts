// Renders moerl's kustomizations (k8s/base, k8s/overlays/*) with the pinned kubectl's built-in
// kustomize, as `kubectl apply -k` would, and parses the result into plain objects.
import { execFile } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { parse, parseAllDocuments } from 'yaml';
import { repoRoot, resolveTool, type ToolName } from '../../cli/temporal-tools.js';

/** The kustomizations under k8s/, by golden-file name. */
export const kustomizations = { base: 'k8s/base', eks: 'k8s/overlays/eks', local: 'k8s/overlays/local' };
export type KustomizationName = keyof typeof kustomizations;

export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: {
    name: string;
    namespace?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
  };
  [field: string]: unknown;
}

/** The pinned kubectl (scripts/tools.sh resolves kubectl as it does the servers). */
export function kubectlPath(): Promise<string> {
  return resolveTool('kubectl' as unknown as ToolName);
}

/** `kubectl kustomize` of one kustomization: the text `kubectl apply -k` sends. */
export async function render(name: KustomizationName): Promise<string> {
  const kubectl = await kubectlPath();
  const { stdout } = await promisify(execFile)(kubectl, ['kustomize', kustomizations[name]], {
    cwd: repoRoot(),
    maxBuffer: 16 * 1024 * 1024,
  });
  return stdout;
}

/**
 * k8s/base rendered with its kustomization's `namespace:` changed to `namespace`, as an operator
 * who renames it would (a copy of k8s/ in a temporary folder).
 */
export async function renderRenamedBase(namespace: string): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'moerl-k8s-'));
  try {
    cpSync(join(repoRoot(), 'k8s'), join(dir, 'k8s'), { recursive: true });
    const file = join(dir, 'k8s', 'base', 'kustomization.yaml');
    const text = readFileSync(file, 'utf8');
    if (!/^namespace: moerl$/m.test(text)) throw new Error(`${file} has no line "namespace: moerl"`);
    writeFileSync(file, text.replace(/^namespace: moerl$/m, `namespace: ${namespace}`));
    const { stdout } = await promisify(execFile)(
      await kubectlPath(),
      ['kustomize', join(dir, 'k8s', 'base')],
      {
        maxBuffer: 16 * 1024 * 1024,
      },
    );
    return stdout;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export function parseObjects(text: string): K8sObject[] {
  return parseAllDocuments(text).map((doc) => {
    if (doc.errors.length) throw new Error(`rendered YAML does not parse: ${doc.errors[0]?.message}`);
    return doc.toJS() as K8sObject;
  });
}

/** A YAML file of the repository as a plain value (anchors resolved). */
export function readYaml(path: string): unknown {
  return parse(readFileSync(join(repoRoot(), path), 'utf8'));
}

export function find(objects: K8sObject[], kind: string, name: string): K8sObject {
  const found = objects.find((o) => o.kind === kind && o.metadata.name === name);
  if (!found) throw new Error(`no ${kind} ${name} in the rendered manifests`);
  return found;
}

// ---- the parts of a worker Deployment the tests read ----

export interface Container {
  name: string;
  image: string;
  imagePullPolicy?: string;
  command?: string[];
  args?: string[];
  envFrom?: { configMapRef?: { name: string }; secretRef?: { name: string } }[];
  env?: { name: string; value?: string; valueFrom?: unknown }[];
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  securityContext?: {
    allowPrivilegeEscalation?: boolean;
    readOnlyRootFilesystem?: boolean;
    capabilities?: { drop?: string[] };
  };
  volumeMounts?: { name: string; mountPath: string }[];
}

export interface PodSpec {
  serviceAccountName?: string;
  automountServiceAccountToken?: boolean;
  terminationGracePeriodSeconds?: number;
  hostNetwork?: boolean;
  nodeSelector?: Record<string, string>;
  tolerations?: { key?: string; operator?: string; value?: string; effect?: string }[];
  securityContext?: {
    runAsNonRoot?: boolean;
    runAsUser?: number;
    runAsGroup?: number;
    seccompProfile?: { type: string; localhostProfile?: string };
  };
  containers: Container[];
  volumes?: {
    name: string;
    emptyDir?: { sizeLimit?: string };
    hostPath?: { path: string };
    configMap?: { name: string };
  }[];
}

export interface Deployment extends K8sObject {
  spec: {
    replicas: number;
    selector: { matchLabels: Record<string, string> };
    template: { metadata: { labels: Record<string, string> }; spec: PodSpec };
  };
}

export function workerDeployments(objects: K8sObject[]): Deployment[] {
  return objects.filter((o): o is Deployment => o.kind === 'Deployment');
}
