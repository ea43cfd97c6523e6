// `moerl history <id>`: one row per iteration from the workflow history, across all runs.
import { printable } from '../../activities/printable.js';
import { stageNames } from '../../workflows/types.js';
import { describeCampaign } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { decimal, keyValues, seconds, table, timestamp } from '../format.js';
import { readCampaignHistory, type CampaignHistory } from '../history.js';
import { validationText } from './status.js';

/** KL(rollout || trainer) of the update's first step: from rounding (1e-13) to real mismatch. */
const mismatch = (kl: number | undefined) => (kl === undefined ? '-' : kl.toExponential(1));

export function historyText(history: CampaignHistory): string {
  const runs = history.runs.length;
  const header = `campaign ${printable(history.campaignId)}: ${history.iterations.length} iterations in ${runs} workflow run${runs === 1 ? '' : 's'}`;
  if (history.iterations.length === 0) return `${header}\nno activity yet`;
  // A campaign without validation gets no column of dashes for it.
  const stages = stageNames.filter(
    (s) => s !== 'validation' || history.iterations.some((it) => it.stages.validation),
  );
  const rows = history.iterations.map((it) => {
    const attempts = stageNames
      .filter((s) => (it.stages[s]?.attempts ?? 1) > 1)
      .map((s) => `${s} ${it.stages[s]?.attempts}`);
    const changes = it.hyperparameterChanges.map((c) => keyValues(c.changes)).join(' ');
    return [
      String(it.iteration),
      ...stages.map((s) => {
        const stage = it.stages[s];
        return stage === undefined ? '-' : stage.running ? 'running' : seconds(stage.seconds);
      }),
      attempts.length ? attempts.join(', ') : '1',
      decimal(it.meanReward),
      mismatch(it.trainMetrics?.mismatch_kl),
      changes || '-',
    ];
  });
  const out = [
    header,
    table(
      ['ITER', ...stages.map((s) => s.toUpperCase()), 'ATTEMPTS', 'REWARD', 'MISMATCH KL', 'CHANGES'],
      rows,
      // Numbers right-aligned: the iteration, stage times, reward and mismatch.
      new Set([0, ...stages.map((_, i) => i + 1), stages.length + 2, stages.length + 3]),
    ),
  ];
  const failures = history.iterations.flatMap((it) =>
    stageNames.flatMap((s) =>
      (it.stages[s]?.failures ?? []).map((f) => `  iteration ${it.iteration} ${s} ${printable(f)}`),
    ),
  );
  if (failures.length) out.push('failures:', ...failures);
  const rewardFailures = history.iterations.flatMap((it) =>
    it.rewardFailures
      ? [
          `  iteration ${it.iteration}: ${it.rewardFailures.samples} samples scored 0 (${keyValues(it.rewardFailures.byReason)})`,
        ]
      : [],
  );
  if (rewardFailures.length) out.push('reward function failures:', ...rewardFailures);
  const validations = history.iterations.flatMap((it) =>
    it.validation ? [`  ${printable(validationText(it.validation))}`] : [],
  );
  if (validations.length) out.push('validation:', ...validations);
  if (history.hyperparameterChanges.length)
    out.push(
      'hyperparameter changes:',
      ...history.hyperparameterChanges.map(
        (c) =>
          `  from iteration ${c.iteration}: ${keyValues(c.changes)}${c.reason ? ` (${printable(c.reason)})` : ''} at ${timestamp(c.at)}`,
      ),
    );
  return out.join('\n');
}

export const historyCommand: Command = {
  name: 'history',
  summary: 'per-iteration table from the workflow history: stage times, attempts, failures, reward',
  usage: 'history <campaign-id>',
  options: {},
  optionHelp: {},
  details:
    'Stage time runs from the first activity scheduled to the last one closed (retries and backoff included).',
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const client = await ctx.client();
    const id = ctx.positionals[0] as string;
    await describeCampaign(client, id);
    const history = await readCampaignHistory(client, id);
    ctx.print(history, () => historyText(history));
  },
};
