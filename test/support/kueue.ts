// Test harness: Kueue's real controller manager (built by scripts/tools.sh from its pinned Go
// module) against a test control plane (kube-cluster.ts), admitting batch/v1 Jobs only. Its
// webhooks are served on 127.0.0.1 with a certificate of the cluster's CA but not registered
// with the API server: moerl creates its Jobs suspended and labelled itself, which is what
// Kueue's Job webhook would add. Kueue reads its metrics certificate from a fixed path under
// /etc, so it runs in a mount namespace of its own where /etc is an overlay holding that file;
// the host's /etc is never written. That needs root (CAP_SYS_ADMIN), as the real node does.
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { stringify } from 'yaml';
import { freePort, findOnPath } from '../../cli/dev-server.js';
import { resolveTool, type ToolName } from '../../cli/temporal-tools.js';
import { installOperatorCrds, type KubeCluster } from './kube-cluster.js';
import { issueCert } from './kube-pki.js';
import { spawnGroup, waitUntilReady } from './process-group.js';

/** Kueue's fixed metrics certificate folder (cmd/kueue/main.go), inside its mount namespace. */
const metricsCertDir = '/etc/kueue/metrics/certs';
/** The namespace Kueue's configuration names (leader election is off; nothing is put there). */
const kueueNamespace = 'kueue-system';

export interface Kueue {
  logFile: string;
  stop(): Promise<void>;
}

export class KueueError extends Error {
  override readonly name = 'KueueError';
}

/** Why Kueue cannot run on this machine, or undefined when it can. */
function kueueUnavailable(): string | undefined {
  if (process.platform !== 'linux') return 'Kueue runs in a Linux mount namespace';
  if (process.getuid?.() !== 0)
    return 'Kueue runs in a mount namespace of its own (/etc overlaid for its fixed metrics certificate path), which needs root';
  if (!findOnPath('unshare')) return 'unshare (util-linux) is not on PATH';
  return undefined;
}

/** Installs Kueue's CRDs and starts its controller manager; resolves once it is ready. */
export async function startKueue(
  cluster: KubeCluster,
  opts: { startTimeoutMs?: number } = {},
): Promise<Kueue> {
  const unavailable = kueueUnavailable();
  if (unavailable) throw new KueueError(unavailable);
  const deadline = Date.now() + (opts.startTimeoutMs ?? 120_000);
  // scripts/tools.sh resolves kueue too; cli/temporal-tools.ts only lists its own in ToolName.
  const binary = await resolveTool('kueue' as unknown as ToolName);
  // scripts/tools.sh copies the CRDs beside the binary.
  await installOperatorCrds(cluster, 'Kueue', join(dirname(binary), 'kueue-crds'), kueueNamespace);

  const dir = join(cluster.dir, 'kueue');
  const certDir = join(dir, 'certs');
  mkdirSync(certDir, { recursive: true });
  const serving = await issueCert(certDir, 'serving', cluster.ca, {
    cn: 'kueue',
    usage: 'server',
    ips: ['127.0.0.1'],
    dnsNames: ['localhost'],
  });
  // controller-runtime's webhook server and Kueue's metrics watcher both read tls.crt/tls.key.
  copyFileSync(serving.certPath, join(certDir, 'tls.crt'));
  copyFileSync(serving.keyPath, join(certDir, 'tls.key'));

  const [webhookPort, metricsPort, healthPort] = await Promise.all([freePort(), freePort(), freePort()]);
  const config = join(dir, 'config.yaml');
  writeFileSync(
    config,
    stringify({
      apiVersion: 'config.kueue.x-k8s.io/v1beta2',
      kind: 'Configuration',
      namespace: kueueNamespace,
      health: { healthProbeBindAddress: `127.0.0.1:${healthPort}` },
      metrics: { bindAddress: `127.0.0.1:${metricsPort}` },
      webhook: { host: '127.0.0.1', port: webhookPort, certDir },
      leaderElection: { leaderElect: false },
      internalCertManagement: { enable: false },
      manageJobsWithoutQueueName: false,
      integrations: { frameworks: ['batch/job'] },
      // The on-demand visibility API server would listen on every interface.
      featureGates: { VisibilityOnDemand: false },
    }),
  );
  const upper = join(dir, 'etc-upper');
  const work = join(dir, 'etc-work');
  mkdirSync(upper, { recursive: true });
  mkdirSync(work, { recursive: true });
  const script = [
    'set -e',
    `mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc`,
    `mkdir -p ${metricsCertDir}`,
    `cp "$3/tls.crt" "$3/tls.key" ${metricsCertDir}/`,
    'shift 3',
    'exec "$@"',
  ].join('\n');
  const logFile = join(cluster.logDir, 'kueue.log');
  const proc = spawnGroup(
    'kueue',
    'unshare',
    [
      '--mount',
      '--propagation',
      'private',
      '--',
      'sh',
      '-c',
      script,
      'kueue',
      upper,
      work,
      certDir,
      binary,
      `--config=${config}`,
      '--zap-log-level=2',
    ],
    logFile,
    { ...process.env, KUBECONFIG: cluster.kubeconfig },
  );
  try {
    await waitUntilReady(
      proc,
      deadline,
      async () => {
        const answer = await fetch(`http://127.0.0.1:${healthPort}/readyz`, {
          signal: AbortSignal.timeout(2_000),
        });
        return answer.ok ? true : `HTTP ${answer.status} ${await answer.text()}`;
      },
      (message) => new KueueError(message),
    );
  } catch (err) {
    await proc.stop(5_000);
    throw err;
  }
  return { logFile, stop: () => proc.stop(10_000) };
}

export interface QueueQuota {
  /** Name of the ClusterQueue (cluster-wide) and of the ResourceFlavor it uses. */
  clusterQueue: string;
  /** The namespace's LocalQueue pointing at it. */
  localQueue: string;
  namespace: string;
  cpu: string;
  memory: string;
}

/** A ResourceFlavor, a ClusterQueue with this quota for every namespace, and a LocalQueue. */
export async function createQueue(cluster: KubeCluster, q: QueueQuota): Promise<void> {
  const docs = [
    { apiVersion: 'kueue.x-k8s.io/v1beta2', kind: 'ResourceFlavor', metadata: { name: q.clusterQueue } },
    {
      apiVersion: 'kueue.x-k8s.io/v1beta2',
      kind: 'ClusterQueue',
      metadata: { name: q.clusterQueue },
      spec: {
        namespaceSelector: {},
        resourceGroups: [
          {
            coveredResources: ['cpu', 'memory'],
            flavors: [
              {
                name: q.clusterQueue,
                resources: [
                  { name: 'cpu', nominalQuota: q.cpu },
                  { name: 'memory', nominalQuota: q.memory },
                ],
              },
            ],
          },
        ],
      },
    },
    {
      apiVersion: 'kueue.x-k8s.io/v1beta2',
      kind: 'LocalQueue',
      metadata: { name: q.localQueue, namespace: q.namespace },
      spec: { clusterQueue: q.clusterQueue },
    },
  ];
  const applied = await cluster.kubectl(['apply', '-f', '-'], {
    input: docs.map((d) => stringify(d)).join('---\n'),
  });
  if (applied.code !== 0) throw new KueueError(`creating the queues failed: ${applied.stderr}`);
}

/** Runs the pinned kubectl and returns its stdout, failing with its stderr. */
export async function kubectlOut(cluster: KubeCluster, args: string[]): Promise<string> {
  const out = await cluster.kubectl(args);
  if (out.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${out.stderr}`);
  return out.stdout;
}
