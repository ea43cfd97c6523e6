// Runs moe_generate on R expert-parallel ranks for one rollout shard: local processes under the
// rank contract of moe_train (on a Kubernetes rollout worker, the ranks inside its pod). They
// stay in the worker's process group, so losing the worker's machine (or pod) takes them all,
// as it takes a single generator; the activity stops every rank itself when it is cancelled or
// a rank fails. Rank 0 gathers and writes every chunk and prints the progress lines, so only
// its records are followed; one rank behaves exactly as the single generator always did.
// Rank 0 listens on a port the kernel picks and publishes it in a file of the run's own 0700
// directory, where the other ranks read it: no port is chosen and released for another local
// user to take first.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { rankEnvironment } from './launch/local.js';
import { newJobToken, rendezvousEnv } from './launch/rendezvous.js';
import { rankEnv } from './launch/types.js';
import { runTool, toolFailure } from './native.js';
import type { RunToolOptions, ToolRun } from './native.js';

export interface GenerateRanksOptions extends RunToolOptions {
  worldSize: number;
  /** Names the run in failures ("moe_generate (rollout of iteration 1 shard 0)"). */
  what: string;
}

/** A rank's run that did not exit 0, as the Temporal failure naming the rank and its exit. */
function rankFailure(what: string, rank: number, worldSize: number, run: ToolRun): ApplicationFailure {
  return toolFailure(`${what} rank ${rank} of ${worldSize}`, run);
}

/**
 * Runs the ranks until all exit; resolves with rank 0's run when every rank exited 0 or the
 * caller aborted. Throws the failure of the first rank that failed (the others are stopped).
 */
export async function runGenerateRanks(
  path: string,
  args: string[],
  opts: GenerateRanksOptions,
): Promise<ToolRun> {
  const { worldSize, what, signal, onRecord } = opts;
  if (worldSize === 1) {
    const run = await runTool(path, args, opts);
    if (run.code !== 0 && !signal?.aborted) throw toolFailure(what, run);
    return run;
  }
  const stopAll = new AbortController();
  const onAbort = () => stopAll.abort();
  signal?.addEventListener('abort', onAbort, { once: true });
  const coordinatorDir = await mkdtemp(join(tmpdir(), 'moerl-rollout-coordinator-')); // 0700
  const contract = {
    ...rankEnvironment(process.env),
    ...opts.env,
    [rankEnv.worldSize]: String(worldSize),
    [rankEnv.coordinator]: '127.0.0.1:0',
    [rankEnv.coordinatorPortFile]: join(coordinatorDir, 'coordinator.port'),
    [rankEnv.provider]: process.env[rankEnv.provider] ?? 'shm',
    [rendezvousEnv.jobToken]: newJobToken(),
  };
  let failed: { rank: number; run: ToolRun } | null = null;
  try {
    const runs = await Promise.all(
      Array.from({ length: worldSize }, async (_, rank) => {
        const run = await runTool(path, args, {
          // Only the ranks' own environment: the rank contract's, as moe_train ranks get it.
          env: { ...contract, [rankEnv.rank]: String(rank) },
          signal: stopAll.signal,
          onRecord: rank === 0 ? onRecord : undefined,
          replaceEnv: true,
        }).catch((err: unknown) => {
          stopAll.abort(); // rank 0's record handler failed (an upload): stop the others
          throw err;
        });
        // The first rank to fail names the failure; the others exit because it stopped them.
        if (run.code !== 0 && !stopAll.signal.aborted) {
          failed = { rank, run };
          stopAll.abort();
        }
        return run;
      }),
    );
    if (failed !== null) {
      const f: { rank: number; run: ToolRun } = failed;
      throw rankFailure(what, f.rank, worldSize, f.run);
    }
    return runs[0]!;
  } finally {
    signal?.removeEventListener('abort', onAbort);
    await rm(coordinatorDir, { recursive: true, force: true });
  }
}
