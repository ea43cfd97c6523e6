// The reward activity: scores every sample of an iteration with the task's verifier or the spec's
// HTTP reward model and writes one rewards file per shard (the format `moe_train grpo --rewards`
// reads). Its failures reach the workflow through toFailure (activities/index.ts), with their
// retryability: a reward model that breaks the protocol pauses the campaign instead of looping.
import { ApplicationFailure, Context } from '@temporalio/activity';
import { withHeartbeat } from './heartbeat.js';
import * as keys from './layout.js';
import { rewardAuthHeaders } from './rewards/auth.js';
import { campaignTokenizer } from './models/source.js';
import { printable } from './printable.js';
import { datasetInput, iterationRows } from './prompts.js';
import { datasetReward, RewardTally } from './rewards/dataset-reward.js';
import { BadInputError, BadRolloutError } from './rewards/errors.js';
import { RewardFunctions, type RewardChoice, type RewardFunctionsSpec } from './rewards/functions.js';
import { httpRewardModel, verifierReward } from './rewards/reward-model.js';
import type { RewardFunction } from './rewards/reward-model.js';
import { formatRewardsJsonl, groupsWithSignal, rewardStats, scoreRollouts } from './rewards/score.js';
import type { RewardRow } from './rewards/score.js';
import type { ParseOptions } from './rewards/rollout-record.js';
import type { SandboxOptions } from './rewards/user-function.js';
import type { DatasetRow } from './datasets/index.js';
import type { ObjectStore } from './store/types.js';
import type { ActivityDeps } from './deps.js';
import type { CampaignSpec } from '../workflows/spec.js';
import type { RewardChoiceSpec, RewardsSpec } from '../workflows/spec-rewards.js';
import { iterationPromptsOf } from './types.js';
import type { RewardInput, RewardOutput } from './types.js';

/**
 * The spec's reward for the built-in task or an HTTP reward model (whose credential is read from
 * this worker's environment or a file, never from the spec); a dataset task's rewards by
 * data_source are datasetScoring's.
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
      maxResponseBytes: allowedResponseBytes(r.maxResponseBytes, env),
      headers: rewardAuthHeaders(r.auth, r.url, env),
      kind: r.rewardKind,
      signal,
    });
  if (!('builtin' in spec.task))
    throw new BadInputError('a dataset task is scored by its rewards section or an http reward model');
  return verifierReward(spec.task.builtin);
}

/** The largest reward model response a worker reads unless its operator sets MOERL_REWARD_MAX_RESPONSE_BYTES. */
export const defaultWorkerMaxResponseBytes = 64 * 1024 * 1024;

/**
 * The spec's `reward.maxResponseBytes` when this worker allows as much: a response is held whole
 * in the worker's memory, so how large one may be is the worker's operator's to bound, not the
 * spec's (the spec may ask up to 1 GiB).
 */
export function allowedResponseBytes(asked: number, env: NodeJS.ProcessEnv = process.env): number {
  const setting = 'MOERL_REWARD_MAX_RESPONSE_BYTES';
  const text = env[setting]?.trim();
  if (text && !/^[1-9]\d*$/.test(text))
    throw new Error(`${setting}=${JSON.stringify(text)} is not a positive whole number of bytes`);
  const most = text ? Number(text) : defaultWorkerMaxResponseBytes;
  if (asked > most)
    throw new BadInputError(
      `reward.maxResponseBytes ${asked} is more than this worker reads from a reward model (${most} bytes, ` +
        `${setting}, the worker operator's setting); lower it in the spec, or raise the setting`,
    );
  return asked;
}

/** The sandbox of users' reward functions, as this worker's operator set it (never the spec). */
export function rewardSandboxFromEnv(env: NodeJS.ProcessEnv = process.env): SandboxOptions {
  const isolation = env.MOERL_REWARD_ISOLATION;
  if (isolation !== undefined && isolation !== 'namespaces' && isolation !== 'none')
    throw new Error(`MOERL_REWARD_ISOLATION must be namespaces or none, got "${isolation}"`);
  return isolation ? { isolation } : {};
}

/** The spec's rewards section as the reward library takes it (a Python function by module or by file). */
export function rewardFunctionsSpec(rewards: RewardsSpec): RewardFunctionsSpec {
  const choice = (c: RewardChoiceSpec): RewardChoice => {
    if (c.kind !== 'python') return c;
    const { module, path, file, function: fn, format } = c;
    const extra = format ? { format } : {};
    if (module !== undefined) return { kind: 'python', module, ...(path ? { path } : {}), ...extra };
    return { kind: 'python', file: file ?? '', ...(fn ? { function: fn } : {}), ...extra };
  };
  return {
    ...(rewards.default ? { default: choice(rewards.default) } : {}),
    ...(rewards.bySource
      ? { bySource: Object.fromEntries(Object.entries(rewards.bySource).map(([k, v]) => [k, choice(v)])) }
      : {}),
  };
}

export interface Scoring {
  reward: RewardFunction;
  parse: ParseOptions;
  tally?: RewardTally;
  close(): void;
}

