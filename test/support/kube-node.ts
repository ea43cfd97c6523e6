// Test harness: a real Kubernetes node on this machine, joined to a test control plane
// (kube-cluster.ts). containerd 2.x (the CRI the 1.36 kubelet needs; containerd 1.x is
// refused) runs pods with runc, in network namespaces on a bridge of the node's own
// (10.245.<n>.0/24, nothing routed off the machine); a real kubelet registers the node with a
// client certificate from the cluster CA; CoreDNS on the bridge address serves the cluster
// names, so `<job>-0.<service>` resolves in pods. Images are imported, never pulled
// (scripts/build-image.sh builds them). Needs root, Linux with overlayfs, and runc.
//
// stop() removes every container, shim, mount, network namespace, cgroup and the bridge; a
// node left behind by a killed test process is torn down by the next startKubeNode.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  accessSync,
  constants,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  statfsSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { CoreV1Api, type V1Node } from '@kubernetes/client-node';
import { freePort } from '../../cli/dev-server.js';
import { repoRoot, resolveTool, type ToolName } from '../../cli/temporal-tools.js';
import type { KubeCluster } from './kube-cluster.js';
import {
  containerdConfig,
  cniConfList,
  corefile,
  kubeletConfig,
  type NodeNetwork,
  type NodePaths,
} from './kube-node-config.js';
import {
  claimSubnet,
  makeCgroupRoot,
  nodeDirPrefix,
  podAddress,
  podSubnet,
  processStart,
  reapStaleNodes,
  saveHostState,
  teardown,
  writeRecord,
  type NodeRecord,
} from './kube-node-host.js';
import { issueCert, writeKubeconfig } from './kube-pki.js';
import { probeFailureText, spawnGroup, waitUntilReady, type GroupProcess } from './process-group.js';

const run = promisify(execFile);

export interface KubeNode {
  name: string;
  /** The pods' subnet, e.g. 10.245.0.0/24, on this bridge. */
  podSubnet: string;
  bridge: string;
  /** The bridge's address: the node's InternalIP, the kubelet's and the cluster DNS's address. */
  address: string;
  /** The node's folder (containerd, kubelet, pod logs, configs); removed by stop(). */
  dir: string;
  /** Component logs: containerd.log, kubelet.log, coredns.log. */
  logDir: string;
  /**
   * A container's output as the kubelet wrote it on this node (stdout and stderr interleaved),
   * read from its log file: works without the apiserver reaching the kubelet.
   */
  containerLog(namespace: string, pod: string, container?: string): string;
  /** Imports an OCI image archive into the node's containerd (namespace k8s.io). */
  importImage(archive: string): Promise<void>;
  /** Stops the kubelet, CoreDNS and containerd, and removes all that the node made. */
  stop(): Promise<void>;
}

export interface KubeNodeOptions {
  /** Node name (a DNS label); default moerl-node-<random>. */
  name?: string;
  /** OCI archives imported before the node reports Ready. */
  images?: string[];
  /** Keep the component logs here (created if missing) instead of inside `dir`. */
  logDir?: string;
  /** Deadline for the whole start-up; default 180 s. */
  startTimeoutMs?: number;
  /**
   * containerd's store in the node's folder on disk instead of an 8 GB tmpfs, each imported
   * layer's blob dropped once unpacked: for images too big for memory (the PyTorch image, about
   * 7 GB, holds its blobs and its snapshots at once while importing).
   */
  containerdOnDisk?: boolean;
}

/** The node could not start: the message names the step, and the component's log tail. */
export class KubeNodeError extends Error {
  override readonly name = 'KubeNodeError';
}

type NodeTool = 'kubelet' | 'containerd' | 'ctr' | 'coredns' | 'cni-plugins';
// scripts/tools.sh resolves these too; cli/temporal-tools.ts only lists its own in ToolName.
const tool = (name: NodeTool): Promise<string> => resolveTool(name as unknown as ToolName);

/** Why this machine cannot run a node, or undefined if it can (for a test's skip reason). */
export function nodeUnsupportedReason(): string | undefined {
  if (process.platform !== 'linux') return 'a real node needs Linux';
  if (process.getuid?.() !== 0) return 'a real node needs root (mounts, network namespaces, cgroups)';
  if (!findExecutable('runc')) return 'runc is not installed (Debian: apt-get install runc)';
  return undefined;
}

