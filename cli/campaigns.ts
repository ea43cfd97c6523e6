// Client-side access to campaigns shared by the commands: handles that fail with a one-line
// "not found", the status query with a deadline, the input a campaign was started with, and
// the spec summary kept in each campaign's memo.
import { randomInt } from 'node:crypto';
import {
  WorkflowNotFoundError,
  defaultPayloadConverter,
  type Client,
  type WorkflowExecutionDescription,
  type WorkflowHandle,
} from '@temporalio/client';
import { statusQuery } from '../workflows/messages.js';
import type { CampaignSpec } from '../workflows/spec.js';
import { isHfModel } from '../workflows/spec-model.js';
import type { CampaignInput, CampaignState } from '../workflows/types.js';
import type { campaign } from '../workflows/campaign.js';
import { reasonOf } from './command.js';
import { CliError, UsageError } from './errors.js';

export const campaignWorkflowType = 'campaign';
export type CampaignHandle = WorkflowHandle<typeof campaign>;

/** How long a query may take: the answer comes from a worker replaying the campaign. */
export const queryTimeoutMs = 15_000;

/** `<name>-<6 base36 characters>` */
export function newCampaignId(name: string): string {
  const alphabet = '0123456789abcdefghijklmnopqrstuvwxyz';
  let suffix = '';
  for (let i = 0; i < 6; i++) suffix += alphabet[randomInt(alphabet.length)];
  return `${name}-${suffix}`;
}

export function checkCampaignId(id: string): string {
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$/.test(id))
    throw new UsageError(`"${id}" is not a campaign id (letters, digits, '.', '_' and '-')`);
  return id;
}

export function isNotFound(err: unknown): boolean {
  return (
    err instanceof WorkflowNotFoundError ||
    (err instanceof Error && /not ?found/i.test(err.message) && /workflow|execution/i.test(err.message))
  );
}

export function notFound(client: Client, id: string): CliError {
  return new CliError(`campaign "${id}" not found in namespace "${client.options.namespace}"`);
}

/** The campaign's latest run, described; a CliError when there is no such campaign. */
export async function describeCampaign(
  client: Client,
  id: string,
): Promise<{ handle: CampaignHandle; description: WorkflowExecutionDescription }> {
  const handle = client.workflow.getHandle<typeof campaign>(checkCampaignId(id));
  try {
    const description = await handle.describe();
    if (description.type !== campaignWorkflowType)
      throw new CliError(`"${id}" is a ${description.type} workflow, not a campaign`);
    return { handle, description };
  } catch (err) {
    if (isNotFound(err)) throw notFound(client, id);
    throw err;
  }
}

export function isRunning(description: WorkflowExecutionDescription): boolean {
  return description.status.name === 'RUNNING';
}

/** Lower-case execution status for messages: running, completed, cancelled, terminated, ... */
export function executionStatus(description: { status: { name: string } }): string {
  const name = description.status.name.toLowerCase().replace(/_/g, ' ');
  return name === 'canceled' ? 'cancelled' : name;
}

/** The campaign state via the status query, bounded by `queryTimeoutMs`. */
export async function queryState(client: Client, handle: CampaignHandle): Promise<CampaignState> {
  try {
    return await client.connection.withDeadline(Date.now() + queryTimeoutMs, () => handle.query(statusQuery));
  } catch (err) {
    if (isNotFound(err)) throw notFound(client, handle.workflowId);
    if (/deadline|timed? ?out/i.test(reasonOf(err)))
      throw new CliError(
        `campaign "${handle.workflowId}" did not answer the status query within ${queryTimeoutMs / 1000} s (is a control worker running?)`,
      );
    throw err;
  }
}

/** The input the latest run started with (its first history event): spec, task queues, state. */
export async function campaignInput(client: Client, id: string): Promise<CampaignInput> {
  try {
    const response = await client.workflowService.getWorkflowExecutionHistory({
      namespace: client.options.namespace,
      execution: { workflowId: id },
      maximumPageSize: 1,
    });
    const started = response.history?.events?.[0]?.workflowExecutionStartedEventAttributes;
    const payload = started?.input?.payloads?.[0];
    if (!payload) throw new CliError(`campaign "${id}" has no start input in its history`);
    return defaultPayloadConverter.fromPayload<CampaignInput>(payload);
  } catch (err) {
    if (isNotFound(err)) throw notFound(client, id);
    throw err;
  }
}

/** A few scalars describing a spec, kept in the campaign memo and shown by `list` and `status`. */
export interface SpecSummary {
  name: string;
  task: string;
  model: string;
  iterations: number;
  promptsPerIteration: number;
  groupSize: number;
  rolloutShards: number;
  epWorldSize: number;
  staleness: number;
  launcher: string;
  store: string;
}

export function specSummary(spec: CampaignSpec): SpecSummary {
  const m = spec.model;
  const store =
    spec.store.kind === 'fs' ? `fs:${spec.store.path}` : `s3://${spec.store.bucket}/${spec.store.prefix}`;
  return {
    name: spec.name,
    task: 'builtin' in spec.task ? spec.task.builtin : `dataset:${spec.task.dataset.train}`,
    model: isHfModel(m)
      ? `Hugging Face ${m.huggingFace}`
      : `${m.layers} layers, hidden ${m.hidden}, ${m.heads} heads, ${m.experts} experts top-${m.topK}`,
    iterations: spec.iterations,
    promptsPerIteration: spec.promptsPerIteration,
    groupSize: spec.groupSize,
    rolloutShards: spec.rolloutShards,
    epWorldSize: spec.epWorldSize,
    staleness: spec.staleness,
    launcher: spec.launcher.kind,
    store,
  };
}

/** The memo a campaign starts with. */
export interface CampaignMemo {
  spec: SpecSummary;
  createdAt: string;
  forkedFrom?: { campaignId: string; iteration: number };
}
