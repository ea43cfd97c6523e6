// Test harness: KEDA's real operator and metrics API server (built by scripts/tools.sh from its
// pinned Go module) against a test control plane (kube-cluster.ts). The operator reconciles
// ScaledObjects into HPAs, polls their triggers and scales to and from zero itself; the metrics
// server serves external.metrics.k8s.io through the API server's aggregation layer, which the
// controller manager's HPA controller reads. Both run on the host as KEDA's pods would, with
// certificates of the cluster's CA instead of KEDA's own rotation: the operator's gRPC metrics
// service and the metrics server's client share one mutual-TLS pair (KEDA's cert-dir layout),
// and the APIService points at an ExternalName Service whose name, 127.0.0.1, the aggregator
// dials, verifying the metrics server's certificate for <service>.<namespace>.svc.
// One exception to "everything binds 127.0.0.1": KEDA's metrics server serves its own
// Prometheus metrics on every interface (its --port has no host part); it gets a free port.
import { copyFileSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { freePort, logTail } from '../../cli/dev-server.js';
import { resolveTool, type ToolName } from '../../cli/temporal-tools.js';
import { installOperatorCrds, type KubeCluster } from './kube-cluster.js';
import { issueCert } from './kube-pki.js';
import { spawnGroup, waitUntilReady, type GroupProcess } from './process-group.js';

/** KEDA's namespace: where it looks for its cluster-wide objects (KEDA_CLUSTER_OBJECT_NAMESPACE). */
const kedaNamespace = 'keda';
const metricsServerService = 'keda-metrics-apiserver';
const externalMetricsApiService = 'v1beta1.external.metrics.k8s.io';

export interface Keda {
  operatorLog: string;
  /** Fails, with its log, if the operator or the metrics server has exited since it started. */
  assertRunning(): void;
  stop(): Promise<void>;
}

export class KedaError extends Error {
  override readonly name = 'KedaError';
}

// scripts/tools.sh resolves these; cli/temporal-tools.ts only lists its own in ToolName.
const tool = (name: 'keda-operator' | 'keda-adapter' | 'keda-crds'): Promise<string> =>
  resolveTool(name as unknown as ToolName);

async function kubectlOrThrow(
  cluster: KubeCluster,
  what: string,
  args: string[],
  input?: string,
): Promise<void> {
  const out = await cluster.kubectl(args, input === undefined ? {} : { input });
  if (out.code !== 0 && !/AlreadyExists/.test(out.stderr))
    throw new KedaError(`${what} failed: ${out.stderr}`);
}

/**
 * Installs KEDA's CRDs, starts its operator and metrics server and registers the external
 * metrics API; resolves once the API server reports that API available.
 */
export async function startKeda(cluster: KubeCluster, opts: { startTimeoutMs?: number } = {}): Promise<Keda> {
  const deadline = Date.now() + (opts.startTimeoutMs ?? 180_000);
  // One at a time: the first call may build both binaries, the second reuses the build.
  const operatorBinary = await tool('keda-operator');
  const adapterBinary = await tool('keda-adapter');
  const crds = await tool('keda-crds');
  await installOperatorCrds(cluster, 'KEDA', crds, kedaNamespace);

  const dir = join(cluster.dir, 'keda');
  const certDir = join(dir, 'certs');
  mkdirSync(certDir, { recursive: true });
  const [grpcPair, serving] = await Promise.all([
    issueCert(dir, 'grpc', cluster.ca, { cn: 'keda-operator', usage: 'both', ips: ['127.0.0.1'] }),
    issueCert(dir, 'metrics-server', cluster.ca, {
      cn: metricsServerService,
      usage: 'server',
      dnsNames: [`${metricsServerService}.${kedaNamespace}.svc`],
      ips: ['127.0.0.1'],
    }),
  ]);
  // KEDA's cert-dir: the gRPC peers' certificate and the CA both trust.
  copyFileSync(grpcPair.certPath, join(certDir, 'tls.crt'));
  copyFileSync(grpcPair.keyPath, join(certDir, 'tls.key'));
  copyFileSync(cluster.ca.certPath, join(certDir, 'ca.crt'));

  const [probePort, grpcPort, securePort, adapterMetricsPort] = await Promise.all(
    Array.from({ length: 4 }, () => freePort()),
  );
  const env = {
    ...process.env,
    KUBECONFIG: cluster.kubeconfig,
    KEDA_CLUSTER_OBJECT_NAMESPACE: kedaNamespace,
    WATCH_NAMESPACE: '',
    POD_NAMESPACE: kedaNamespace,
  };
  const started: GroupProcess[] = [];
  const stop = async () => {
    for (const proc of started.reverse()) await proc.stop(10_000);
  };
  try {
    const operator = spawnGroup(
      'keda-operator',
      operatorBinary,
      [
        `--health-probe-bind-address=127.0.0.1:${probePort}`,
        `--metrics-service-bind-address=127.0.0.1:${grpcPort}`,
        '--enable-prometheus-metrics=false',
        '--leader-elect=false',
        '--enable-cert-rotation=false',
        '--enable-webhook-patching=false',
        '--enable-apiservice-patching=false',
        `--cert-dir=${certDir}`,
        `--ca-dir=${certDir}`,
        '--zap-log-level=info',
      ],
      join(cluster.logDir, 'keda-operator.log'),
      env,
    );
    started.push(operator);
    await waitUntilReady(
      operator,
      deadline,
      async () => {
        const answer = await fetch(`http://127.0.0.1:${probePort}/readyz`, {
          signal: AbortSignal.timeout(2_000),
        });
        return answer.ok ? true : `HTTP ${answer.status}`;
      },
      (message) => new KedaError(message),
    );

    const metricsServer = spawnGroup(
      'keda-metrics-apiserver',
      adapterBinary,
      [
        '--bind-address=127.0.0.1',
        `--secure-port=${securePort}`,
        `--cert-dir=${certDir}`,
        `--tls-cert-file=${serving.certPath}`,
        `--tls-private-key-file=${serving.keyPath}`,
        `--lister-kubeconfig=${cluster.kubeconfig}`,
        `--authentication-kubeconfig=${cluster.kubeconfig}`,
        `--authorization-kubeconfig=${cluster.kubeconfig}`,
        `--metrics-service-address=127.0.0.1:${grpcPort}`,
        `--port=${adapterMetricsPort}`,
        '--zap-log-level=info',
      ],
      join(cluster.logDir, 'keda-metrics-apiserver.log'),
      env,
    );
    started.push(metricsServer);

    const registration = [
      {
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: metricsServerService, namespace: kedaNamespace },
        spec: { type: 'ExternalName', externalName: '127.0.0.1' },
      },
      {
        apiVersion: 'apiregistration.k8s.io/v1',
        kind: 'APIService',
        metadata: { name: externalMetricsApiService },
        spec: {
          group: 'external.metrics.k8s.io',
          version: 'v1beta1',
          groupPriorityMinimum: 100,
          versionPriority: 100,
          service: { name: metricsServerService, namespace: kedaNamespace, port: securePort },
          caBundle: readFileSync(cluster.ca.certPath).toString('base64'),
        },
      },
    ];
    await kubectlOrThrow(
      cluster,
      'registering the external metrics API',
      ['apply', '-f', '-'],
      registration.map((o) => stringify(o)).join('---\n'),
    );
    await waitUntilReady(
      metricsServer,
      deadline,
      async () => {
        const out = await cluster.kubectl([
          'get',
          'apiservice',
          externalMetricsApiService,
          '-o',
          'jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].message}',
        ]);
        return out.stdout.startsWith('True') ? true : `APIService: ${out.stdout || out.stderr}`;
      },
      (message) => new KedaError(message),
    );
    const assertRunning = () => {
      for (const proc of [operator, metricsServer])
        if (proc.exitReason)
          throw new KedaError(`${proc.name} exited (${proc.exitReason}):\n${logTail(proc.logFile, 0)}`);
    };
    return { operatorLog: operator.logFile, assertRunning, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