export async function startKubeNode(
  cluster: Pick<KubeCluster, 'server' | 'ca' | 'kubeconfig' | 'kubeConfig'>,
  opts: KubeNodeOptions = {},
): Promise<KubeNode> {
  const unsupported = nodeUnsupportedReason();
  if (unsupported) throw new KubeNodeError(unsupported);
  const name = opts.name ?? `moerl-node-${randomBytes(3).toString('hex')}`;
  if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(name))
    throw new KubeNodeError(
      `startKubeNode: node name "${name}" is not a DNS label (a-z, 0-9, -; at most 63)`,
    );
  const deadline = Date.now() + (opts.startTimeoutMs ?? 180_000);

  // One at a time: the first call may build them.
  const bin = {} as Record<NodeTool, string>;
  for (const t of ['kubelet', 'containerd', 'ctr', 'coredns', 'cni-plugins'] as const) bin[t] = await tool(t);
  const shim = join(dirname(bin.containerd), 'containerd-shim-runc-v2');
  if (!isExecutable(shim))
    throw new KubeNodeError(
      `containerd-shim-runc-v2 is not beside ${bin.containerd}: the containerd build must include it`,
    );
  const runc = findExecutable('runc') as string;
  const sandboxImage = await buildPauseImage();

  await reapStaleNodes();
  const dir = mkdtempSync(join(tmpdir(), nodeDirPrefix));
  const logDir = opts.logDir ? resolve(opts.logDir) : join(dir, 'logs');
  mkdirSync(logDir, { recursive: true });
  const processes: GroupProcess[] = [];
  const stopProcesses = async (): Promise<void> => {
    // Last started first: the kubelet before the DNS and the runtime it uses.
    for (const proc of [...processes].reverse()) await proc.stop(10_000);
  };
  try {
    const subnetIndex = await claimSubnet(dir);
    const paths = nodePaths(dir);
    const network: NodeNetwork = {
      name: `moerl-${name}`,
      bridge: `moerlkn${subnetIndex}`,
      subnet: podSubnet(subnetIndex),
      gateway: podAddress(subnetIndex, 1),
      rangeStart: podAddress(subnetIndex, 10),
      rangeEnd: podAddress(subnetIndex, 250),
    };
    const record: NodeRecord = {
      name,
      ownerPid: process.pid,
      ownerStart: processStart(process.pid) ?? '',
      subnetIndex,
      bridge: network.bridge,
      cgroupRoot: `/moerl-kube-node-${name}`,
      runcRoot: paths.runcRoot,
      containerdSocket: paths.containerdSocket,
      podLogs: paths.podLogs,
    };
    // Recorded before anything is made outside the folder: teardown() reads it.
    writeRecord(dir, record);
    await saveHostState();
    await makeBridge(network);
    makeCgroupRoot(record.cgroupRoot);
    // containerd's content store and snapshots (the unpacked images, the containers' writable
    // layers) on a tmpfs: importing is not bound by the disk, and stop() unmounts it at once
    // instead of deleting tens of thousands of files (half a minute on a busy CI disk).
    if (!opts.containerdOnDisk)
      await run('mount', ['-t', 'tmpfs', '-o', 'size=8g,mode=0711', 'moerl-containerd', paths.containerd]);
    mkdirSync(paths.containerdRoot);
    mkdirSync(paths.containerdState);

    writeFileSync(join(paths.cniConfDir, '10-moerl.conflist'), cniConfList(network, paths));
    const containerdToml = join(dir, 'containerd.toml');
    writeFileSync(
      containerdToml,
      containerdConfig(paths, { sandboxImage: sandboxImage.ref, runc, shim, cniBin: bin['cni-plugins'] }),
    );
    const start = (component: string, binary: string, args: string[]): GroupProcess => {
      const proc = spawnGroup(component, binary, args, join(logDir, `${component}.log`));
      processes.push(proc);
      return proc;
    };
    const containerd = start('containerd', bin.containerd, ['--config', containerdToml]);
    const ctr = (args: string[], timeout = 300_000) =>
      run(bin.ctr, ['--address', paths.containerdSocket, '--namespace', 'k8s.io', ...args], { timeout });
    await waitUntil(containerd, deadline, async () => ((await ctr(['version'])) ? true : 'no answer'));
    const importImage = async (archive: string): Promise<void> => {
      if (!existsSync(archive)) throw new KubeNodeError(`importImage: no image archive at ${archive}`);
      const free = freeBytes(paths.containerdRoot);
      try {
        const discard = opts.containerdOnDisk ? ['--local', '--discard-unpacked-layers'] : [];
        // A 7 GB image takes minutes: the start-up's deadline bounds it, not a fixed one.
        await ctr(
          ['images', 'import', '--snapshotter', 'overlayfs', ...discard, archive],
          Math.max(300_000, deadline - Date.now()),
        );
      } catch (err) {
        // Importing holds the layers twice at its peak (the content store and the unpacked
        // snapshots): a full disk is the usual cause.
        const gb = (bytes: number) =>
          bytes >= 1e9 ? `${(bytes / 1e9).toFixed(1)} GB` : `${(bytes / 1e6).toFixed(1)} MB`;
        throw new KubeNodeError(
          `importing ${archive} (${gb(statSync(archive).size)}) into the node's containerd failed ` +
            `with ${gb(free)} free in ${paths.containerdRoot} before it, ${gb(freeBytes(paths.containerdRoot))} after: ` +
            probeFailureText(err),
        );
      }
    };
    for (const archive of [sandboxImage.archive, ...(opts.images ?? [])]) await importImage(archive);

    // DNS first: the kubelet writes its address into every pod's resolv.conf.
    const readyPort = await freePort();
    const corefilePath = join(dir, 'Corefile');
    writeFileSync(
      corefilePath,
      corefile({ dnsIp: network.gateway, kubeconfig: cluster.kubeconfig, readyPort }),
    );
    const coredns = start('coredns', bin.coredns, ['-conf', corefilePath]);
    await waitUntil(coredns, deadline, async () => {
      const answer = await fetch(`http://127.0.0.1:${readyPort}/ready`, {
        signal: AbortSignal.timeout(2_000),
      });
      return answer.ok ? true : `HTTP ${answer.status}`;
    });

    const [client, serving] = await Promise.all([
      issueCert(dir, 'kubelet-client', cluster.ca, {
        cn: `system:node:${name}`,
        orgs: ['system:nodes'],
        usage: 'client',
      }),
      issueCert(dir, 'kubelet-serving', cluster.ca, {
        cn: name,
        usage: 'server',
        dnsNames: [name],
        ips: [network.gateway],
      }),
    ]);
    const kubeconfig = join(dir, 'kubelet.kubeconfig');
    writeKubeconfig(kubeconfig, cluster.server, cluster.ca, client);
    const [port, healthzPort] = [await freePort(), await freePort()];
    const configPath = join(dir, 'kubelet.yaml');
    writeFileSync(
      configPath,
      kubeletConfig(
        {
          containerdSocket: paths.containerdSocket,
          cgroupRoot: record.cgroupRoot,
          address: network.gateway,
          port,
          healthzPort,
          clientCaFile: cluster.ca.certPath,
          tlsCertFile: serving.certPath,
          tlsKeyFile: serving.keyPath,
          podLogs: paths.podLogs,
        },
        network.gateway,
      ),
    );
    const kubelet = start('kubelet', bin.kubelet, [
      `--config=${configPath}`,
      `--kubeconfig=${kubeconfig}`,
      `--root-dir=${paths.kubeletRoot}`,
      // Not derived from --root-dir: its default is /var/lib/kubelet/pki.
      `--cert-dir=${join(paths.kubeletRoot, 'pki')}`,
      `--hostname-override=${name}`,
      // The node IP cannot be loopback (the kubelet refuses it): the bridge address it is.
      `--node-ip=${network.gateway}`,
      '--v=1',
    ]);
    const core = cluster.kubeConfig().makeApiClient(CoreV1Api);
    await waitUntil(kubelet, deadline, async () => nodeReady(await core.readNode({ name })));

    let stopped: Promise<void> | undefined;
    return {
      name,
      podSubnet: network.subnet,
      bridge: network.bridge,
      address: network.gateway,
      dir,
      logDir,
      importImage,
      containerLog: (namespace, pod, container) => readContainerLog(paths.podLogs, namespace, pod, container),
      stop() {
        stopped ??= (async () => {
          await drainPods(core, name, paths.runcRoot);
          await stopProcesses();
          await teardown(dir);
          await core.deleteNode({ name }).catch(() => undefined); // the cluster may be gone
        })();
        return stopped;
      },
    };
  } catch (err) {
    await stopProcesses();
    await teardown(dir);
    throw err;
  }
}

