// What the activities need from the process that runs them: where the store is, a local cache,
// the native binaries, a launcher for trainer ranks, and the worker's shutdown signal.
import { randomUUID } from 'node:crypto';
import { homedir, hostname } from 'node:os';
import { join } from 'node:path';
import type { KubeConfig } from '@kubernetes/client-node';
import type { CampaignSpec } from '../workflows/spec.js';
import { rankDeadlines } from '../workflows/spec-rendezvous.js';
import { CheckpointCache, cacheLimitsFromEnv } from './checkpoints.js';
import { KubernetesLauncher, kubeConfigFromEnvironment } from './launch/kubernetes.js';
import { trainerPolicyFromEnv } from './launch/kubernetes/manifests.js';
import { LocalLauncher } from './launch/local.js';
import type { Launcher } from './launch/types.js';
import { nativeBinDir } from './native.js';
import { rolloutServerHost } from './engines/rollout-server.js';
import type { RolloutServerHost } from './engines/rollout-server.js';
import { RankSlots, rolloutRankCapacity, rolloutRanksEnv } from './rollout-capacity.js';
import { openStore } from './store/index.js';
import type { ObjectStore } from './store/types.js';
import type { StoreLocation } from './types.js';

export interface ActivityDeps {
  /** Opens the store a spec names (credentials come from this process's environment). */
  openStore(location: StoreLocation): ObjectStore;
  /** Local scratch and cache directory (checkpoint cache, job directories). */
  cacheDir: string;
  /** The bounded cache of checkpoints under cacheDir, one per worker process. */
  checkpoints: CheckpointCache;
  /** Directory holding moe_train and moe_generate. */
  binDir: string;
  /** The launcher for a spec's launcher section. */
  launcherFor(launcher: CampaignSpec['launcher']): Launcher;
  /** Aborted when the worker starts shutting down (SIGTERM): long activities stop at once. */
  shutdown: AbortSignal;
  /** This worker process, unique over time: an attempt tells a lost worker from a live one by it. */
  workerId: string;
  /** The moe_generate ranks this worker runs at once, shared by its rollout shards. */
  rolloutRanks: RankSlots;
  /** The OpenAI-compatible server of `engine.rollout: openai` shards (absent: this worker has none). */
  rolloutServer?: RolloutServerHost;
}

export function newWorkerId(): string {
  return `${hostname()}/${process.pid}/${randomUUID().slice(0, 8)}`;
}

/**
 * Dependencies for a worker process: stores opened from the spec with this process's
 * credentials, the cache under MOERL_CACHE_DIR (default: the user's cache directory), native
 * tools from MOERL_NATIVE_BIN (default: this checkout's build), local ranks, Kubernetes ranks
 * with the worker's kubeconfig (see kubeConfigFromEnvironment) within what MOERL_TRAINER_*
 * allows (trainerPolicyFromEnv), and MOERL_ROLLOUT_RANKS rollout rank slots (default: the CPUs
 * the process may use).
 */
export function workerActivityDeps(
  shutdown: AbortSignal,
  env: NodeJS.ProcessEnv = process.env,
): ActivityDeps {
  const cacheDir =
    env.MOERL_CACHE_DIR ?? join(env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'moerl', 'work');
  const binDir = nativeBinDir(env);
  // One local launcher per launcher section (they differ only in the ranks' deadlines).
  const local = new Map<string, LocalLauncher>();
  const kubernetes = new Map<string, KubernetesLauncher>();
  let kubeConfig: KubeConfig | undefined;
  return {
    openStore: (location) => openStore(location),
    cacheDir,
    checkpoints: new CheckpointCache(cacheDir, cacheLimitsFromEnv(env)),
    binDir,
    workerId: newWorkerId(),
    rolloutRanks: new RankSlots(rolloutRankCapacity(env[rolloutRanksEnv], rolloutRanksEnv)),
    rolloutServer: rolloutServerHost(env, cacheDir, binDir),
    launcherFor: (launcher) => {
      if (launcher.kind === 'local') {
        const key = JSON.stringify(launcher);
        let found = local.get(key);
        if (!found) {
          found = new LocalLauncher(
            join(cacheDir, 'jobs'),
            { ...env, MOERL_NATIVE_BIN: binDir },
            { deadlines: rankDeadlines(launcher) },
          );
          local.set(key, found);
        }
        return found;
      }
      // One per launcher section (its watches and clients are per namespace and pod settings),
      // all with the worker's one set of credentials, read when first needed.
      const key = JSON.stringify(launcher);
      let found = kubernetes.get(key);
      if (!found) {
        kubeConfig ??= kubeConfigFromEnvironment(env);
        found = new KubernetesLauncher(kubeConfig, launcher, {
          signal: shutdown,
          policy: trainerPolicyFromEnv(env),
        });
        kubernetes.set(key, found);
      }
      return found;
    },
    shutdown,
  };
}
