// Host-level state of a real test node (see kube-node.ts) and its removal. Everything a node
// makes outside its own processes is recorded in <node dir>/node.json before it is made, so
// that stop() and the clean-up of a node whose test process was killed run the same teardown:
// runc containers, shims, processes left in the node's cgroups, mounts under the node's folder,
// the pod bridge, the cgroups, the kubelet's log links and libcni's result cache; and, once the
// last node on the host is gone, the kernel settings and iptables chains the kubelet changes.
import { execFile } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmdirSync,
  rmSync,
  statSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface NodeRecord {
  name: string;
  /** The test process that owns the node, and its start time (pids are reused). */
  ownerPid: number;
  ownerStart: string;
  subnetIndex: number;
  bridge: string;
  /** cgroup path (below each hierarchy's root) of the kubelet's cgroupRoot. */
  cgroupRoot: string;
  runcRoot: string;
  containerdSocket: string;
  podLogs: string;
}

/** Node folders are `<tmp>/moerl-kube-node-*`; claims on pod subnets sit beside them. */
export const nodeDirPrefix = 'moerl-kube-node-';
const claimsDir = (): string => join(tmpdir(), 'moerl-kube-node-subnets');
const hostSaveFile = (): string => join(tmpdir(), 'moerl-kube-node-host.json');
export const podSubnet = (index: number): string => `10.245.${index}.0/24`;
export const podAddress = (index: number, host: number): string => `10.245.${index}.${host}`;

// The kernel settings the kubelet's container manager sets on start (protectKernelDefaults
// false; true would make it refuse to start on this host's values instead): restored when
// the last node on the host stops.
const kubeletSysctls = [
  'vm/overcommit_memory',
  'vm/panic_on_oom',
  'kernel/panic',
  'kernel/panic_on_oops',
  'kernel/keys/root_maxkeys',
  'kernel/keys/root_maxbytes',
];

export function writeRecord(dir: string, record: NodeRecord): void {
  writeFileSync(join(dir, 'node.json'), JSON.stringify(record, null, 2) + '\n');
}