// <podLogsDir>/<namespace>_<pod>_<uid>/<container>/<restart count>.log, in the CRI format:
// "<time> <stream> <F|P> <text>", P marking a line the runtime split.
function readContainerLog(podLogs: string, namespace: string, pod: string, container?: string): string {
  const podDir = readdirSync(podLogs).find((entry) => entry.startsWith(`${namespace}_${pod}_`));
  if (!podDir) throw new KubeNodeError(`no logs of pod ${namespace}/${pod} on this node`);
  const containers = readdirSync(join(podLogs, podDir));
  const name = container ?? containers[0];
  if (!name || !containers.includes(name))
    throw new KubeNodeError(`pod ${namespace}/${pod} has no logs of container ${container ?? '(any)'} here`);
  const files = readdirSync(join(podLogs, podDir, name)).filter((file) => /^\d+\.log$/.test(file));
  const latest = files.sort((a, b) => parseInt(b, 10) - parseInt(a, 10))[0];
  if (!latest) return '';
  let out = '';
  for (const line of readFileSync(join(podLogs, podDir, name, latest), 'utf8').split('\n')) {
    const match = /^\S+ (?:stdout|stderr) ([FP]) (.*)$/.exec(line);
    if (match) out += match[2] + (match[1] === 'F' ? '\n' : '');
  }
  return out;
}

