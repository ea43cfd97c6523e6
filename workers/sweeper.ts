// The control worker's sweep of orphaned trainer Jobs (activities/launch/kubernetes/sweep.ts):
// every few minutes, in each namespace it is given, the Jobs and Services of campaigns that
// have ended are deleted. Off unless MOERL_SWEEP_NAMESPACES names namespaces (k8s/base sets it
// to the worker's own). A sweep that fails is logged and tried again at the next interval.
import type { KubeConfig } from '@kubernetes/client-node';
import { kubeConfigFromEnvironment } from '../activities/launch/kubernetes.js';
import { sweepEndedCampaigns } from '../activities/launch/kubernetes/sweep.js';
import type { CampaignEnded } from '../activities/launch/kubernetes/sweep.js';

export interface SweepSettings {
  namespaces: string[];
  intervalMs: number;
}

/** MOERL_SWEEP_NAMESPACES (comma list; empty: no sweep) and MOERL_SWEEP_INTERVAL_SECONDS (default 300). */
export function sweepSettingsFromEnv(env: NodeJS.ProcessEnv): SweepSettings {
  const namespaces = (env.MOERL_SWEEP_NAMESPACES ?? '')
    .split(',')
    .map((n) => n.trim())
    .filter(Boolean);
  const text = env.MOERL_SWEEP_INTERVAL_SECONDS?.trim() || '300';
  const seconds = Number(text);
  if (!Number.isInteger(seconds) || seconds < 1 || seconds > 86400)
    throw new Error(`MOERL_SWEEP_INTERVAL_SECONDS must be whole seconds from 1 to 86400, got "${text}"`);
  return { namespaces, intervalMs: seconds * 1000 };
}

/** WORKFLOW_EXECUTION_STATUS_RUNNING of Temporal's API. */
const workflowRunning = 1;
/** gRPC NOT_FOUND: no such workflow (never started, or removed after its retention). */
const grpcNotFound = 5;

/** A campaign has ended when its workflow (the latest run, id = campaign id) is not running. */
export function campaignEndedFrom(
  describe: (workflowId: string) => Promise<{ workflowExecutionInfo?: { status?: unknown } | null }>,
): CampaignEnded {
  return async (campaignId) => {
    try {
      const answer = await describe(campaignId);
      return answer.workflowExecutionInfo?.status !== workflowRunning;
    } catch (err) {
      if ((err as { code?: unknown }).code === grpcNotFound) return true;
      throw err;
    }
  };
}

/** Sweeps now and then every interval until `signal` aborts; resolves when stopped. */
export async function runSweeper(opts: {
  settings: SweepSettings;
  campaignEnded: CampaignEnded;
  signal: AbortSignal;
  kubeConfig?: KubeConfig;
  log?: (line: string) => void;
}): Promise<void> {
  const { settings, signal } = opts;
  const log = opts.log ?? ((line: string) => console.error(`moerl-worker: ${line}`));
  if (settings.namespaces.length === 0) return;
  let kubeConfig = opts.kubeConfig;
  while (!signal.aborted) {
    for (const namespace of settings.namespaces) {
      try {
        // Read here, so a worker without credentials says so at every sweep and keeps running.
        kubeConfig ??= kubeConfigFromEnvironment();
        const removed = await sweepEndedCampaigns(kubeConfig, namespace, opts.campaignEnded);
        if (removed.length)
          log(`swept ${removed.length} objects of ended campaigns in ${namespace}: ${removed.join(', ')}`);
      } catch (err) {
        log(
          `sweep of trainer jobs in ${namespace} failed (next in ${settings.intervalMs / 1000} s): ${(err as Error).message ?? String(err)}`,
        );
      }
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, settings.intervalMs);
      signal.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
    });
  }
}
