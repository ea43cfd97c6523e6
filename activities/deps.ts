// What the activities need from the process that runs them: where the store is, a local cache,
// the native binaries, a launcher for trainer ranks, and the worker's shutdown signal.
import { homedir } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import type { CampaignSpec } from '../workflows/spec.js';
import { LocalLauncher } from './launch/local.js';
import type { Launcher } from './launch/types.js';
import { nativeBinDir } from './native.js';
import { openStore } from './store/index.js';
import type { ObjectStore } from './store/types.js';
import type { StoreLocation } from './types.js';

export interface ActivityDeps {
  /** Opens the store a spec names (credentials come from this process's environment). */
  openStore(location: StoreLocation): ObjectStore;
  /** Local scratch and cache directory (checkpoint cache, job directories). */
  cacheDir: string;
  /** Directory holding moe_train and moe_generate. */
  binDir: string;
  /** The launcher for a spec's launcher section. */
  launcherFor(launcher: CampaignSpec['launcher']): Launcher;
  /** Aborted when the worker starts shutting down (SIGTERM): long activities stop at once. */
  shutdown: AbortSignal;
}

/**
 * Dependencies for a worker process: stores opened from the spec with this process's
 * credentials, the cache under MOERL_CACHE_DIR (default: the user's cache directory), native
 * tools from MOERL_NATIVE_BIN (default: this checkout's build), local ranks.
 */
export function workerActivityDeps(
  shutdown: AbortSignal,
  env: NodeJS.ProcessEnv = process.env,
): ActivityDeps {
  const cacheDir =
    env.MOERL_CACHE_DIR ?? join(env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'moerl', 'work');
  const local = new LocalLauncher(join(cacheDir, 'jobs'));
  return {
    openStore: (location) => openStore(location),
    cacheDir,
    binDir: nativeBinDir(env),
    launcherFor: (launcher) => {
      if (launcher.kind === 'local') return local;
      throw ApplicationFailure.create({
        type: 'NotBuilt',
        nonRetryable: true,
        message: 'the kubernetes launcher is not built yet; use launcher: { kind: local }',
      });
    },
    shutdown,
  };
}