export function processStart(pid: number): string | undefined {
  try {
    // Field 22 of /proc/<pid>/stat, counted after the command name (which may hold spaces).
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

function ownerAlive(record: NodeRecord): boolean {
  return processStart(record.ownerPid) === record.ownerStart;
}

function readRecord(dir: string): NodeRecord | undefined {
  try {
    return JSON.parse(readFileSync(join(dir, 'node.json'), 'utf8')) as NodeRecord;
  } catch {
    return undefined;
  }
}

/**
 * Claims a free pod subnet (10.245.<index>.0/24) for `dir`: a symlink named by the index, which
 * only one process can create. Claims of dead owners were removed by reapStaleNodes.
 */
export async function claimSubnet(dir: string): Promise<number> {
  mkdirSync(claimsDir(), { recursive: true });
  const { stdout: routes } = await run('ip', ['-4', 'route', 'show', 'table', 'all']);
  for (let index = 0; index < 256; index++) {
    if (routes.includes(`10.245.${index}.`)) continue; // in use on this host, by anyone
    try {
      // Creating a symlink fails with EEXIST when another process holds the claim.
      symlinkSync(dir, join(claimsDir(), String(index)));
      return index;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
  throw new Error('no free pod subnet in 10.245.0.0/16 for a test node (256 claimed or routed)');
}

export function releaseSubnet(index: number, dir: string): void {
  const claim = join(claimsDir(), String(index));
  try {
    if (readlinkSync(claim) === dir) unlinkSync(claim);
  } catch {
    // not claimed (any more)
  }
}

/** Tears down every node folder whose owning process is gone, and claims without a folder. */
export async function reapStaleNodes(): Promise<void> {
  for (const entry of readdirSync(tmpdir())) {
    if (!entry.startsWith(nodeDirPrefix) || entry === 'moerl-kube-node-subnets') continue;
    const dir = join(tmpdir(), entry);
    const record = readRecord(dir);
    // A folder without a record is a start that died before making anything outside it.
    if (record ? !ownerAlive(record) : olderThanMinutes(dir, 10)) await teardown(dir);
  }
  if (!existsSync(claimsDir())) return;
  for (const index of readdirSync(claimsDir())) {
    const claim = join(claimsDir(), index);
    try {
      if (!existsSync(readlinkSync(claim))) unlinkSync(claim);
    } catch {
      // claim gone meanwhile
    }
  }
}

function olderThanMinutes(path: string, minutes: number): boolean {
  try {
    return Date.now() - statSync(path).mtimeMs > minutes * 60_000;
  } catch {
    return false;
  }
}

interface HostState {
  sysctls: Record<string, string>;
  /** Whether the kubelet's iptables chains existed before the first node started. */
  kubeletChains: boolean;
}

/**
 * Saves what the kubelet changes on the host, once, before the first node on this host starts:
 * the kernel settings above, and whether its iptables chains were there already (where an
 * iptables binary exists, the kubelet adds KUBE-FIREWALL, KUBE-IPTABLES-HINT and
 * KUBE-KUBELET-CANARY chains for other components' sake).
 */
export async function saveHostState(): Promise<void> {
  if (existsSync(hostSaveFile())) return;
  const state: HostState = {
    sysctls: Object.fromEntries(
      kubeletSysctls.map((key) => [key, readFileSync(`/proc/sys/${key}`, 'utf8').trim()]),
    ),
    kubeletChains: await run('iptables', ['-t', 'mangle', '-S', 'KUBE-IPTABLES-HINT']).then(
      () => true,
      () => false,
    ),
  };
  writeFileSync(hostSaveFile(), JSON.stringify(state) + '\n', { flag: 'wx' });
}

// Once no live node remains on this host: the saved kernel settings go back, the kubelet's
// iptables chains go if they were not there before, and the folders the kubelet and libcni
// make at fixed host paths are removed if they are empty. The kubelet's device-plugin socket
// has a fixed path too (/var/lib/kubelet/device-plugins), which is also why one node at a
// time per host is what these tests run.
async function restoreHostWhenLastNode(): Promise<void> {
  for (const entry of readdirSync(tmpdir())) {
    if (!entry.startsWith(nodeDirPrefix)) continue;
    const record = readRecord(join(tmpdir(), entry));
    if (record && ownerAlive(record)) return;
  }
  if (existsSync(hostSaveFile())) {
    const state = JSON.parse(readFileSync(hostSaveFile(), 'utf8')) as HostState;
    for (const [key, value] of Object.entries(state.sysctls)) writeFileSync(`/proc/sys/${key}`, value);
    if (!state.kubeletChains) await removeKubeletChains();
    rmSync(hostSaveFile(), { force: true });
  }
  const devicePlugins = '/var/lib/kubelet/device-plugins';
  for (const file of ['kubelet.sock', 'kubelet_internal_checkpoint'])
    rmSync(join(devicePlugins, file), { force: true });
  for (const folder of [
    devicePlugins,
    '/var/lib/kubelet',
    '/var/lib/cni/results',
    '/var/lib/cni',
    '/var/log/containers',
    claimsDir(),
  ]) {
    try {
      rmdirSync(folder);
    } catch {
      // absent, or holds something that is not ours
    }
  }
}

// Undoes the kubelet's syncIPTablesRules (pkg/kubelet/kubelet_network_linux.go), both families.
async function removeKubeletChains(): Promise<void> {
  const steps = [
    ['-t', 'filter', '-D', 'INPUT', '-j', 'KUBE-FIREWALL'],
    ['-t', 'filter', '-D', 'OUTPUT', '-j', 'KUBE-FIREWALL'],
    ['-t', 'filter', '-F', 'KUBE-FIREWALL'],
    ['-t', 'filter', '-X', 'KUBE-FIREWALL'],
    ['-t', 'mangle', '-X', 'KUBE-IPTABLES-HINT'],
    ...['mangle', 'nat', 'filter'].map((table) => ['-t', table, '-X', 'KUBE-KUBELET-CANARY']),
  ];
  for (const iptables of ['iptables', 'ip6tables'])
    for (const args of steps) await run(iptables, args).catch(() => undefined); // not there
}

/** Removes everything the node in `dir` made, whether or not its processes still run. */
export async function teardown(dir: string): Promise<void> {
  const record = readRecord(dir);
  if (record) {
    await removeContainers(record);
    killShims(record.containerdSocket);
    killCgroupProcesses(record.cgroupRoot);
  }
  await unmountUnder(dir);
  if (record) {
    await run('ip', ['link', 'del', record.bridge]).catch(() => undefined); // absent already
    await removeCgroups(record.cgroupRoot);
    removeLogLinks(record.podLogs);
    removeCniCache(dir);
  }
  rmSync(dir, { recursive: true, force: true });
  if (record) {
    releaseSubnet(record.subnetIndex, dir);
    await restoreHostWhenLastNode();
  }
}

async function removeContainers(record: NodeRecord): Promise<void> {
  const root = join(record.runcRoot, 'k8s.io');
  if (!existsSync(root)) return;
  const runc = await run('runc', ['--root', root, 'list', '-q']).catch(() => ({ stdout: '' }));
  for (const id of runc.stdout.split('\n').filter(Boolean)) {
    await run('runc', ['--root', root, 'delete', '--force', id]).catch(() => undefined);
  }
}

// Shims outlive containerd (they are re-parented to init): found by the socket they serve.
function killShims(containerdSocket: string): void {
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    } catch {
      continue;
    }
    if (argv[0]?.endsWith('containerd-shim-runc-v2') && argv.includes(containerdSocket)) signal(Number(pid));
  }
}

function cgroupHierarchies(): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' '))
    .filter((f) => ['cgroup', 'cgroup2'].includes(f[f.indexOf('-') + 1] ?? ''))
    .map((f) => unescapeMountPath(f[4] ?? ''));
}

