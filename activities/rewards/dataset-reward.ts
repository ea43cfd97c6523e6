// A dataset task's reward as a RewardFunction: each record is scored by the reward function of
// its row's data_source (functions.ts), in verl's terms — the decoded completion against the
// row's ground truth, with its extra_info. Failed samples score 0; the tally adds up every batch
// of an iteration, so the reward activity can report the failures by reason and pause the
// campaign when a function failed on every sample it scored.
import { episodeMessages } from '../agents/episode.js';
import type { DatasetRow } from '../datasets/index.js';
import type { FailureReason } from './process-pool.js';
import type { FunctionTally, RewardFunctions, SampleFailure } from './functions.js';
import type { RewardFunction } from './reward-model.js';

export class RewardTally {
  private readonly perFunction = new Map<string, FunctionTally>();
  failed = 0;
  readonly byReason: Partial<Record<FailureReason, number>> = {};

  add(byFunction: readonly FunctionTally[]): void {
    for (const t of byFunction) {
      const seen = this.perFunction.get(t.function) ?? { function: t.function, samples: 0, failed: 0 };
      seen.samples += t.samples;
      seen.failed += t.failed;
      seen.first ??= t.first;
      this.perFunction.set(t.function, seen);
    }
  }

  countFailure(failure: SampleFailure): void {
    this.failed++;
    this.byReason[failure.reason] = (this.byReason[failure.reason] ?? 0) + 1;
  }

  /** Functions that failed on every sample they scored, with their first failure. */
  allFailing(): (FunctionTally & { first: SampleFailure })[] {
    return [...this.perFunction.values()].filter(
      (t): t is FunctionTally & { first: SampleFailure } => t.first !== undefined && t.failed === t.samples,
    );
  }
}

/**
 * Scores records by their rows' reward functions; `rowOf` maps a prompt id to its dataset row.
 * An episode's function gets its last turn as the solution and the whole trajectory as
 * extra_info.messages (`decode` gives a policy turn's text), and its environment's reward as
 * extra_info.environment_reward (the `environment` reward kind scores that alone).
 */
export function datasetReward(
  functions: RewardFunctions,
  rowOf: (promptId: number) => DatasetRow,
  tally: RewardTally,
  decode: (ids: number[]) => string,
): RewardFunction {
  return {
    name: 'rewards',
    kind: 'continuous',
    async score(batch) {
      const scored = await functions.scoreBatch(
        batch.map((record) => {
          const row = rowOf(record.prompt_id);
          const episode = record.episode;
          const extraInfo = episode
            ? {
                ...asObject(row.extraInfo),
                messages: episodeMessages({ tokens: record.tokens, episode }, decode),
                ...(episode.environment_reward !== undefined
                  ? { environment_reward: episode.environment_reward }
                  : {}),
              }
            : row.extraInfo;
          return {
            dataSource: row.dataSource,
            solutionStr: record.text,
            groundTruth: row.groundTruth,
            ...(extraInfo === undefined ? {} : { extraInfo }),
            ...(episode?.environment_reward !== undefined
              ? { environmentReward: episode.environment_reward }
              : {}),
          };
        }),
      );
      tally.add(scored.byFunction);
      for (const r of scored.results) if (r.failure) tally.countFailure(r.failure);
      return scored.results.map((r) => r.score);
    },
  };
}

/** A row's extra_info as an object to add fields to (verl's is a dict; anything else is kept as `value`). */
function asObject(extraInfo: unknown): Record<string, unknown> {
  if (extraInfo === undefined || extraInfo === null) return {};
  if (typeof extraInfo === 'object' && !Array.isArray(extraInfo)) return extraInfo as Record<string, unknown>;
  return { value: extraInfo };
}
