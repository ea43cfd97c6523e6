// Configuration files of a real test node (see kube-node.ts): containerd's, the CNI network's,
// the kubelet's and CoreDNS's, as pure functions of the node's paths and addresses.

/** Where a node keeps everything; all of it lies inside the node's own folder. */
export interface NodePaths {
  dir: string;
  /** A tmpfs holding containerdRoot and containerdState. */
  containerd: string;
  containerdRoot: string;
  containerdState: string;
  containerdSocket: string;
  /** Shim sockets; containerd allows at most 42 characters here. */
  shimSockets: string;
  /** runc's state; the runc shim adds the containerd namespace (k8s.io) below it. */
  runcRoot: string;
  cniConfDir: string;
  cniIpamDir: string;
  kubeletRoot: string;
  podLogs: string;
}

export interface NodeNetwork {
  /** CNI network name; libcni keeps its result cache under this name. */
  name: string;
  bridge: string;
  /** e.g. 10.245.3.0/24 */
  subnet: string;
  /** The bridge's own address: node IP, kubelet, cluster DNS. */
  gateway: string;
  rangeStart: string;
  rangeEnd: string;
}

// Version 4 is the current format of containerd 2.x (version 3 files are migrated at every
// start, with a warning). Everything global is turned away from the host's paths: no imports
// of /etc/containerd/conf.d, no /opt/containerd, NRI (a socket under /var/run) off, the shim
// sockets, runc's state and the pods' network namespaces inside the node's folder.
export function containerdConfig(
  p: NodePaths,
  opts: { sandboxImage: string; runc: string; shim: string; cniBin: string },
): string {
  const q = (value: string): string => `'${value}'`; // TOML literal strings: no escapes
  return `version = 4
root = ${q(p.containerdRoot)}
state = ${q(p.containerdState)}
imports = []
disabled_plugins = [
  'io.containerd.nri.v1.nri',
  'io.containerd.internal.v1.opt',
  'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.devmapper',
  'io.containerd.snapshotter.v1.blockfile',
  'io.containerd.snapshotter.v1.erofs',
  'io.containerd.tracing.processor.v1.otlp',
  'io.containerd.internal.v1.tracing',
]

[plugins.'io.containerd.server.v1.grpc']
  address = ${q(p.containerdSocket)}
[plugins.'io.containerd.server.v1.ttrpc']
  address = ${q(p.containerdSocket + '.ttrpc')}
[plugins.'io.containerd.server.v1.debug']
  address = ''
[plugins.'io.containerd.server.v1.metrics']
  address = ''
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = ${q(p.shimSockets)}

# The streaming server (exec, attach, port-forward) on loopback, on a free port.
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = ${q(opts.sandboxImage)}

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # The kubelet asks for negative OOM score adjustments (-998 for sandboxes), which need
  # CAP_SYS_RESOURCE; hosts and CI sandboxes without it fail every pod ("failed to update
  # /proc/self/oom_score_adj: Permission denied") unless they are clamped to containerd's own.
  restrict_oom_score_adj = true
  cdi_spec_dirs = []
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      runtime_path = ${q(opts.shim)}
      # Pods never pull: their images are imported (scripts/build-image.sh).
      disable_pause_image_pull = true
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = ${q(opts.runc)}
        Root = ${q(p.runcRoot)}
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [${q(opts.cniBin)}]
    conf_dir = ${q(p.cniConfDir)}
    max_conf_num = 1
`;
}

