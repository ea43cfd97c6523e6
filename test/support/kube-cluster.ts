// Test harness: a real Kubernetes control plane on 127.0.0.1 — etcd, kube-apiserver (TLS,
// Node+RBAC authorization, service-account tokens), kube-controller-manager, kube-scheduler —
// and optionally kwok running fake nodes, all on free ports with certificates made for this
// run in a temporary folder. One per test file: start it in `before`, stop it in `after`.
//
// Pods bound to a fake node go Running and stay Running until a test annotates them with an
// exit code (`setPodExitCode`, see kwok-stages.ts): "0" makes them Succeeded, any other code
// Failed with that code in status.containerStatuses[].state.terminated.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CoreV1Api, KubeConfig, PatchStrategy, setHeaderOptions, type V1Node } from '@kubernetes/client-node';
import { freePort } from '../../cli/dev-server.js';
import { resolveTool, type ToolName } from '../../cli/temporal-tools.js';
import {
  createClusterPki,
  frontProxyClientName,
  serviceClusterIpRange,
  writeKubeconfig,
  type CertPair,
} from './kube-pki.js';
import {
  kwokExitCodeAnnotation,
  kwokExitReasonAnnotation,
  kwokNodeAnnotation,
  kwokStagesYaml,
} from './kwok-stages.js';
import { probeFailureText, spawnGroup, waitUntilReady, type GroupProcess } from './process-group.js';

export interface KubeCluster {
  /** https://127.0.0.1:<port> */
  server: string;
  /** Path of a kubeconfig for kubernetes-admin (group system:masters), certificates embedded. */
  kubeconfig: string;
  /** The temporary folder with certificates, kubeconfigs and data; removed by stop(). */
  dir: string;
  /** Component logs (`<component>.log`): `opts.logDir`, or a folder inside `dir`. */
  logDir: string;
  /** The cluster CA, e.g. to issue a kubelet's client certificate (see issueCert in kube-pki.ts). */
  ca: CertPair;
  /** The service network (Service ClusterIPs only; nothing routes it). */
  serviceClusterIpRange: string;
  /** A client configuration for the admin kubeconfig, for @kubernetes/client-node APIs. */
  kubeConfig(): KubeConfig;
  /**
   * Creates `n` kwok-managed nodes (`fake-node-<k>`) and resolves with their names once each is
   * Ready and schedulable. `capacity` defaults to 64 cpu, 512Gi memory, 250 pods; extended
   * resources (e.g. "nvidia.com/gpu": "8") may be added.
   */
  addFakeNodes(
    n: number,
    labels?: Record<string, string>,
    capacity?: Record<string, string>,
  ): Promise<string[]>;
  /** Creates a namespace with a fresh name and waits for its default ServiceAccount. */
  createNamespace(prefix?: string): Promise<string>;
  /**
   * Ends a running pod on a fake node with this container exit code (0..255). A pod already gone
   * is left alone: its Job removed it (a Job whose success policy is met stops its other pods).
   */
  setPodExitCode(namespace: string, pod: string, exitCode: number, reason?: string): Promise<void>;
  /** Runs the pinned kubectl against this cluster (admin). */
  kubectl(
    args: string[],
    opts?: { input?: string },
  ): Promise<{ code: number; stdout: string; stderr: string }>;
  /** Stops every process it started (SIGTERM, then SIGKILL) and removes `dir`. */
  stop(): Promise<void>;
}

export interface KubeClusterOptions {
  /** Start kwok to run fake nodes; default true. */
  kwok?: boolean;
  /** Keep the component logs in this folder (created if missing) instead of inside `dir`. */
  logDir?: string;
  /** Deadline for the whole start-up; default 180 s (a loaded CI machine is slow). */
  startTimeoutMs?: number;
}

/** The control plane did not come up; the message names the component and ends with its log. */
export class KubeClusterError extends Error {
  override readonly name = 'KubeClusterError';
}

type KubeTool = 'etcd' | 'kube-apiserver' | 'kube-controller-manager' | 'kube-scheduler' | 'kwok' | 'kubectl';

// scripts/tools.sh resolves these names too; cli/temporal-tools.ts only lists its own in ToolName.
const tool = (name: KubeTool): Promise<string> => resolveTool(name as unknown as ToolName);

