// What the Temporal UI and CLI show for a campaign: a one-line summary per activity (its user
// metadata, so a timeline bar says "rollout it 12 shard 3 (of 32)" instead of "rolloutShard")
// and the workflow's current details. Pure functions of the spec and state, no Temporal APIs:
// the workflow calls them, unit tests check them.
import type { CheckpointRef } from '../activities/types.js';
import type { CampaignSpec } from './spec.js';
import { isHfModel } from './spec-model.js';
import type { CampaignState, StageName } from './types.js';

export function prepareSummary(spec: CampaignSpec, iteration: number, forkFrom?: CheckpointRef): string {
  const sft = spec.sftWarmStartSteps > 0 ? ` + SFT ${spec.sftWarmStartSteps} steps` : '';
  const source = forkFrom
    ? `fork of ${forkFrom.campaignId} at iteration ${forkFrom.iteration}`
    : isHfModel(spec.model)
      ? `import ${spec.model.huggingFace}${sft}`
      : `init${sft}`;
  return `prepare it ${iteration} (${source}, ${spec.epWorldSize} ranks)`;
}

export function exportSummary(spec: CampaignSpec, iteration: number): string {
  return `export it ${iteration} to ${spec.export?.to ?? '?'}`;
}

export function prepareInputsSummary(spec: CampaignSpec): string {
  const dataset = 'dataset' in spec.task ? ` and check ${spec.task.dataset.train}` : '';
  return `prepare inputs (model files${dataset})`;
}

/** `shard` is the shard's id (0-based, as in store keys and `moerl history`). */
export function rolloutSummary(iteration: number, shard: number, shards: number): string {
  return `rollout it ${iteration} shard ${shard} (of ${shards})`;
}

export function rewardSummary(iteration: number, shards: number): string {
  return `reward it ${iteration} (${shards} shards)`;
}

export function validationShardSummary(iteration: number, shard: number, shards: number): string {
  return `validate it ${iteration} shard ${shard} (of ${shards})`;
}

export function validationScoreSummary(iteration: number): string {
  return `score validation it ${iteration}`;
}

export function updateSummary(spec: CampaignSpec, iteration: number): string {
  return `update it ${iteration} (${spec.epWorldSize} ranks)`;
}

export function checkpointSummary(iteration: number): string {
  return `checkpoint it ${iteration}`;
}

/** What the workflow knows about a running stage beyond the state: its tries, finished shards. */
export interface StageProgress {
  /** How many times the workflow has started this stage (more than 1 after a failure and resume). */
  tries: number;
  /** Rollout only: shards finished so far, of how many (fewer than the spec's after a `set` to fewer prompts). */
  shardsDone?: number;
  shards?: number;
}

export const stageKey = (iteration: number, stage: StageName) => `${iteration}/${stage}`;

/**
 * The workflow's current details: a status line, then one line per iteration with stages in
 * flight, e.g. "iteration 12: update, try 2" and "iteration 13: rollout, 5/32 shards done".
 */
export function currentDetails(
  state: CampaignState,
  spec: CampaignSpec,
  progress: ReadonlyMap<string, StageProgress>,
): string {
  const committed = Math.max(0, state.committedIteration);
  const last = state.recentIterations.at(-1);
  const reward = last ? `, mean reward ${last.meanReward.toFixed(3)} (iteration ${last.iteration})` : '';
  const paused = (state.status === 'paused' || state.status === 'pausing') && state.pauseReason;
  const lines = [
    `${state.status}${paused ? `: ${state.pauseReason}` : ''} — ${committed}/${spec.iterations} iterations committed${reward}`,
  ];
  const byIteration = new Map<number, string[]>();
  for (const a of state.activeStages) {
    const p = progress.get(stageKey(a.iteration, a.stage));
    const parts: string[] = [a.stage];
    if (a.stage === 'rollout' && p?.shardsDone !== undefined)
      parts.push(`${p.shardsDone}/${p.shards ?? spec.rolloutShards} shards done`);
    if (p && p.tries > 1) parts.push(`try ${p.tries}`);
    const stages = byIteration.get(a.iteration) ?? [];
    if (!stages.some((s) => s.startsWith(`${a.stage}`))) stages.push(parts.join(', '));
    byIteration.set(a.iteration, stages);
  }
  for (const [iteration, stages] of [...byIteration].sort(([a], [b]) => a - b))
    lines.push(`iteration ${iteration}: ${stages.join('; ')}`);
  return lines.join('\n');
}