// One bridge, no gateway role: the plugin then neither enables IP forwarding nor installs a
// default route, so a pod reaches its subnet (other pods, the node's DNS on the bridge
// address) and nothing else; no masquerading, so nothing leaves the machine. The loopback
// plugin is not listed: containerd calls it for every pod itself.
export function cniConfList(net: NodeNetwork, p: NodePaths): string {
  return JSON.stringify(
    {
      cniVersion: '1.0.0',
      name: net.name,
      plugins: [
        {
          type: 'bridge',
          bridge: net.bridge,
          isGateway: false,
          isDefaultGateway: false,
          ipMasq: false,
          hairpinMode: true,
          ipam: {
            type: 'host-local',
            ranges: [[{ subnet: net.subnet, rangeStart: net.rangeStart, rangeEnd: net.rangeEnd }]],
            dataDir: p.cniIpamDir,
          },
        },
        { type: 'portmap', capabilities: { portMappings: true } },
      ],
    },
    null,
    2,
  );
}

export interface KubeletSettings {
  containerdSocket: string;
  cgroupRoot: string;
  address: string;
  port: number;
  healthzPort: number;
  clientCaFile: string;
  tlsCertFile: string;
  tlsKeyFile: string;
  podLogs: string;
}

// JSON is YAML: the kubelet reads it as its --config file.
export function kubeletConfig(s: KubeletSettings, dnsIp: string): string {
  return JSON.stringify(
    {
      apiVersion: 'kubelet.config.k8s.io/v1beta1',
      kind: 'KubeletConfiguration',
      // This host mounts cgroup v1 (a hybrid hierarchy: v1 controllers, v2 only for systemd's
      // name). Since 1.35 the kubelet refuses cgroup v1 unless told otherwise here.
      failCgroupV1: false,
      cgroupDriver: 'cgroupfs',
      // Pods' cgroups under a root of this node's own, so that two nodes on one host never
      // clean up each other's pod cgroups as orphans.
      cgroupRoot: s.cgroupRoot,
      failSwapOn: false,
      containerRuntimeEndpoint: `unix://${s.containerdSocket}`,
      address: s.address,
      port: s.port,
      readOnlyPort: 0,
      healthzBindAddress: '127.0.0.1',
      healthzPort: s.healthzPort,
      tlsCertFile: s.tlsCertFile,
      tlsPrivateKeyFile: s.tlsKeyFile,
      // The apiserver (logs, exec) authenticates with its kubelet client certificate; every
      // other caller must present a token or certificate the apiserver vouches for.
      authentication: {
        anonymous: { enabled: false },
        webhook: { enabled: true, cacheTTL: '10s' },
        x509: { clientCAFile: s.clientCaFile },
      },
      authorization: { mode: 'Webhook', webhook: { cacheAuthorizedTTL: '10s', cacheUnauthorizedTTL: '10s' } },
      clusterDNS: [dnsIp],
      clusterDomain: 'cluster.local',
      // No host resolv.conf: pods resolve cluster names only, never through the host's resolvers.
      resolvConf: '',
      podLogsDir: s.podLogs,
      // A test node must not evict its pods because the CI disk is fuller than a production
      // node's thresholds, nor garbage-collect the imported images (they cannot be pulled back).
      evictionHard: { 'memory.available': '100Mi', 'nodefs.available': '1%', 'imagefs.available': '1%' },
      // Pods' volume usage measured every 10 s (default 1 min), so a test sees an emptyDir
      // outgrow its sizeLimit, and the eviction that follows, within seconds.
      volumeStatsAggPeriod: '10s',
      imageGCHighThresholdPercent: 100,
      imageGCLowThresholdPercent: 99,
      serializeImagePulls: false,
      shutdownGracePeriod: '0s',
      registerNode: true,
    },
    null,
    2,
  );
}

// Cluster DNS for the pods: the kubernetes plugin answers <svc>.<ns>.svc.cluster.local and the
// <hostname>.<subdomain> names of pods behind headless Services; any other zone is refused,
// never forwarded.
export function corefile(opts: { dnsIp: string; kubeconfig: string; readyPort: number }): string {
  return `cluster.local:53 {
    bind ${opts.dnsIp}
    errors
    kubernetes cluster.local {
        kubeconfig ${opts.kubeconfig}
        ttl 5
    }
    ready 127.0.0.1:${opts.readyPort}
}
`;
}
