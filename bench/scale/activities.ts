// Fast campaign activities for the scale benchmark: the recording test activities (no native
// work, no store), each call first waiting a stage time drawn from a seeded log-normal
// distribution. The draw depends only on the seed, the campaign name, the activity, the
// iteration and the shard, so a rerun waits the same times whatever order the calls come in.
// Commits answer with what retention would remove (keep the last K, the best, the reference and
// the protected iterations), as the real commit does, so the campaign state stays as small as in
// production; the recorded calls are dropped as they finish, so the worker's memory measures
// the worker, not the recording.
import { sleep } from '@temporalio/activity';
import type { CampaignActivities, CheckpointInput } from '../../activities/types.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import { createRecordingTestActivities } from '../../test/support/recording-activities.js';
import type { ActivityName } from '../../test/support/recording-activities.js';

export type StageMedians = Record<ActivityName, number>;

export interface FastActivityOptions {
  seed: number;
  /** Median stage time per activity for a campaign's spec; null: no wait at all. */
  mediansFor: (spec: CampaignSpec) => StageMedians | null;
  /** Log-normal sigma of the stage times (0: every call waits its median). */
  sigma: number;
}

/** Per campaign name: when each iteration's checkpoint was committed (ms since the epoch). */
export type CommitTimes = Map<string, Map<number, number>>;

// 32-bit FNV-1a then a murmur-style finaliser: a well-mixed uniform in [0, 1) from a string.
function uniform(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return ((h >>> 0) + 0.5) / 2 ** 32;
}

/** Milliseconds a call waits: median · exp(sigma · z), z standard normal (Box–Muller). */
export function stageTime(median: number, sigma: number, key: string): number {
  const z = Math.sqrt(-2 * Math.log(uniform(`${key}/a`))) * Math.cos(2 * Math.PI * uniform(`${key}/b`));
  return median * Math.exp(sigma * z);
}

export function createFastActivities(opts: FastActivityOptions): {
  activities: CampaignActivities;
  commits: CommitTimes;
} {
  const { activities: base, calls } = createRecordingTestActivities();
  const commits: CommitTimes = new Map();
  // Per campaign id: committed iteration → [key, mean reward], what retention chooses from.
  const retained = new Map<string, Map<number, [string, number | null]>>();

  async function wait(name: ActivityName, spec: CampaignSpec, iteration: number, shard = -1) {
    const medians = opts.mediansFor(spec);
    if (!medians) return;
    const ms = stageTime(
      medians[name],
      opts.sigma,
      `${opts.seed}/${spec.name}/${name}/${iteration}/${shard}`,
    );
    await sleep(Math.round(ms));
  }

  function retention(input: CheckpointInput): string[] {
    const { campaignId, staged, spec } = input;
    const mine = retained.get(campaignId) ?? new Map<number, [string, number | null]>();
    retained.set(campaignId, mine);
    mine.set(staged.iteration, [staged.key, input.meanReward]);
    const iterations = [...mine.keys()].sort((a, b) => a - b);
    const keep = new Set([
      ...iterations.slice(-spec.retention.keepLast),
      input.referenceIteration,
      ...(input.protectIterations ?? []),
    ]);
    if (spec.retention.keepBest) {
      const scored = iterations.filter((i) => mine.get(i)![1] !== null);
      const best = scored.sort((a, b) => mine.get(b)![1]! - mine.get(a)![1]!)[0];
      if (best !== undefined) keep.add(best);
    }
    const removed: string[] = [];
    for (const i of iterations)
      if (!keep.has(i) && i < staged.iteration) {
        removed.push(mine.get(i)![0]);
        mine.delete(i);
      }
    return removed;
  }

  const activities: CampaignActivities = {
    prepareInputs: (input) => base.prepareInputs(input),
    validationShard: (input) => base.validationShard(input),
    scoreValidation: (input) => base.scoreValidation(input),
    exportPolicy: (input) => base.exportPolicy(input),
    preparePolicy: async (input) => {
      await wait('preparePolicy', input.spec, 0);
      return base.preparePolicy(input);
    },
    rolloutShard: async (input) => {
      await wait('rolloutShard', input.spec, input.iteration, input.shard);
      return base.rolloutShard(input);
    },
    computeRewards: async (input) => {
      await wait('computeRewards', input.spec, input.iteration);
      return base.computeRewards(input);
    },
    updatePolicy: async (input) => {
      await wait('updatePolicy', input.spec, input.iteration);
      return base.updatePolicy(input);
    },
    commitCheckpoint: async (input) => {
      await wait('commitCheckpoint', input.spec, input.staged.iteration);
      const out = await base.commitCheckpoint(input);
      const times = commits.get(input.spec.name) ?? new Map<number, number>();
      commits.set(input.spec.name, times);
      times.set(input.staged.iteration, Date.now());
      return { ...out, removed: retention(input) };
    },
  };
  // The recording keeps every call's input; the benchmark needs none of them.
  const dropCalls = <T>(p: Promise<T>) => p.finally(() => calls.splice(0, calls.length));
  const wrapped = Object.fromEntries(
    Object.entries(activities).map(([name, fn]) => [
      name,
      (input: never) => dropCalls((fn as (i: never) => Promise<unknown>)(input)),
    ]),
  ) as unknown as CampaignActivities;
  return { activities: wrapped, commits };
}