/** How a dataset task's records are scored: by the function of their row's data_source, or the http reward model. */
export async function datasetScoring(
  deps: ActivityDeps,
  store: ObjectStore,
  spec: CampaignSpec,
  campaignId: string,
  rowOf: (promptId: number) => DatasetRow,
): Promise<Scoring> {
  const tokenizer = await campaignTokenizer(store, campaignId, deps.cacheDir);
  const parse = { eosIds: tokenizer.eosTokenIds };
  if (spec.reward.kind === 'http')
    return { reward: rewardFunction(spec, Context.current().cancellationSignal), parse, close: () => {} };
  if (!spec.rewards)
    throw new BadInputError('a dataset task needs its rewards section (or an http reward model)');
  const functions = new RewardFunctions(rewardFunctionsSpec(spec.rewards), {
    sandbox: rewardSandboxFromEnv(),
  });
  const tally = new RewardTally();
  const decode = (ids: number[]) => tokenizer.decode(ids, { skipSpecialTokens: true });
  return {
    reward: datasetReward(functions, rowOf, tally, decode),
    parse,
    tally,
    close: () => functions.close(),
  };
}

/** The iteration's rows, each by its prompt id. */
async function iterationScoring(
  deps: ActivityDeps,
  store: ObjectStore,
  input: RewardInput,
): Promise<Scoring> {
  const { spec } = input;
  const prompts = iterationPromptsOf(input);
  if (!input.dataset)
    throw new BadInputError(
      `reward of iteration ${input.iteration}: a dataset task needs the dataset's position from the workflow`,
    );
  const rows = await iterationRows(
    spec,
    input.dataset,
    { promptStart: 0, promptCount: prompts.count },
    datasetInput(spec, 'train', deps.openStore),
    deps.cacheDir,
  );
  const { first } = prompts;
  return datasetScoring(
    deps,
    store,
    spec,
    input.campaignId,
    rowAt(rows, first, `iteration ${input.iteration}`),
  );
}

/** Looks up a record's row: prompt id `first + i` is `rows[i]`; any other id is a malformed rollout. */
export function rowAt(
  rows: readonly DatasetRow[],
  first: number,
  whose: string,
): (promptId: number) => DatasetRow {
  return (promptId) => {
    const row = rows[promptId - first];
    if (!row)
      throw new BadRolloutError(
        `prompt ${promptId} is not one of ${whose}'s (${first} to ${first + rows.length - 1})`,
        { field: 'prompt_id', prompt_id: promptId },
      );
    return row;
  };
}

/** Training on an iteration of zeros would teach nothing and hide the broken function. */
export function throwIfAllFailing(tally: RewardTally | undefined, where: string): void {
  const failing = tally?.allFailing()[0];
  if (failing)
    throw ApplicationFailure.create({
      type: 'RewardFunctionFailing',
      nonRetryable: true,
      message: `reward function ${failing.function} failed on all ${failing.samples} samples it scored in ${where}; the first: ${failing.first.reason}: ${printable(failing.first.message)}`,
    });
}

export async function computeRewards(deps: ActivityDeps, input: RewardInput): Promise<RewardOutput> {
  const ctx = Context.current();
  const store = deps.openStore(input.spec.store);
  const scoring: Scoring =
    'dataset' in input.spec.task
      ? await iterationScoring(deps, store, input)
      : { reward: rewardFunction(input.spec, ctx.cancellationSignal), parse: {}, close: () => {} };
  const { reward, tally } = scoring;
  const taskRows: RewardRow[] = [];
  const trainerRows: RewardRow[] = [];
  const progress = { shard: 0, chunk: 0 };
  try {
    // A reward model may take longer per batch than the heartbeat timeout: beat on a timer.
    await withHeartbeat(
      () => progress,
      async () => {
        for (const [shard, chunks] of input.chunksPerShard.entries()) {
          if (shard < (input.firstShard ?? 0)) continue;
          const rows: RewardRow[] = [];
          for (let chunk = 0; chunk < chunks; chunk++) {
            Object.assign(progress, { shard, chunk });
            const chunkKey = keys.rolloutChunkKey(input.campaignId, input.iteration, shard, chunk);
            const lines = (await store.get(chunkKey)).toString('utf8').split('\n');
            const scored = await scoreRollouts(lines, chunkKey, reward, {
              ...scoring.parse,
              ...(input.overlong ? { overlong: input.overlong } : {}),
            });
            rows.push(...scored.rows);
            taskRows.push(...scored.taskRows);
          }
          const key = keys.rewardKey(input.campaignId, input.iteration, shard);
          await store.put(key, formatRewardsJsonl(rows), { contentType: 'application/x-ndjson' });
          trainerRows.push(...rows);
        }
      },
    );
  } finally {
    scoring.close();
  }
  throwIfAllFailing(tally, `iteration ${input.iteration}`);
  const stats = rewardStats(taskRows, reward.kind);
  const signal = groupsWithSignal(trainerRows);
  return {
    meanReward: stats.meanReward,
    stdReward: stats.stdReward,
    passRate: stats.passRate,
    groups: signal.groups,
    groupsWithSignal: signal.withSignal,
    ...(tally && tally.failed > 0 ? { failedSamples: tally.failed, failuresByReason: tally.byReason } : {}),
    attempt: ctx.info.attempt,
  };
}
