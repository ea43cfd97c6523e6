// Orphaned trainer Jobs: a Job whose activity is gone for good (cancelled during an API outage,
// so kill() could not delete it; a campaign terminated; a worker lost with no retry left) runs
// until its deadline. The control worker sweeps them: every Job and Service the launcher made
// (its owner labels) whose campaign (the id annotation) has ended is deleted, pods first. An
// object without the annotation (made before it existed) is left to its TTL and deadline.
import type { KubeConfig, V1Job, V1Service } from '@kubernetes/client-node';
import { JobApi } from './api.js';
import { apiCall, isNotFound } from './errors.js';
import { campaignIdAnnotation, jobLabel } from './manifests.js';

/** True once the campaign's workflow is closed (completed, cancelled, terminated...) or unknown. */
export type CampaignEnded = (campaignId: string) => Promise<boolean>;

/** Everything the launcher creates carries these labels (manifests.ts, ownerLabels). */
export const launcherObjectsSelector = `app.kubernetes.io/managed-by=moerl,${jobLabel}`;

/** Deletes in `namespace` the launcher's Jobs and Services of ended campaigns; returns `kind/name` of each. */
export async function sweepEndedCampaigns(
  kubeConfig: KubeConfig,
  namespace: string,
  campaignEnded: CampaignEnded,
): Promise<string[]> {
  const api = new JobApi(kubeConfig, namespace);
  const labelSelector = launcherObjectsSelector;
  const jobs = await apiCall(api.call('list', `jobs -l ${labelSelector}`), () =>
    api.batch.listNamespacedJob({ namespace, labelSelector }),
  );
  const services = await apiCall(api.call('list', `services -l ${labelSelector}`), () =>
    api.core.listNamespacedService({ namespace, labelSelector }),
  );
  // Asked once per campaign and sweep, however many of its objects there are.
  const answers = new Map<string, Promise<boolean>>();
  const ended = (o: V1Job | V1Service) => {
    const id = o.metadata?.annotations?.[campaignIdAnnotation];
    if (!id) return Promise.resolve(false);
    let answer = answers.get(id);
    if (!answer) answers.set(id, (answer = campaignEnded(id)));
    return answer;
  };
  const removed: string[] = [];
  const jobNames = new Set<string>();
  for (const job of jobs.items) {
    const name = job.metadata!.name!;
    jobNames.add(name);
    if (!(await ended(job))) continue;
    // Its pods (foreground) and its Service; waiting for them to go is the next sweep's business.
    await api.deleteJob(name);
    removed.push(`job/${name}`);
  }
  for (const service of services.items) {
    const name = service.metadata!.name!;
    const job = service.metadata?.labels?.[jobLabel];
    // A Service of a Job swept above went with it; the garbage collector takes those of deleted Jobs.
    if ((job && jobNames.has(job)) || !(await ended(service))) continue;
    await apiCall(
      api.call('delete', `services/${name}`),
      () => api.core.deleteNamespacedService({ name, namespace }),
      (err) => (isNotFound(err) ? null : undefined),
    );
    removed.push(`service/${name}`);
  }
  return removed;
}
