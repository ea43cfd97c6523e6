// The reward activity: scores every sample of an iteration with the task's verifier or the spec's
// HTTP reward model and writes one rewards file per shard (the format `moe_train grpo --rewards`
// reads). Its failures reach the workflow through toFailure (activities/index.ts), with their
// retryability: a reward model that breaks the protocol pauses the campaign instead of looping.
import { ApplicationFailure, Context } from '@temporalio/activity';
import { withHeartbeat } from './heartbeat.js';
import * as keys from './layout.js';
import { rewardAuthHeaders } from './rewards/auth.js';
import { httpRewardModel, verifierReward } from './rewards/reward-model.js';
import type { RewardFunction } from './rewards/reward-model.js';
import { formatRewardsJsonl, rewardStats, scoreRollouts } from './rewards/score.js';
import type { RewardRow } from './rewards/score.js';
import type { ActivityDeps } from './deps.js';
import type { CampaignSpec } from '../workflows/spec.js';
import { badInputErrorType } from './types.js';
import type { RewardInput, RewardOutput } from './types.js';

/**
 * The spec's reward: the builtin task's verifier, or an HTTP reward model whose credential is
 * read from this worker's environment (or a file), never from the spec.
 */
export function rewardFunction(
  spec: CampaignSpec,
  signal: AbortSignal,
  env: NodeJS.ProcessEnv = process.env,
): RewardFunction {
  const r = spec.reward;
  if (r.kind === 'http')
    return httpRewardModel({
      url: r.url,
      timeoutMs: r.timeoutMs,
      maxRetries: r.maxRetries,
      batchSize: r.batchSize,
      maxResponseBytes: r.maxResponseBytes,
      headers: rewardAuthHeaders(r.auth, env),
      kind: r.rewardKind,
      signal,
    });
  if (!('builtin' in spec.task))
    throw ApplicationFailure.create({
      type: badInputErrorType,
      nonRetryable: true,
      message:
        'a dataset task has no built-in verifier yet (reward functions chosen by data_source are not built): give the spec an http reward model (reward: { kind: http, url })',
    });
  return verifierReward(spec.task.builtin);
}

export async function computeRewards(deps: ActivityDeps, input: RewardInput): Promise<RewardOutput> {
  const ctx = Context.current();
  const store = deps.openStore(input.spec.store);
  const reward = rewardFunction(input.spec, ctx.cancellationSignal);
  const all: RewardRow[] = [];
  const progress = { shard: 0, chunk: 0 };
  // A reward model may take longer per batch than the heartbeat timeout: beat on a timer.
  await withHeartbeat(
    () => progress,
    async () => {
      for (const [shard, chunks] of input.chunksPerShard.entries()) {
        const rows: RewardRow[] = [];
        for (let chunk = 0; chunk < chunks; chunk++) {
          Object.assign(progress, { shard, chunk });
          const chunkKey = keys.rolloutChunkKey(input.campaignId, input.iteration, shard, chunk);
          const lines = (await store.get(chunkKey)).toString('utf8').split('\n');
          rows.push(...(await scoreRollouts(lines, chunkKey, reward)).rows);
        }
        const key = keys.rewardKey(input.campaignId, input.iteration, shard);
        await store.put(key, formatRewardsJsonl(rows), { contentType: 'application/x-ndjson' });
        all.push(...rows);
      }
    },
  );
  const stats = rewardStats(all, reward.kind);
  return {
    meanReward: stats.meanReward,
    stdReward: stats.stdReward,
    passRate: stats.passRate,
    attempt: ctx.info.attempt,
  };
}
