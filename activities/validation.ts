// The validation score activity: a checkpoint's completions of the held-out prompts
// (validationShard, in rollout.ts, generated them) scored with the campaign's rewards, summed up
// as mean reward and pass@k, overall and per data_source, and stored beside the completions.
import { Context } from '@temporalio/activity';
import { validationPromptCount } from '../workflows/spec-validation.js';
import { withHeartbeat } from './heartbeat.js';
import * as keys from './layout.js';
import { validationRows } from './prompts.js';
import { datasetScoring, rowAt, throwIfAllFailing } from './reward.js';
import { BadRolloutError } from './rewards/errors.js';
import { passes, scoreRollouts } from './rewards/score.js';
import type { RewardRow } from './rewards/score.js';
import type { RewardKind } from './rewards/reward-model.js';
import type { ActivityDeps } from './deps.js';
import type { ScoreValidationInput, ValidationOutput, ValidationScores } from './types.js';

export async function scoreValidation(
  deps: ActivityDeps,
  input: ScoreValidationInput,
): Promise<ValidationOutput> {
  const ctx = Context.current();
  const { spec, validation } = input;
  const iteration = input.policy.iteration;
  const store = deps.openStore(spec.store);
  const prompts = validationPromptCount(validation, input.dataset.rows);
  const rows = await validationRows(deps, input, { promptStart: 0, promptCount: prompts });
  const whose = `checkpoint ${iteration}'s validation`;
  const scoring = await datasetScoring(deps, store, spec, input.campaignId, rowAt(rows, 0, whose));
  const scored: RewardRow[] = [];
  const progress = { shard: 0, chunk: 0 };
  try {
    await withHeartbeat(
      () => progress,
      async () => {
        for (const [shard, chunks] of input.chunksPerShard.entries())
          for (let chunk = 0; chunk < chunks; chunk++) {
            Object.assign(progress, { shard, chunk });
            const key = keys.validationChunkKey(input.campaignId, iteration, shard, chunk);
            const lines = (await store.get(key)).toString('utf8').split('\n');
            scored.push(...(await scoreRollouts(lines, key, scoring.reward, scoring.parse)).rows);
          }
      },
    );
  } finally {
    scoring.close();
  }
  throwIfAllFailing(scoring.tally, whose);
  const expected = prompts * validation.samples;
  if (scored.length !== expected)
    throw new BadRolloutError(
      `${whose} has ${scored.length} scored samples, not ${prompts} prompts × ${validation.samples} samples = ${expected}`,
      { field: 'sample_index' },
    );
  const tally = scoring.tally;
  const summary: Omit<ValidationOutput, 'attempt'> = {
    iteration,
    k: validation.samples,
    ...validationScores(scored, () => true, scoring.reward.kind),
    bySource: Object.fromEntries(
      [...new Set(rows.map((r) => r.dataSource))]
        .sort()
        .map((source) => [
          source,
          validationScores(scored, (id) => rows[id]!.dataSource === source, scoring.reward.kind),
        ]),
    ),
    ...(tally && tally.failed > 0 ? { failedSamples: tally.failed, failuresByReason: tally.byReason } : {}),
  };
  await store.put(
    keys.validationScoresKey(input.campaignId, iteration),
    Buffer.from(JSON.stringify(summary, null, 2) + '\n'),
    { contentType: 'application/json' },
  );
  return { ...summary, attempt: ctx.info.attempt };
}

/**
 * Mean reward over the samples of the prompts `included` keeps, and pass@k: the fraction of those
 * prompts with at least one passing sample (exact: every prompt has exactly k samples).
 */
export function validationScores(
  scored: readonly RewardRow[],
  included: (promptId: number) => boolean,
  kind: RewardKind,
): ValidationScores {
  const byPrompt = new Map<number, number[]>();
  for (const r of scored)
    if (included(r.prompt_id)) byPrompt.set(r.prompt_id, [...(byPrompt.get(r.prompt_id) ?? []), r.reward]);
  const all = [...byPrompt.values()];
  const samples = all.reduce((n, rs) => n + rs.length, 0);
  const total = all.reduce((sum, rs) => sum + rs.reduce((a, b) => a + b, 0), 0);
  const passed = all.filter((rs) => rs.some((r) => passes(r, kind))).length;
  return {
    prompts: all.length,
    meanReward: samples > 0 ? total / samples : 0,
    passAtK: all.length > 0 ? passed / all.length : 0,
  };
}