/**
 * Creates the kubelet's cgroupRoot in every hierarchy (it refuses a root that is missing in
 * one). A new v1 cpuset starts with no CPUs and no memory nodes: it gets its parent's.
 */
export function makeCgroupRoot(cgroupRoot: string): void {
  for (const hierarchy of cgroupHierarchies()) {
    const path = join(hierarchy, cgroupRoot);
    mkdirSync(path, { recursive: true });
    for (const file of ['cpuset.cpus', 'cpuset.mems']) {
      if (existsSync(join(path, file))) writeFileSync(join(path, file), readFileSync(join(hierarchy, file)));
    }
  }
}

// Whatever still runs in the node's pod cgroups is a pod process whose shim is gone.
function killCgroupProcesses(cgroupRoot: string): void {
  for (const hierarchy of cgroupHierarchies()) {
    for (const cgroup of walkDirs(join(hierarchy, cgroupRoot))) {
      try {
        for (const pid of readFileSync(join(cgroup, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean))
          signal(Number(pid));
      } catch {
        // removed meanwhile
      }
    }
  }
}

async function removeCgroups(cgroupRoot: string): Promise<void> {
  for (const hierarchy of cgroupHierarchies()) {
    // Deepest first: a cgroup can only be removed once its children are.
    for (const cgroup of walkDirs(join(hierarchy, cgroupRoot)).reverse()) {
      for (let attempt = 0; attempt < 20; attempt++) {
        try {
          rmdirSync(cgroup);
          break;
        } catch (err) {
          // EBUSY while the killed processes are still exiting.
          if ((err as NodeJS.ErrnoException).code !== 'EBUSY') break;
          await new Promise((done) => setTimeout(done, 100));
        }
      }
    }
  }
}

function walkDirs(root: string): string[] {
  const out: string[] = [];
  const visit = (dir: string): void => {
    out.push(dir);
    let entries;
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      out.pop();
      return;
    }
    for (const e of entries) if (e.isDirectory()) visit(join(dir, e.name));
  };
  visit(root);
  return out;
}

// Overlay root filesystems, sandbox /dev/shm, network namespaces, the kubelet's volume mounts
// and its rshared bind of its own folder: all under the node's folder, deepest first.
async function unmountUnder(dir: string): Promise<void> {
  for (let pass = 0; pass < 3; pass++) {
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((line) => line.split(' ')[4])
      .filter((point): point is string => point !== undefined)
      .map(unescapeMountPath)
      .filter((point) => point === dir || point.startsWith(dir + '/'))
      .sort((a, b) => b.length - a.length);
    if (mounts.length === 0) return;
    for (const point of mounts) await run('umount', ['-l', point]).catch(() => undefined);
  }
}

function unescapeMountPath(path: string): string {
  return path.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

// The kubelet links every container log into /var/log/containers (a fixed path).
function removeLogLinks(podLogs: string): void {
  const links = '/var/log/containers';
  if (!existsSync(links)) return;
  for (const name of readdirSync(links)) {
    try {
      if (readlinkSync(join(links, name)).startsWith(podLogs + '/')) unlinkSync(join(links, name));
    } catch {
      // not a link, or gone
    }
  }
}

// libcni caches each attachment's result under /var/lib/cni/results (containerd sets no other
// folder), the loopback one included; a pod torn down without CNI DEL leaves its files there.
// Ours name a network namespace inside the node's folder.
function removeCniCache(dir: string): void {
  const results = '/var/lib/cni/results';
  if (!existsSync(results)) return;
  for (const name of readdirSync(results)) {
    try {
      if (readFileSync(join(results, name), 'utf8').includes(`"${dir}/`))
        rmSync(join(results, name), { force: true });
    } catch {
      // removed meanwhile
    }
  }
}

function signal(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // exited already
  }
}
