// A rollout worker in a Kubernetes pod marks its pod busy or idle for the ReplicaSet controller:
// the annotation controller.kubernetes.io/pod-deletion-cost is the number of activities it is
// running (0 when idle), so a scale-in (an autoscaler lowering the Deployment's replicas)
// deletes idle pods first and a pod mid-shard last. A pod that is deleted anyway stops as on a
// Spot notice: its shard fails at once and resumes elsewhere from the stored chunks.
// On when the pod's name and namespace are given (the Downward API: MOERL_POD_NAME,
// MOERL_POD_NAMESPACE); the pod's ServiceAccount may patch pods (k8s/base/rbac/rollout), and an
// admission policy holds it to this one annotation of its own pod (k8s/base/admission).
import { CoreV1Api, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node';
import { kubeConfigFromEnvironment } from '../activities/launch/kubernetes.js';
import { apiStatus } from '../activities/launch/kubernetes/errors.js';
import type { CampaignActivities } from '../activities/types.js';

export const podDeletionCostAnnotation = 'controller.kubernetes.io/pod-deletion-cost';

export interface PodRef {
  name: string;
  namespace: string;
}

/** The worker's own pod, from MOERL_POD_NAME and MOERL_POD_NAMESPACE; undefined outside a pod. */
export function podFromEnv(env: NodeJS.ProcessEnv): PodRef | undefined {
  const name = env.MOERL_POD_NAME?.trim();
  const namespace = env.MOERL_POD_NAMESPACE?.trim();
  if (!name && !namespace) return undefined;
  if (!name || !namespace)
    throw new Error('MOERL_POD_NAME and MOERL_POD_NAMESPACE go together (the Downward API sets both)');
  return { name, namespace };
}

export interface BusyMarker {
  /** The same activities, each call counted as running on this pod while it runs. */
  instrument(activities: CampaignActivities): CampaignActivities;
  /** Resolves once the annotation shows the count of now (or the last patch failed). */
  settled(): Promise<void>;
}

/**
 * Keeps the pod's deletion cost equal to the activities running in this worker. Patches are
 * sent one at a time, each with the count of when it is sent, so a burst of starts and ends
 * costs a few patches, and the last one always shows the final count. A patch that fails is
 * logged; the next change tries again (the activity itself never fails for it).
 */
export function podBusyMarker(opts: {
  pod: PodRef;
  kubeConfig?: KubeConfig;
  log?: (line: string) => void;
}): BusyMarker {
  const log = opts.log ?? ((line: string) => console.error(`moerl-worker: ${line}`));
  let api: CoreV1Api | undefined;
  let running = 0;
  let shown: number | undefined;
  let patching: Promise<void> = Promise.resolve();
  let queued = false;

  async function patch(): Promise<void> {
    for (;;) {
      const cost = running;
      if (cost === shown) return;
      try {
        // Read here, so a worker without credentials says so at each change and keeps running.
        api ??= (opts.kubeConfig ?? kubeConfigFromEnvironment()).makeApiClient(CoreV1Api);
        await api.patchNamespacedPod(
          {
            name: opts.pod.name,
            namespace: opts.pod.namespace,
            body: { metadata: { annotations: { [podDeletionCostAnnotation]: String(cost) } } },
          },
          setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
        );
        shown = cost;
      } catch (err) {
        const { code, body } = apiStatus(err);
        const why =
          code === undefined ? ((err as Error).message ?? String(err)) : `${code} ${body.message ?? ''}`;
        log(
          `marking pod ${opts.pod.namespace}/${opts.pod.name} with ${podDeletionCostAnnotation}=${cost} failed: ${why}`,
        );
        return;
      }
    }
  }

  function changed(): void {
    if (queued) return; // the patch loop queued will read the count when it runs
    queued = true;
    patching = patching.then(() => {
      queued = false;
      return patch();
    });
  }

  const count =
    <I, O>(fn: (input: I) => Promise<O>) =>
    async (input: I): Promise<O> => {
      running++;
      changed();
      try {
        return await fn(input);
      } finally {
        running--;
        changed();
      }
    };

  changed(); // idle from the start: a fresh pod is the first to go
  return {
    instrument: (activities) =>
      Object.fromEntries(
        Object.entries(activities).map(([name, fn]) => [
          name,
          count(fn as (input: unknown) => Promise<unknown>),
        ]),
      ) as unknown as CampaignActivities,
    settled: () => patching,
  };
}
