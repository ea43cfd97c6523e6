// `moerl start <spec.yaml>`: validate the spec and start a campaign workflow on the control queue.
import { WorkflowExecutionAlreadyStartedError, type Client } from '@temporalio/client';
import type { CheckpointRef } from '../../activities/types.js';
import { taskQueuesFrom } from '../../workers/temporal-options.js';
import type { campaign } from '../../workflows/campaign.js';
import { campaignNameKey, campaignStatusKey } from '../../workflows/search-attributes.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import type { CampaignInput, PromptSegment, TaskQueues } from '../../workflows/types.js';
import {
  campaignWorkflowType,
  checkCampaignId,
  newCampaignId,
  specSummary,
  type CampaignMemo,
} from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { CliError } from '../errors.js';
import { loadSpecFile, parseOverride } from '../spec-file.js';

export interface StartedCampaign {
  campaignId: string;
  runId: string;
  name: string;
  taskQueues: TaskQueues;
  memo: CampaignMemo;
}

/** Starts a campaign; shared by `start` and `fork`. */
export async function startCampaign(
  client: Client,
  opts: {
    spec: CampaignSpec;
    id?: string;
    taskQueues: TaskQueues;
    forkFrom?: CheckpointRef;
    promptSchedule?: PromptSegment[];
  },
): Promise<StartedCampaign> {
  const campaignId = opts.id === undefined ? newCampaignId(opts.spec.name) : checkCampaignId(opts.id);
  const input: CampaignInput = {
    campaignId,
    spec: opts.spec,
    taskQueues: opts.taskQueues,
    ...(opts.forkFrom ? { forkFrom: opts.forkFrom } : {}),
    ...(opts.promptSchedule ? { promptSchedule: opts.promptSchedule } : {}),
  };
  const memo: CampaignMemo = {
    spec: specSummary(opts.spec),
    createdAt: new Date().toISOString(),
    ...(opts.forkFrom
      ? { forkedFrom: { campaignId: opts.forkFrom.campaignId, iteration: opts.forkFrom.iteration } }
      : {}),
  };
  try {
    const handle = await client.workflow.start<typeof campaign>(campaignWorkflowType, {
      workflowId: campaignId,
      taskQueue: opts.taskQueues.control,
      args: [input],
      memo: { ...memo },
      typedSearchAttributes: [
        { key: campaignNameKey, value: opts.spec.name },
        { key: campaignStatusKey, value: 'running' },
      ],
    });
    return {
      campaignId,
      runId: handle.firstExecutionRunId,
      name: opts.spec.name,
      taskQueues: opts.taskQueues,
      memo,
    };
  } catch (err) {
    if (err instanceof WorkflowExecutionAlreadyStartedError)
      throw new CliError(`a campaign with id "${campaignId}" already exists; choose another --id`);
    throw err;
  }
}

export function describeStarted(started: StartedCampaign, what = 'started campaign'): string {
  const s = started.memo.spec;
  return [
    `${what} ${started.campaignId}`,
    `  name        ${s.name} (${s.task}; ${s.model})`,
    `  iterations  ${s.iterations} × ${s.promptsPerIteration} prompts × ${s.groupSize} samples, ${s.rolloutShards} rollout shards, staleness ${s.staleness}`,
    `  task queue  ${started.taskQueues.control} (rollout: ${started.taskQueues.rollout}, train: ${started.taskQueues.train})`,
    `next: moerl status ${started.campaignId}`,
  ].join('\n');
}

export const startCommand: Command = {
  name: 'start',
  summary: 'validate a spec file and start a campaign',
  usage: 'start <spec.yaml> [--set key=value]... [--id ID]',
  options: { set: { type: 'string', multiple: true }, id: { type: 'string' } },
  optionHelp: {
    '--set key=value': 'override a spec field before validation (dotted path, repeatable)',
    '--id ID': 'campaign id (default: <name>-<6 random characters>)',
  },
  details: `The campaign runs on the control task queue (MOERL_TASK_QUEUE_PREFIX + "control").
example: moerl start examples/demo.yaml --set iterations=5 --set hyperparameters.lr=0.0005`,
  positionals: { min: 1, max: 1 },
  async run(ctx: CommandContext) {
    const spec = loadSpecFile(ctx.positionals[0] as string, ctx.strings('set').map(parseOverride));
    const client = await ctx.client();
    const id = ctx.string('id');
    const started = await startCampaign(client, {
      spec,
      taskQueues: taskQueuesFrom(ctx.io.env),
      ...(id === undefined ? {} : { id }),
    });
    ctx.print(started, () => describeStarted(started));
  },
};
