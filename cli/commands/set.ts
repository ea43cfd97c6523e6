// `moerl set <id> key=value...`: change hyperparameters through the campaign's validated update.
import { WorkflowUpdateFailedError } from '@temporalio/client';
import { setHyperparametersUpdate } from '../../workflows/messages.js';
import type { CampaignChange } from '../../workflows/spec.js';
import { describeCampaign, executionStatus, isRunning } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { CliError, UsageError } from '../errors.js';
import { keyValues, oneLine } from '../format.js';
import { checkFieldName, parseScalar } from '../spec-file.js';

/** `lr=1e-4` or `hyperparameters.lr=1e-4` → { lr: 0.0001 }; the campaign validates names and ranges. */
export function parseHyperparameterArgs(args: readonly string[]): CampaignChange {
  const changes: Record<string, unknown> = {};
  for (const arg of args) {
    const eq = arg.indexOf('=');
    if (eq <= 0) throw new UsageError(`expected key=value (e.g. lr=0.0001), got "${arg}"`);
    const key = arg
      .slice(0, eq)
      .trim()
      .replace(/^hyperparameters\./, '');
    checkFieldName(key, arg);
    changes[key] = parseScalar(arg.slice(eq + 1).trim(), arg);
  }
  return changes as CampaignChange;
}

export const setCommand: Command = {
  name: 'set',
  summary: 'change hyperparameters of a running campaign (validated by the campaign)',
  usage: 'set <campaign-id> key=value... [--reason TEXT]',
  options: { reason: { type: 'string' } },
  optionHelp: { '--reason TEXT': 'why (recorded with the change)' },
  details: `Keys: lr, klCoef, clipEps, clipHigh, lossNormTokens, temperature, topP, entropyCoef,
auxLossCoef, maxNewTokens, tisClip, promptsPerIteration (the dataset position carries on from where it is; fewer prompts than
rolloutShards use one shard a prompt), and staleness (0 to 8, within the spec's keepLast and rolloutShards limits: rollouts
started from then on run up to that many iterations ahead; those already ahead are kept).
A change applies from the next iteration whose rollout has not started.
example: moerl set demo-k3j9x2 lr=0.0001 temperature=0.8 --reason "reward plateau"`,
  positionals: { min: 2, max: Infinity },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const [id, ...pairs] = ctx.positionals as [string, ...string[]];
    const changes = parseHyperparameterArgs(pairs);
    const client = await ctx.client();
    const { handle, description } = await describeCampaign(client, id);
    if (!isRunning(description))
      throw new CliError(
        `campaign "${id}" is ${executionStatus(description)}; hyperparameters can no longer change`,
      );
    const reason = ctx.string('reason');
    let change;
    try {
      change = await handle.executeUpdate(setHyperparametersUpdate, {
        args: [{ changes, ...(reason === undefined ? {} : { reason }) }],
      });
    } catch (err) {
      if (err instanceof WorkflowUpdateFailedError)
        throw new CliError(
          `campaign ${id} rejected the change: ${oneLine(err.cause?.message ?? err.message)}`,
        );
      throw err;
    }
    ctx.print(
      { campaignId: id, change },
      () => `${id}: ${keyValues(change.changes)} from iteration ${change.iteration}`,
    );
  },
};
