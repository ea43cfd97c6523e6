// A rollout worker's checkpoint cache on its emptyDir, on a real node (kube-node.ts): the kubelet
// evicts a pod whose emptyDir outgrows its sizeLimit. With the bound k8s/ gives a worker (the
// volume's sizeLimit as MOERL_CACHE_VOLUME_SIZE: checkpoints within 80 % of it, room made before
// each download) a rollout worker pod samples one checkpoint after another and stays; with a bound
// above the sizeLimit, as before the cache was bounded by its volume (a count of checkpoints only),
// the same campaign gets the pod evicted. The policy is the demo's (3.75 MB of weights a
// checkpoint); the volume holds two checkpoints' weights, not three.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { CoreV1Api, type V1EnvVar, type V1Pod } from '@kubernetes/client-node';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, tinyRealSpec, uniqueTaskQueues, withWorkers } from '../support/campaign-harness.js';
import { waitFor, type KubeCluster } from '../support/kube-cluster.js';
import { startNodeCampaignEnv, type NodeCampaignEnv } from '../support/node-campaign.js';
import { nodeUnsupportedReason, type KubeNode } from '../support/kube-node.js';
import type { TestEnvironment } from '../support/temporal.js';

const run = promisify(execFile);
// In CI a machine that cannot run the node fails the suite instead of skipping it.
const skip = process.env.CI === 'true' ? undefined : nodeUnsupportedReason();

/** The cache volume's sizeLimit: room for two of the checkpoints below, not three. */
const sizeLimit = '10Mi';
const sizeLimitBytes = 10 * 1024 * 1024;