const LOOPBACK = '127.0.0.1';
const START_ATTEMPTS = 3;
const serviceAccountIssuer = 'https://kubernetes.default.svc.cluster.local';

export async function startKubeCluster(opts: KubeClusterOptions = {}): Promise<KubeCluster> {
  const withKwok = opts.kwok ?? true;
  const names: KubeTool[] = [
    'etcd',
    'kube-apiserver',
    'kube-controller-manager',
    'kube-scheduler',
    'kubectl',
  ];
  if (withKwok) names.push('kwok');
  // One at a time: the first call may build all five Kubernetes binaries, the next reuse them.
  const binaries = {} as Record<KubeTool, string>;
  for (const name of names) binaries[name] = await tool(name);

  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(binaries, withKwok, opts);
    } catch (err) {
      // A port found free a moment ago may be taken before its server binds it.
      const portTaken = err instanceof KubeClusterError && /address already in use/i.test(err.message);
      if (!portTaken || attempt >= START_ATTEMPTS) throw err;
    }
  }
}

async function startOnce(
  bin: Record<KubeTool, string>,
  withKwok: boolean,
  opts: KubeClusterOptions,
): Promise<KubeCluster> {
  const deadline = Date.now() + (opts.startTimeoutMs ?? 180_000);
  const dir = mkdtempSync(join(tmpdir(), 'moerl-kube-'));
  const logDir = opts.logDir ? resolve(opts.logDir) : join(dir, 'logs');
  mkdirSync(logDir, { recursive: true });
  // Layers in start order: etcd, the apiserver, its clients. They stop in reverse, so that no
  // component spends its shutdown retrying one that is already gone.
  const layers: GroupProcess[][] = [[], [], []];
  const stopAll = async (): Promise<void> => {
    for (const layer of [...layers].reverse()) await Promise.all(layer.map((proc) => proc.stop(5_000)));
  };
  const start = (
    layer: number,
    name: string,
    binary: string,
    args: string[],
    env?: NodeJS.ProcessEnv,
  ): GroupProcess => {
    const proc = spawnGroup(name, binary, args, join(logDir, `${name}.log`), env);
    layers[layer]?.push(proc);
    return proc;
  };

  try {
    const pki = await createClusterPki(dir);
    const [etcdPort, etcdPeerPort, apiPort, cmPort, schedulerPort, kwokPort] = await Promise.all(
      Array.from({ length: 6 }, () => freePort()),
    );
    const server = `https://${LOOPBACK}:${apiPort}`;
    const kubeconfig = join(dir, 'admin.kubeconfig');
    writeKubeconfig(kubeconfig, server, pki.ca, pki.admin);
    const cmKubeconfig = join(dir, 'controller-manager.kubeconfig');
    writeKubeconfig(cmKubeconfig, server, pki.ca, pki.controllerManager);
    const schedulerKubeconfig = join(dir, 'scheduler.kubeconfig');
    writeKubeconfig(schedulerKubeconfig, server, pki.ca, pki.scheduler);
    const tls = {
      ca: readFileSync(pki.ca.certPath),
      cert: readFileSync(pki.admin.certPath),
      key: readFileSync(pki.admin.keyPath),
    };

    const etcdUrl = `http://${LOOPBACK}:${etcdPort}`;
    const etcdPeerUrl = `http://${LOOPBACK}:${etcdPeerPort}`;
    const etcd = start(0, 'etcd', bin.etcd, [
      '--name=moerl-test',
      `--data-dir=${join(dir, 'etcd')}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=${etcdPeerUrl}`,
      `--initial-advertise-peer-urls=${etcdPeerUrl}`,
      `--initial-cluster=moerl-test=${etcdPeerUrl}`,
      // Test data need not survive a power cut; fsync dominates etcd latency on slow disks.
      '--unsafe-no-fsync',
      '--log-level=warn',
    ]);
    await waitUntil(etcd, deadline, async () => {
      const answer = await fetch(`${etcdUrl}/health`, { signal: AbortSignal.timeout(2_000) });
      const body = await answer.text();
      return answer.ok && body.includes('"health":"true"') ? true : `HTTP ${answer.status} ${body}`;
    });

    const apiserver = start(1, 'kube-apiserver', bin['kube-apiserver'], [
      `--etcd-servers=${etcdUrl}`,
      `--bind-address=${LOOPBACK}`,
      `--advertise-address=${LOOPBACK}`,
      `--secure-port=${apiPort}`,
      `--tls-cert-file=${pki.apiserver.certPath}`,
      `--tls-private-key-file=${pki.apiserver.keyPath}`,
      `--client-ca-file=${pki.ca.certPath}`,
      '--authorization-mode=Node,RBAC',
      // The node's InternalIP: a node name would be looked up through the host's resolver.
      '--kubelet-preferred-address-types=InternalIP',
      '--enable-admission-plugins=NodeRestriction',
      `--service-cluster-ip-range=${serviceClusterIpRange}`,
      `--service-account-issuer=${serviceAccountIssuer}`,
      `--service-account-key-file=${pki.serviceAccountPub}`,
      `--service-account-signing-key-file=${pki.serviceAccountKey}`,
      `--kubelet-client-certificate=${pki.apiserverKubeletClient.certPath}`,
      `--kubelet-client-key=${pki.apiserverKubeletClient.keyPath}`,
      '--allow-privileged=true',
      // The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints reject as
      // loopback; nothing in these tests reaches the apiserver through that Service.
      '--endpoint-reconciler-type=none',
      '--profiling=false',
      // The aggregation layer, for API servers such as KEDA's external metrics (keda.ts): the
      // apiserver proxies to them with this client certificate and tells them the user in
      // headers they trust because the certificate is the cluster CA's, with this one name.
      `--requestheader-client-ca-file=${pki.ca.certPath}`,
      `--requestheader-allowed-names=${frontProxyClientName}`,
      '--requestheader-username-headers=X-Remote-User',
      '--requestheader-group-headers=X-Remote-Group',
      '--requestheader-extra-headers-prefix=X-Remote-Extra-',
      `--proxy-client-cert-file=${pki.frontProxyClient.certPath}`,
      `--proxy-client-key-file=${pki.frontProxyClient.keyPath}`,
    ]);
    await waitUntil(apiserver, deadline, async () => {
      const answer = await httpsGet(`${server}/readyz?verbose`, tls);
      if (answer.status === 200) return true;
      // The checks that fail, e.g. "[-]poststarthook/rbac/bootstrap-roles failed: reason withheld".
      const failing = answer.body.split('\n').filter((line) => line.startsWith('[-]'));
      return `HTTP ${answer.status} ${failing.join('; ') || answer.body.slice(-300)}`;
    });

    const servingTls = [
      `--bind-address=${LOOPBACK}`,
      `--tls-cert-file=${pki.loopbackServing.certPath}`,
      `--tls-private-key-file=${pki.loopbackServing.keyPath}`,
      '--leader-elect=false',
    ];
    const controllerManager = start(2, 'kube-controller-manager', bin['kube-controller-manager'], [
      `--kubeconfig=${cmKubeconfig}`,
      `--secure-port=${cmPort}`,
      ...servingTls,
      '--controllers=*',
      `--service-account-private-key-file=${pki.serviceAccountKey}`,
      `--root-ca-file=${pki.ca.certPath}`,
      '--use-service-account-credentials=true',
      `--cluster-signing-cert-file=${pki.ca.certPath}`,
      `--cluster-signing-key-file=${pki.ca.keyPath}`,
      // Autoscalers answer within a test's patience (default 15 s).
      '--horizontal-pod-autoscaler-sync-period=3s',
    ]);
    const scheduler = start(2, 'kube-scheduler', bin['kube-scheduler'], [
      `--kubeconfig=${schedulerKubeconfig}`,
      `--secure-port=${schedulerPort}`,
      ...servingTls,
    ]);
    const waits = [
      waitUntil(controllerManager, deadline, () => healthz(`https://${LOOPBACK}:${cmPort}/healthz`, tls.ca)),
      waitUntil(scheduler, deadline, () => healthz(`https://${LOOPBACK}:${schedulerPort}/healthz`, tls.ca)),
      // Pods are admitted only once their namespace's default ServiceAccount exists.
      waitUntil(controllerManager, deadline, async () => {
        const answer = await httpsGet(`${server}/api/v1/namespaces/default/serviceaccounts/default`, tls);
        return answer.status === 200 ? true : `default ServiceAccount: HTTP ${answer.status}`;
      }),
    ];
    if (withKwok) {
      const stages = join(dir, 'kwok-stages.yaml');
      writeFileSync(stages, kwokStagesYaml());
      const kwok = start(
        2,
        'kwok',
        bin.kwok,
        [
          `--kubeconfig=${kubeconfig}`,
          `--config=${stages}`,
          `--manage-nodes-with-annotation-selector=${kwokNodeAnnotation.key}=${kwokNodeAnnotation.value}`,
          `--node-ip=${LOOPBACK}`,
          '--cidr=10.244.0.0/16',
          '--node-lease-duration-seconds=40',
          `--server-address=${LOOPBACK}:${kwokPort}`,
        ],
        // kwok also reads ~/.kwok/kwok.yaml; its own folder keeps a user's config out.
        { ...process.env, KWOK_WORKDIR: join(dir, 'kwok') },
      );
      waits.push(
        waitUntil(kwok, deadline, async () => {
          const answer = await fetch(`http://${LOOPBACK}:${kwokPort}/healthz`, {
            signal: AbortSignal.timeout(2_000),
          });
          return answer.ok ? true : `HTTP ${answer.status}`;
        }),
      );
    }
    await Promise.all(waits);
    return clusterHandle({ server, kubeconfig, dir, logDir, ca: pki.ca, kubectlPath: bin.kubectl, stopAll });
  } catch (err) {
    await stopAll();
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

function clusterHandle(c: {
  server: string;
  kubeconfig: string;
  dir: string;
  logDir: string;
  ca: CertPair;
  kubectlPath: string;
  stopAll: () => Promise<void>;
}): KubeCluster {
  const kubeConfig = (): KubeConfig => {
    const config = new KubeConfig();
    config.loadFromFile(c.kubeconfig);
    return config;
  };
  const core = kubeConfig().makeApiClient(CoreV1Api);
  let nodes = 0;
  let stopped: Promise<void> | undefined;
  return {
    server: c.server,
    kubeconfig: c.kubeconfig,
    dir: c.dir,
    logDir: c.logDir,
    ca: c.ca,
    serviceClusterIpRange,
    kubeConfig,
    async addFakeNodes(n, labels = {}, capacity) {
      const names = Array.from({ length: n }, () => `fake-node-${++nodes}`);
      const resources = { cpu: '64', memory: '512Gi', pods: '250', ...capacity };
      await Promise.all(
        names.map((name) =>
          core.createNode({
            body: {
              metadata: {
                name,
                labels: {
                  'kubernetes.io/hostname': name,
                  'kubernetes.io/os': 'linux',
                  type: 'kwok',
                  ...labels,
                },
                annotations: { [kwokNodeAnnotation.key]: kwokNodeAnnotation.value },
              },
              status: { allocatable: resources, capacity: resources },
            },
          }),
        ),
      );
      await Promise.all(names.map((name) => waitForNode(core, name)));
      return names;
    },
    async createNamespace(prefix = 'test') {
      const name = `${prefix}-${randomBytes(4).toString('hex')}`;
      await core.createNamespace({ body: { metadata: { name } } });
      await waitFor(`the default ServiceAccount of namespace ${name}`, 60_000, async () => {
        await core.readNamespacedServiceAccount({ namespace: name, name: 'default' });
        return true;
      });
      return name;
    },
    async setPodExitCode(namespace, pod, exitCode, reason) {
      if (!Number.isInteger(exitCode) || exitCode < 0 || exitCode > 255)
        throw new RangeError(
          `setPodExitCode(${namespace}/${pod}): exit code must be an integer 0..255, got ${exitCode}`,
        );
      const annotations: Record<string, string> = { [kwokExitCodeAnnotation]: String(exitCode) };
      if (reason !== undefined) annotations[kwokExitReasonAnnotation] = reason;
      await core
        .patchNamespacedPod(
          { namespace, name: pod, body: { metadata: { annotations } } },
          setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
        )
        .catch((err: unknown) => {
          if ((err as { code?: number }).code !== 404) throw err;
        });
    },
    kubectl(args, opts = {}) {
      return runKubectl(c.kubectlPath, ['--kubeconfig', c.kubeconfig, ...args], opts.input);
    },
    stop() {
      stopped ??= c.stopAll().finally(() => rmSync(c.dir, { recursive: true, force: true }));
      return stopped;
    },
  };
}

// Ready, and the node lifecycle controller has lifted the not-ready taint it is born with.
async function waitForNode(core: CoreV1Api, name: string): Promise<void> {
  await waitFor(`node ${name} to become Ready`, 60_000, async () => {
    const node: V1Node = await core.readNode({ name });
    const ready = node.status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True';
    const tainted = (node.spec?.taints ?? []).some((t) => t.key.startsWith('node.kubernetes.io/'));
    return ready && !tainted ? true : `Ready=${ready}, taints=${JSON.stringify(node.spec?.taints ?? [])}`;
  });
}

/**
 * Installs an operator's CustomResourceDefinitions from `dir` (files named <group>_<plural>.yaml,
 * as controller-gen writes them), waits until each is established, and creates the operator's
 * `namespace`. `what` names the operator in the errors.
 */
export async function installOperatorCrds(
  cluster: KubeCluster,
  what: string,
  dir: string,
  namespace: string,
): Promise<void> {
  const files = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.yaml')) : [];
  if (files.length === 0) throw new KubeClusterError(`no ${what} CRDs in ${dir}`);
  const apply = await cluster.kubectl(['apply', '--server-side', '-f', dir]);
  if (apply.code !== 0) throw new KubeClusterError(`applying ${what}'s CRDs failed: ${apply.stderr}`);
  const established = await cluster.kubectl([
    'wait',
    '--for=condition=Established',
    '--timeout=60s',
    ...files.map((f) => `crd/${f.replace(/^(.*?)_(.*)\.yaml$/, '$2.$1')}`),
  ]);
  if (established.code !== 0)
    throw new KubeClusterError(`${what}'s CRDs are not established: ${established.stderr}`);
  const ns = await cluster.kubectl(['create', 'namespace', namespace]);
  if (ns.code !== 0 && !/AlreadyExists/.test(ns.stderr))
    throw new KubeClusterError(`creating namespace ${namespace} failed: ${ns.stderr}`);
}

/**
 * Polls `probe` every 200 ms until it returns true; a string (or a thrown error) is the reason
 * it is not there yet, quoted in the timeout error.
 */
export async function waitFor(
  what: string,
  timeoutMs: number,
  probe: () => Promise<true | string>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer yet';
  for (;;) {
    try {
      if ((last = errorText(await probe())) === '') return;
    } catch (err) {
      last = errorText(err);
    }
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${last})`);
    await new Promise((done) => setTimeout(done, 200));
  }
}

/** Waits for a component's probe, failing early (with its log) when the process exits. */
const waitUntil = (proc: GroupProcess, deadline: number, probe: () => Promise<true | string>) =>
  waitUntilReady(proc, deadline, probe, (message) => new KubeClusterError(message));

function errorText(value: unknown): string {
  return value === true ? '' : probeFailureText(value);
}

function httpsGet(
  url: string,
  tls: { ca: Buffer; cert?: Buffer; key?: Buffer },
): Promise<{ status: number; body: string }> {
  return new Promise((done, fail) => {
    const req = request(url, { ...tls, timeout: 2_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
      res.on('end', () => done({ status: res.statusCode ?? 0, body }));
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url} within 2 s`)));
    req.on('error', fail);
    req.end();
  });
}

async function healthz(url: string, ca: Buffer): Promise<true | string> {
  const answer = await httpsGet(url, { ca });
  return answer.status === 200 ? true : `HTTP ${answer.status} ${answer.body.slice(-300)}`;
}

function runKubectl(
  binary: string,
  args: string[],
  input: string | undefined,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done, fail) => {
    const child: ChildProcess = spawn(binary, args, { stdio: ['pipe', 'pipe', 'pipe'], timeout: 120_000 });
    let stdout = '';
    let stderr = '';
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    child.on('error', fail);
    child.on('close', (code, signal) => done({ code: code ?? (signal ? 128 : 1), stdout, stderr }));
    child.stdin?.end(input ?? '');
  });
}

// Re-exported so that a test needs one import for the cluster and the pod-ending annotation.
export { kwokExitCodeAnnotation, kwokExitReasonAnnotation } from './kwok-stages.js';