function freeBytes(path: string): number {
  const fs = statfsSync(path);
  return fs.bavail * fs.bsize;
}

function nodePaths(dir: string): NodePaths {
  const p: NodePaths = {
    dir,
    containerd: join(dir, 'containerd'),
    containerdRoot: join(dir, 'containerd', 'root'),
    containerdState: join(dir, 'containerd', 'state'),
    containerdSocket: join(dir, 'containerd', 'containerd.sock'),
    shimSockets: join(dir, 's'),
    runcRoot: join(dir, 'runc'),
    cniConfDir: join(dir, 'cni', 'net.d'),
    cniIpamDir: join(dir, 'cni', 'ipam'),
    kubeletRoot: join(dir, 'kubelet'),
    podLogs: join(dir, 'pod-logs'),
  };
  if (p.shimSockets.length > 42)
    throw new KubeNodeError(
      `the node folder ${dir} is too deep for containerd's shim sockets (42 characters): set TMPDIR to a shorter folder`,
    );
  for (const d of [
    p.containerd,
    p.shimSockets,
    p.runcRoot,
    p.cniConfDir,
    p.cniIpamDir,
    p.kubeletRoot,
    p.podLogs,
  ])
    mkdirSync(d, { recursive: true });
  return p;
}

// The bridge exists before the kubelet starts, because the node IP must be on an interface.
async function makeBridge(net: NodeNetwork): Promise<void> {
  const prefix = net.subnet.split('/')[1];
  await run('ip', ['link', 'add', net.bridge, 'type', 'bridge']);
  await run('ip', ['addr', 'add', `${net.gateway}/${prefix}`, 'dev', net.bridge]);
  await run('ip', ['link', 'set', net.bridge, 'up']);
}

async function buildPauseImage(): Promise<{ ref: string; archive: string }> {
  try {
    const { stdout } = await run('bash', [join(repoRoot(), 'scripts', 'build-image.sh'), 'pause'], {
      timeout: 120_000,
    });
    const [ref, archive] = stdout.trim().split(' ');
    if (!ref || !archive) throw new Error(`unexpected output "${stdout.trim()}"`);
    return { ref, archive };
  } catch (err) {
    throw new KubeNodeError(`scripts/build-image.sh pause failed: ${probeFailureText(err)}`);
  }
}

// Ready, and the node lifecycle controller has lifted the not-ready taint it is born with.
function nodeReady(node: V1Node): true | string {
  const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
  const taints = (node.spec?.taints ?? []).filter((t) => t.key.startsWith('node.kubernetes.io/'));
  if (ready?.status === 'True' && taints.length === 0) return true;
  return `Ready=${ready?.status ?? 'unknown'} (${ready?.message ?? ''}), taints=${JSON.stringify(taints)}`;
}

// Deleting the node's pods through the API lets the kubelet stop them the normal way (CNI DEL
// for each sandbox); whatever is still running after 30 s is removed by teardown().
async function drainPods(core: CoreV1Api, node: string, runcRoot: string): Promise<void> {
  try {
    const pods = await core.listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${node}` });
    await Promise.all(
      pods.items.map((pod) =>
        core
          .deleteNamespacedPod({
            name: pod.metadata!.name!,
            namespace: pod.metadata!.namespace!,
            gracePeriodSeconds: 0,
          })
          .catch(() => undefined),
      ),
    );
  } catch {
    return; // the control plane is gone: teardown() does it all
  }
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const { stdout } = await run('runc', ['--root', join(runcRoot, 'k8s.io'), 'list', '-q']).catch(() => ({
      stdout: '',
    }));
    if (stdout.trim() === '') return;
    await new Promise((done) => setTimeout(done, 250));
  }
}

/** Waits for a component's probe, failing early (with its log) when the process exits. */
const waitUntil = (proc: GroupProcess, deadline: number, probe: () => Promise<true | string>) =>
  waitUntilReady(proc, deadline, probe, (message) => new KubeNodeError(message));

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function findExecutable(name: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(':'), '/usr/sbin', '/sbin'];
  return dirs
    .filter(Boolean)
    .map((d) => join(d, name))
    .find(isExecutable);
}
