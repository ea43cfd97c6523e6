// `moerl pause|resume|cancel <id>`: signals and cancellation of a running campaign.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from '@temporalio/client';
import { pauseSignal, resumeSignal } from '../../workflows/messages.js';
import type { CampaignState } from '../../workflows/types.js';
import {
  describeCampaign,
  executionStatus,
  isRunning,
  queryState,
  type CampaignHandle,
} from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { CliError, UsageError } from '../errors.js';
import { lastCommittedCheckpoint } from '../history.js';

async function runningCampaign(client: Client, id: string, verb: string): Promise<CampaignHandle> {
  const { handle, description } = await describeCampaign(client, id);
  if (!isRunning(description))
    throw new CliError(`campaign "${id}" is ${executionStatus(description)}; there is nothing to ${verb}`);
  return handle;
}

function waitingFor(state: CampaignState): string {
  return state.activeStages.map((s) => `${s.stage} of iteration ${s.iteration}`).join(', ');
}

export const pauseCommand: Command = {
  name: 'pause',
  summary: 'pause a campaign at the next stage boundary',
  usage: 'pause <campaign-id> [--reason TEXT]',
  options: { reason: { type: 'string' } },
  optionHelp: { '--reason TEXT': 'why (shown by status)' },
  details: 'Running stages finish first: the status is "pausing" until they have, then "paused".',
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const client = await ctx.client();
    const handle = await runningCampaign(client, ctx.positionals[0] as string, 'pause');
    const reason = ctx.string('reason');
    await handle.signal(pauseSignal, reason === undefined ? {} : { reason });
    const state = await queryState(client, handle);
    ctx.print(
      { campaignId: handle.workflowId, status: state.status, activeStages: state.activeStages },
      () =>
        state.status === 'pausing'
          ? `pausing ${handle.workflowId}: waiting for ${waitingFor(state)} to finish`
          : `${handle.workflowId} is ${state.status}`,
    );
  },
};

export const resumeCommand: Command = {
  name: 'resume',
  summary: 'resume a paused campaign (also retries a stage that failed for good)',
  usage: 'resume <campaign-id>',
  options: {},
  optionHelp: {},
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const client = await ctx.client();
    const handle = await runningCampaign(client, ctx.positionals[0] as string, 'resume');
    await handle.signal(resumeSignal, {});
    const state = await queryState(client, handle);
    ctx.print(
      { campaignId: handle.workflowId, status: state.status },
      () => `${handle.workflowId} is ${state.status}`,
    );
  },
};

export const cancelCommand: Command = {
  name: 'cancel',
  summary: 'stop a campaign; its last committed checkpoint stays its result',
  usage: 'cancel <campaign-id> [--wait-seconds N]',
  options: { 'wait-seconds': { type: 'string' } },
  optionHelp: {
    '--wait-seconds N': 'how long to wait for the campaign to stop (default 60; 0: do not wait)',
  },
  details: 'The running stage is cancelled; a checkpoint commit in progress finishes first.',
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const waitText = ctx.string('wait-seconds') ?? '60';
    const waitSeconds = Number(waitText);
    if (!Number.isFinite(waitSeconds) || waitSeconds < 0)
      throw new UsageError(`--wait-seconds must be a number ≥ 0, got "${waitText}"`);
    const client = await ctx.client();
    const id = ctx.positionals[0] as string;
    const handle = await runningCampaign(client, id, 'cancel');
    await handle.cancel();
    let stopped = false;
    if (waitSeconds > 0) {
      const closed = handle.result().then(
        () => true,
        () => true,
      );
      // The timer is cleared once the campaign closes, or it would keep the process alive.
      const timer = new AbortController();
      const timedOut = sleep(waitSeconds * 1000, false, { signal: timer.signal }).catch(() => false);
      stopped = await Promise.race([closed, timedOut]);
      timer.abort();
    }
    const checkpoint = await lastCommittedCheckpoint(client, id);
    const status = stopped ? executionStatus((await describeCampaign(client, id)).description) : 'cancelling';
    ctx.print({ campaignId: id, status, latestCheckpoint: checkpoint }, () =>
      [
        stopped ? `${id} is ${status}` : `cancellation of ${id} requested; it is still stopping`,
        checkpoint
          ? `latest committed checkpoint: iteration ${checkpoint.iteration} at ${checkpoint.key}`
          : 'no checkpoint was committed',
      ].join('\n'),
    );
  },
};
