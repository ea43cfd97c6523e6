// A test node in a process of its own, for tests that kill the process that owns a node:
// node dist/test/support/kube-node-child.js, with MOERL_TEST_CLUSTER holding the cluster's
// {"server", "kubeconfig", "ca"} as JSON. Prints {"name", "dir", "bridge"} as one line on
// stdout once the node is Ready, then waits to be killed.
import { KubeConfig } from '@kubernetes/client-node';
import type { CertPair } from './kube-pki.js';
import { startKubeNode } from './kube-node.js';

const raw = process.env.MOERL_TEST_CLUSTER;
if (!raw) throw new Error('kube-node-child: MOERL_TEST_CLUSTER (the cluster as JSON) is not set');
const cluster = JSON.parse(raw) as { server: string; kubeconfig: string; ca: CertPair };
const node = await startKubeNode({
  ...cluster,
  kubeConfig: () => {
    const config = new KubeConfig();
    config.loadFromFile(cluster.kubeconfig);
    return config;
  },
});
console.log(JSON.stringify({ name: node.name, dir: node.dir, bridge: node.bridge }));
setInterval(() => undefined, 60_000);
