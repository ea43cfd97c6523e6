// `moerl status <id>`: the campaign's own account of itself (the status query), as a summary.
import type { WorkflowExecutionDescription } from '@temporalio/client';
import { printable } from '../../activities/printable.js';
import { stageOfActivity } from '../../activities/types.js';
import type { CampaignActivities } from '../../activities/types.js';
import type { CampaignState, StageName, ValidationSummary } from '../../workflows/types.js';
import { describeCampaign, executionStatus, queryState, type CampaignMemo } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { decimal, keyValues, seconds, timestamp } from '../format.js';
import { failureText } from '../history.js';
import { campaignBuild } from './list.js';

// temporal.api.enums.v1.VersioningBehavior
const versioningBehaviors: Record<number, string> = { 1: 'pinned', 2: 'auto-upgrade' };

/** The build the campaign's workflow runs on, and how it moves to a new one. */
export function buildText(description: WorkflowExecutionDescription): string {
  const versioning = description.raw?.workflowExecutionInfo?.versioningInfo;
  const build = campaignBuild(versioning);
  const behavior = versioningBehaviors[versioning?.behavior ?? 0];
  return behavior && build !== 'unversioned' ? `${build} (${behavior})` : build;
}

/**
 * Retries per stage so far: those the workflow counted (attempts beyond the first of activities
 * that finished) plus the attempts beyond the first of activities the server is retrying now. The
 * workflow learns an attempt only when the activity returns, so a shard whose worker is lost shows
 * attempt 2, 3, ... while the state still counts none; `moerl history` and `moerl report` count
 * those pending attempts too.
 */
export function retriesNow(
  state: CampaignState,
  description: WorkflowExecutionDescription,
): Record<StageName, number> {
  const retries = { ...state.retries };
  for (const p of description.raw?.pendingActivities ?? []) {
    const stage = stageOfActivity[p.activityType?.name as keyof CampaignActivities] as StageName | undefined;
    if (stage) retries[stage] += Math.max(0, (p.attempt ?? 1) - 1);
  }
  return retries;
}

/** "checkpoint 4: mean reward 0.420, pass@1 0.400 over 80 prompts; gsm8k 0.500 / 0.450, …" */
export function validationText(v: ValidationSummary): string {
  const sources = Object.entries(v.bySource);
  const bySource =
    sources.length > 1
      ? `; by data_source (mean reward / pass@${v.k}): ${sources.map(([s, x]) => `${s} ${decimal(x.meanReward)} / ${decimal(x.passAtK)}`).join(', ')}`
      : '';
  const failed = v.failedSamples ? `; ${v.failedSamples} samples failed to score` : '';
  return `checkpoint ${v.iteration}: mean reward ${decimal(v.meanReward)}, pass@${v.k} ${decimal(v.passAtK)} over ${v.prompts} prompts${bySource}${failed}`;
}

