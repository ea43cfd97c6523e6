// For tests that run campaigns whose trainer ranks are pods on the real node (kube-node.ts) and
// compare what they commit with local ranks' checkpoints, bit for bit.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { Watch, type V1Pod } from '@kubernetes/client-node';
import type { WorkflowHandle } from '@temporalio/client';
import * as keys from '../../activities/layout.js';
import type { ObjectStore } from '../../activities/store/index.js';
import type { campaign } from '../../workflows/campaign.js';
import type { CampaignState } from '../../workflows/types.js';
import type { KubeCluster } from './kube-cluster.js';

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