describe("a rollout worker's cache within its volume on a real node", { skip }, () => {
  let env: NodeCampaignEnv;
  let cluster: KubeCluster;
  let node: KubeNode;
  let t: TestEnvironment;
  let core: CoreV1Api;
  let image: string;
  let namespace: string;
  let dir: string;
  let storePath: string;

  before(async () => {
    env = await startNodeCampaignEnv('cache');
    ({ cluster, node, t, image, namespace, dir, storePath } = env);
    core = cluster.kubeConfig().makeApiClient(CoreV1Api);
  });
  after(() => env?.stop());

  /** Four iterations sampling checkpoints 0 to 3 of the demo's policy, updates in this process. */
  const spec = (name: string) =>
    tinyRealSpec(name, dir, {
      model: { layers: 2, hidden: 128, heads: 4, experts: 8, topK: 2, contextLength: 32 },
      iterations: 4,
      orchestration: { rolloutHeartbeatSeconds: 10, updateHeartbeatSeconds: 30 },
    });

  /** A rollout worker pod polling `prefix`'s queues, its cache an emptyDir of sizeLimit. */
  async function rolloutWorker(name: string, prefix: string, cacheEnv: V1EnvVar[]): Promise<void> {
    await core.createNamespacedPod({
      namespace,
      body: {
        metadata: { name },
        spec: {
          restartPolicy: 'Never',
          nodeName: node.name,
          // The dev server listens on the host's 127.0.0.1 only (k8s/overlays/local does the same).
          hostNetwork: true,
          dnsPolicy: 'ClusterFirstWithHostNet',
          automountServiceAccountToken: false,
          containers: [
            {
              name: 'worker',
              image,
              imagePullPolicy: 'Never',
              args: ['--role', 'rollout', '--shutdown-grace-seconds', '5'],
              env: [
                { name: 'TEMPORAL_ADDRESS', value: t.address },
                { name: 'TEMPORAL_NAMESPACE', value: t.namespace },
                { name: 'MOERL_TASK_QUEUE_PREFIX', value: prefix },
                ...cacheEnv,
              ],
              volumeMounts: [
                { name: 'store', mountPath: storePath },
                { name: 'cache', mountPath: '/var/cache/moerl' },
              ],
            },
          ],
          volumes: [
            { name: 'store', hostPath: { path: storePath, type: 'Directory' } },
            { name: 'cache', emptyDir: { sizeLimit } },
          ],
        },
      },
    });
    await waitFor(`pod ${name} running`, 120_000, async () => {
      const pod = await core.readNamespacedPod({ namespace, name });
      return pod.status?.phase === 'Running' ? true : `phase ${pod.status?.phase}`;
    });
  }

  /** The pod's emptyDir on the node, as the kubelet measures it: bytes in use (du). */
  async function cacheBytes(pod: V1Pod): Promise<number> {
    const path = join(
      node.dir,
      'kubelet',
      'pods',
      pod.metadata!.uid!,
      'volumes',
      'kubernetes.io~empty-dir',
      'cache',
    );
    if (!existsSync(path)) return 0;
    const { stdout } = await run('du', ['-sb', path]);
    return Number(stdout.split('\t')[0]);
  }

  /**
   * Runs the campaign with `name`'s rollout worker pod until `until` returns true (checked every
   * second with the pod and the campaign's state), then ends both; `largest` is the most bytes
   * its cache volume held meanwhile.
   */
  async function runWith(
    name: string,
    cacheEnv: V1EnvVar[],
    until: (pod: V1Pod, state: CampaignState) => boolean,
    timeoutMs: number,
  ) {
    const queues = uniqueTaskQueues();
    await rolloutWorker(name, queues.rollout.slice(0, -'rollout'.length), cacheEnv);
    const deps = workerActivityDeps(env.signal, {
      ...process.env,
      MOERL_CACHE_DIR: join(dir, `cache-${name}`),
    });
    return withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(deps),
      async () => {
        const handle = await startCampaign(t.client, spec(name), queues);
        let largest = 0;
        let pod!: V1Pod;
        let state!: CampaignState;
        await waitFor(`the campaign with ${name}`, timeoutMs, async () => {
          pod = await core.readNamespacedPod({ namespace, name });
          state = await handle.query<CampaignState>('status');
          largest = Math.max(largest, await cacheBytes(pod));
          return until(pod, state)
            ? true
            : `pod ${pod.status?.phase}, campaign ${state.status} at iteration ${state.committedIteration}, cache at most ${largest} bytes`;
        });
        if (state.status !== 'completed') await handle.terminate('the test has seen what it waited for');
        await core.deleteNamespacedPod({ namespace, name, gracePeriodSeconds: 0 }).catch(() => undefined);
        return { pod, largest, state };
      },
      queues,
      ['control', 'train'],
    );
  }

  const evicted = (pod: V1Pod) => pod.status?.reason === 'Evicted';

  it('with the bound from the sizeLimit, the pod samples four checkpoints and is never evicted', async () => {
    let quietSince = 0;
    const { pod, largest, state } = await runWith(
      'bounded',
      [{ name: 'MOERL_CACHE_VOLUME_SIZE', value: sizeLimit }],
      (p, s) => {
        if (evicted(p) || p.status?.phase !== 'Running' || s.status === 'paused') return true;
        if (s.status !== 'completed') return false;
        // After the campaign the cache stays full: long enough for the kubelet to measure it
        // (volume stats every 10 s, eviction checks every 10 s) several times over.
        quietSince ||= Date.now();
        return Date.now() - quietSince > 60_000;
      },
      600_000,
    );
    assert.equal(state.status, 'completed', `the campaign completed: ${state.pauseReason}`);
    assert.equal(state.committedIteration, 4);
    assert.ok(!evicted(pod), `not evicted: ${pod.status?.message}`);
    assert.equal(pod.status?.phase, 'Running');
    console.log(`# bounded: the cache held at most ${largest} of ${sizeLimitBytes} bytes`);
    assert.ok(largest > sizeLimitBytes / 2, `two checkpoints' weights were cached (${largest} bytes)`);
    assert.ok(largest <= sizeLimitBytes, `within the sizeLimit (${largest} bytes)`);
  });

  it('with a bound above the sizeLimit (the old cache), the kubelet evicts the pod', async () => {
    const { pod, largest } = await runWith(
      'unbounded',
      [{ name: 'MOERL_CACHE_MAX_BYTES', value: '1Gi' }],
      (p, s) =>
        evicted(p) ||
        p.status?.phase === 'Failed' ||
        p.status?.phase === 'Succeeded' ||
        s.status === 'paused',
      600_000,
    );
    // The kubelet records the eviction as an event before it stops the pod. The worker's graceful
    // shutdown on that SIGTERM exits 0, so the pod can be seen Succeeded before its status says
    // Evicted: the event is what always tells.
    const events = await core.listNamespacedEvent({
      namespace,
      fieldSelector: `involvedObject.name=${pod.metadata!.name!}`,
    });
    const eviction = events.items.find((e) => e.reason === 'Evicted');
    const message = eviction?.message ?? pod.status?.message ?? '';
    console.log(`# unbounded: the cache reached ${largest} bytes; ${message}`);
    assert.ok(evicted(pod) || eviction, `evicted: ${JSON.stringify(pod.status)}`);
    assert.match(message, /cache.*exceeds the limit|exceeds the limit.*cache/i);
  });
});