export function statusText(state: CampaignState, description: WorkflowExecutionDescription): string {
  const memo = description.memo as Partial<CampaignMemo> | undefined;
  const total = memo?.spec?.iterations;
  const execution = executionStatus(description);
  const lines: [string, string][] = [];
  lines.push(['campaign', `${state.campaignId} (${state.name})`]);
  const statusLine = execution === 'running' ? state.status : `${state.status} (workflow ${execution})`;
  // A pause asked for during the last stage stays in the state of a finished campaign: not news.
  const pausing = state.status === 'paused' || state.status === 'pausing';
  lines.push(['status', pausing && state.pauseReason ? `${statusLine}: ${state.pauseReason}` : statusLine]);
  const committed = state.committedIteration < 0 ? 'none yet' : String(state.committedIteration);
  lines.push([
    'iterations',
    `committed ${committed}${total === undefined ? '' : ` of ${total}`}, next rollout ${state.nextIteration}`,
  ]);
  if (state.activeStages.length > 0)
    lines.push([
      'running',
      state.activeStages
        .map((s) => `${s.stage} of iteration ${s.iteration} since ${timestamp(s.startedAt)}`)
        .join('; '),
    ]);
  // Attempts the server is retrying right now: a retry loop must be visible, not `running` only.
  for (const p of description.raw?.pendingActivities ?? []) {
    const attempt = p.attempt ?? 1;
    if (attempt <= 1 && !p.lastFailure) continue;
    const what = p.activityType?.name ?? 'activity';
    const failure = p.lastFailure ? `; last failure: ${failureText(p.lastFailure)}` : '';
    lines.push(['attempt', `${what} (activity ${p.activityId}) attempt ${attempt}${failure}`]);
  }
  if (state.latestCheckpoint) {
    const c = state.latestCheckpoint;
    lines.push(['checkpoint', `iteration ${c.iteration} at ${c.key} (mean reward ${decimal(c.meanReward)})`]);
  }
  if (state.checkpoints.length > 0)
    lines.push(['retained', `iterations ${state.checkpoints.map((c) => c.iteration).join(', ')}`]);
  lines.push(['hyperparameters', keyValues(state.hyperparameters)]);
  const schedule = state.promptSchedule ?? [];
  if (schedule.length > 1)
    lines.push([
      'prompts',
      schedule
        .map((s) => `${s.promptsPerIteration} an iteration from iteration ${s.fromIteration}`)
        .join(', '),
    ]);
  for (const change of state.hyperparameterChanges)
    lines.push([
      'change',
      `from iteration ${change.iteration}: ${keyValues(change.changes)}${change.reason ? ` (${change.reason})` : ''}`,
    ]);
  const retries = Object.entries(retriesNow(state, description)).filter(([, n]) => n > 0);
  lines.push(['retries', retries.length ? retries.map(([stage, n]) => `${stage} ${n}`).join(', ') : 'none']);
  if (state.lastFailure) {
    const f = state.lastFailure;
    lines.push([
      'last failure',
      `${f.stage} of iteration ${f.iteration} at ${timestamp(f.at)}: ${f.type}: ${f.message}`,
    ]);
  }
  const last = state.recentIterations[state.recentIterations.length - 1];
  if (last) {
    const stageTimes = Object.entries(last.stageSeconds)
      .map(([stage, s]) => `${stage} ${seconds(s)}`)
      .join(', ');
    lines.push([
      'last iteration',
      `${last.iteration}: mean reward ${decimal(last.meanReward)}, pass rate ${decimal(last.passRate)}, ${last.samples} samples; ${stageTimes}`,
    ]);
  }
  const validated = state.validations?.at(-1);
  if (validated) lines.push(['validation', validationText(validated)]);
  if (state.forkedFrom)
    lines.push(['forked from', `${state.forkedFrom.campaignId} at iteration ${state.forkedFrom.iteration}`]);
  lines.push(['workflow runs', String(state.runs)]);
  lines.push(['build', buildText(description)]);
  const width = Math.max(...lines.map(([k]) => k.length));
  // Names, reasons and failure messages (rank log tails among them) are others' text: no
  // control character of theirs reaches the terminal.
  return lines.map(([k, v]) => `${k.padEnd(width)}  ${printable(v)}`).join('\n');
}

export const statusCommand: Command = {
  name: 'status',
  summary: 'show a campaign: status, iteration, checkpoint, hyperparameters, retries',
  usage: 'status <campaign-id>',
  options: {},
  optionHelp: {},
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const client = await ctx.client();
    const { handle, description } = await describeCampaign(client, ctx.positionals[0] as string);
    const state = await queryState(client, handle);
    ctx.print(
      {
        campaignId: state.campaignId,
        execution: {
          status: executionStatus(description),
          runId: description.runId,
          startTime: description.startTime,
          closeTime: description.closeTime ?? null,
          historyLength: description.historyLength,
          build: campaignBuild(description.raw?.workflowExecutionInfo?.versioningInfo),
        },
        memo: description.memo ?? null,
        // The text's retries line: `state.retries` plus attempts the server is retrying now.
        retries: retriesNow(state, description),
        state,
      },
      () => statusText(state, description),
    );
  },
};
