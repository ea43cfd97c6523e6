// `moerl list`: campaigns from the visibility store, filtered by the campaign search attributes.
import type { WorkflowExecutionInfo } from '@temporalio/client';
import { SearchAttributeType, defineSearchAttributeKey } from '@temporalio/common';
import {
  campaignNameKey,
  campaignStatusKey,
  iterationKey,
  meanRewardKey,
} from '../../workflows/search-attributes.js';
import type { CampaignStatus } from '../../workflows/types.js';
import { campaignWorkflowType, type CampaignMemo } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { UsageError } from '../errors.js';
import { decimal, table, timestamp } from '../format.js';

const campaignStatuses: CampaignStatus[] = ['running', 'pausing', 'paused', 'completed', 'cancelled'];
const liveStatuses: CampaignStatus[] = ['running', 'pausing', 'paused'];

export interface CampaignListEntry {
  campaignId: string;
  name: string | null;
  /** The campaign's own status while it runs; how it ended once closed (completed, cancelled, terminated, ...). */
  status: string;
  iteration: number | null;
  meanReward: number | null;
  createdAt: string | null;
  runId: string;
  taskQueue: string;
  /** `deployment:buildId` the campaign's workflow runs on under Worker Versioning, else "unversioned". */
  build: string;
}

/** What a workflow description or listing says about the build it runs on. */
export interface VersioningInfo {
  behavior?: number | null;
  deploymentVersion?: { deploymentName?: string | null; buildId?: string | null } | null;
}

/** The server's own search attribute for it, `deployment:buildId` (listings carry no versioning info). */
const deploymentVersionKey = defineSearchAttributeKey(
  'TemporalWorkerDeploymentVersion',
  SearchAttributeType.KEYWORD,
);

export function campaignBuild(versioning: VersioningInfo | null | undefined): string {
  const v = versioning?.deploymentVersion;
  return v?.deploymentName && v.buildId ? `${v.deploymentName}:${v.buildId}` : 'unversioned';
}

/** The visibility query for the filters (values are checked, so quoting is safe). */
export function listQuery(filters: { status?: string; name?: string }): string {
  const clauses = [`WorkflowType = '${campaignWorkflowType}'`, `ExecutionStatus != 'ContinuedAsNew'`];
  if (filters.status !== undefined) {
    if (!(campaignStatuses as string[]).includes(filters.status))
      throw new UsageError(`--status must be one of ${campaignStatuses.join(', ')}, got "${filters.status}"`);
    clauses.push(`${campaignStatusKey.name} = '${filters.status}'`);
    // A terminated campaign never published its end; only open executions are live.
    if ((liveStatuses as string[]).includes(filters.status)) clauses.push(`ExecutionStatus = 'Running'`);
  }
  if (filters.name !== undefined) {
    if (!/^[a-z0-9-]+$/.test(filters.name))
      throw new UsageError(
        `--name must be a campaign name (lowercase letters, digits, dashes), got "${filters.name}"`,
      );
    clauses.push(`${campaignNameKey.name} = '${filters.name}'`);
  }
  return clauses.join(' AND ');
}

export function listEntry(info: WorkflowExecutionInfo): CampaignListEntry {
  const sa = info.typedSearchAttributes;
  const memo = info.memo as Partial<CampaignMemo> | undefined;
  const open = info.status.name === 'RUNNING';
  const closed =
    info.status.name === 'CANCELLED' ? 'cancelled' : info.status.name.toLowerCase().replace(/_/g, ' ');
  return {
    campaignId: info.workflowId,
    name: sa.get(campaignNameKey) ?? memo?.spec?.name ?? null,
    status: open ? (sa.get(campaignStatusKey) ?? 'running') : closed,
    iteration: sa.get(iterationKey) ?? null,
    meanReward: sa.get(meanRewardKey) ?? null,
    createdAt: memo?.createdAt ?? null,
    runId: info.runId,
    taskQueue: info.taskQueue,
    build: sa.get(deploymentVersionKey) ?? 'unversioned',
  };
}

export const listCommand: Command = {
  name: 'list',
  summary: 'list campaigns, optionally filtered by status or name',
  usage: 'list [--status S] [--name N] [--limit N]',
  options: { status: { type: 'string' }, name: { type: 'string' }, limit: { type: 'string' } },
  optionHelp: {
    '--status S': `only campaigns in status S (${campaignStatuses.join(', ')})`,
    '--name N': 'only campaigns whose spec name is N',
    '--limit N': 'at most N campaigns, newest first (default 50)',
  },
  positionals: { min: 0, max: 0 },
  async run(ctx: CommandContext) {
    const limitText = ctx.string('limit') ?? '50';
    const limit = Number(limitText);
    if (!Number.isInteger(limit) || limit < 1)
      throw new UsageError(`--limit must be a positive integer, got "${limitText}"`);
    const query = listQuery({ status: ctx.string('status'), name: ctx.string('name') });
    const client = await ctx.client();
    const campaigns: CampaignListEntry[] = [];
    for await (const info of client.workflow.list({ query, pageSize: Math.min(limit, 1000) })) {
      campaigns.push(listEntry(info));
      if (campaigns.length >= limit) break;
    }
    ctx.print({ query, campaigns }, () =>
      campaigns.length === 0
        ? 'no campaigns'
        : table(
            ['CAMPAIGN', 'NAME', 'STATUS', 'ITERATION', 'MEAN REWARD', 'CREATED', 'BUILD'],
            campaigns.map((c) => [
              c.campaignId,
              c.name ?? '-',
              c.status,
              c.iteration === null ? '-' : String(c.iteration),
              decimal(c.meanReward),
              timestamp(c.createdAt ?? undefined),
              c.build,
            ]),
            new Set([3, 4]),
          ),
    );
  },
};
