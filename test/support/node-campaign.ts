// For tests that run campaigns whose trainer ranks are pods on the real node (kube-node.ts) and
// compare what they commit with local ranks' checkpoints, bit for bit.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Watch, type V1Pod } from '@kubernetes/client-node';
import type { WorkflowHandle } from '@temporalio/client';
import * as keys from '../../activities/layout.js';
import type { ObjectStore } from '../../activities/store/index.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import type { campaign } from '../../workflows/campaign.js';
import type { CampaignState } from '../../workflows/types.js';
import { startKubeCluster, type KubeCluster } from './kube-cluster.js';
import { startKubeNode, type KubeNode, type KubeNodeOptions } from './kube-node.js';
import { startTestEnvironment, type TestEnvironment } from './temporal.js';

/** What a real-node campaign test runs against (startNodeCampaignEnv). */
export interface NodeCampaignEnv {
  /** The image scripts/build-image.sh built, as the pods name it. */
  image: string;
  cluster: KubeCluster;
  node: KubeNode;
  namespace: string;
  t: TestEnvironment;
  /**
   * A folder of this process's (root) shared with the pods (uid 65532) through hostPaths, mode
   * 0777 and this process's umask 0, so that every directory either side creates stays writable
   * by the other; `store` below it is the campaigns' store.
   */
  dir: string;
  storePath: string;
  /** Aborted first by stop(): the signal of the activities' dependencies. */
  signal: AbortSignal;
  /** Stops everything above and removes `dir`. */
  stop(): Promise<void>;
}

/**
 * The image of Dockerfile target `target` (scripts/build-image.sh), a control plane without kwok,
 * a real node that imported the image before it was Ready, a namespace `<prefix>-…`, the Temporal
 * test environment and a shared folder. On a failure it stops what it had started.
 */
export async function startNodeCampaignEnv(
  prefix: string,
  opts: { target?: 'moerl' | 'moerl-pytorch'; node?: Omit<KubeNodeOptions, 'images'> } = {},
): Promise<NodeCampaignEnv> {
  const started = Date.now();
  const abort = new AbortController();
  const env: Partial<NodeCampaignEnv> = { signal: abort.signal };
  const stop = async () => {
    abort.abort();
    await env.t?.teardown();
    await env.node?.stop();
    await env.cluster?.stop();
    if (env.dir) rmSync(env.dir, { recursive: true, force: true });
  };
  try {
    // Set-up builds both images first (scripts/setup.sh, scripts/test.sh): seconds here.
    const built = await promisify(execFile)(
      'bash',
      [join(repoRoot(), 'scripts', 'build-image.sh'), opts.target ?? 'moerl'],
      { timeout: 600_000 },
    );
    const [image, archive] = built.stdout.trim().split(' ');
    assert.ok(image && archive, `scripts/build-image.sh printed "${built.stdout}"`);
    env.image = image;
    env.cluster = await startKubeCluster({ kwok: false });
    env.node = await startKubeNode(env.cluster, { ...opts.node, images: [archive] });
    console.log(`# image built, cluster and node Ready in ${Date.now() - started} ms`);
    env.namespace = await env.cluster.createNamespace(prefix);
    env.t = await startTestEnvironment();
    process.umask(0);
    env.dir = mkdtempSync(join(tmpdir(), `moerl-k8s-${prefix}-`));
    chmodSync(env.dir, 0o777);
    env.storePath = join(env.dir, 'store');
    mkdirSync(env.storePath, { mode: 0o777 });
  } catch (err) {
    await stop();
    throw err;
  }
  return { ...(env as NodeCampaignEnv), stop };
}

/**
 * The host's choice of OpenBLAS kernels, where it makes one (OPENBLAS_CORETYPE,
 * OPENBLAS_L2_SIZE), for the pods whose results are compared bit for bit with local processes':
 * a pod left to detect the CPU itself can pick other kernels, which round differently.
 */
export const hostBlasEnv: Record<string, string> = Object.fromEntries(
  ['OPENBLAS_CORETYPE', 'OPENBLAS_L2_SIZE'].flatMap((k) => (process.env[k] ? [[k, process.env[k]]] : [])),
);

/**
 * The campaign's result, or a failure after `ms` naming where it stands: a campaign whose ranks
 * keep failing retries for good, and the file's own timeout would end it without clean-up.
 */
export async function finishedCampaign(handle: WorkflowHandle<typeof campaign>, ms = 150_000) {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, fail) => {
    timer = setTimeout(() => {
      void handle
        .query<CampaignState>('status')
        .then((state) =>
          fail(new Error(`campaign ${handle.workflowId} not done after ${ms} ms: ${JSON.stringify(state)}`)),
        );
    }, ms);
  });
  try {
    return await Promise.race([handle.result(), late]);
  } finally {
    clearTimeout(timer);
  }
}

/** sha256 of every file a committed checkpoint's manifest lists, hashed from the stored bytes. */
export async function checkpointHashes(store: ObjectStore, campaignId: string, iteration: number) {
  const prefix = keys.checkpointKey(campaignId, iteration);
  const manifest = JSON.parse((await store.get(`${prefix}/${keys.manifestName}`)).toString()) as {
    files: { name: string; sha256: string }[];
  };
  const hashes = new Map<string, string>();
  for (const file of manifest.files) {
    const sha = createHash('sha256')
      .update(await store.get(`${prefix}/${file.name}`))
      .digest('hex');
    assert.equal(sha, file.sha256, `${prefix}/${file.name} has the sha256 its manifest lists`);
    hashes.set(file.name, sha);
  }
  return hashes;
}

/** Every pod of the namespace as last seen, and those seen Succeeded, until stop(). */
export async function watchPods(cluster: KubeCluster, namespace: string) {
  const pods = new Map<string, V1Pod>();
  const succeeded = new Set<string>();
  const request = await new Watch(cluster.kubeConfig()).watch(
    `/api/v1/namespaces/${namespace}/pods`,
    {},
    (_type, pod: V1Pod) => {
      pods.set(pod.metadata!.name!, pod);
      if (pod.status?.phase === 'Succeeded') succeeded.add(pod.metadata!.name!);
    },
    () => undefined,
  );
  return { pods, succeeded, stop: () => request.abort() };
}
