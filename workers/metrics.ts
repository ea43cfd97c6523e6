// Prometheus metrics of one worker process, served at /metrics (docs/metrics.md).
// Every activity is measured in one wrapper around the activities a worker registers, so the
// activities themselves stay free of metrics code. Labels are bounded: stages, outcomes and
// reasons are fixed sets; campaign ids label only the per-campaign gauges, of which at most
// `maxCampaigns` are kept.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Context } from '@temporalio/activity';
import type { Info } from '@temporalio/activity';
import { ApplicationFailure, CancelledFailure, defaultPayloadConverter } from '@temporalio/common';
import type { NativeConnection } from '@temporalio/worker';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type {
  CampaignActivities,
  CheckpointInput,
  RewardOutput,
  RolloutShardOutput,
  UpdateOutput,
  ValidationOutput,
} from '../activities/types.js';
import { badInputErrorType, stageOfActivity } from '../activities/types.js';
import { campaignStatusKey } from '../workflows/search-attributes.js';
import type { CampaignStatus, StageName } from '../workflows/types.js';

/** Failure types that get their own `reason` label; any other failure is "other". */
const knownReasons = new Set([
  badInputErrorType,
  'TrainerRankFailed',
  'TrainerOutputMissing',
  'RolloutInterrupted',
  'RolloutIncomplete',
  'RolloutFailingOnLiveWorker',
  'WorkerShuttingDown',
  'NativeToolFailed',
  'NativeToolMissing',
  'StagedCheckpointCorrupt',
  'StoreAuth',
  'NotSupported',
]);

/** Server-side timeouts by TimeoutType wire number (temporal.api.enums.v1.TimeoutType). */
const timeoutReasons: Record<number, string> = {
  1: 'StartToCloseTimeout',
  2: 'ScheduleToStartTimeout',
  3: 'ScheduleToCloseTimeout',
  4: 'HeartbeatTimeout',
};

/** Every value of the `status` label of moerl_campaign_status. */
export const campaignStatuses = [
  'running',
  'pausing',
  'paused',
  'completed',
  'cancelled',
  'failed',
  'terminated',
] as const;
type StatusLabel = (typeof campaignStatuses)[number];

/** Per-campaign gauges keep the campaigns most recently committed on this worker, no more. */
const maxCampaigns = 64;
/** Validation gauges keep this many data sources of a campaign (its first, by name), no more. */
const maxValidationSources = 32;
/** A scrape re-reads campaign statuses at most this often, and waits this long for an answer. */
const statusRefreshMs = 10_000;
const describeTimeoutMs = 3_000;

/** Activities run from well under a second (a commit) to hours (an update of a large model). */
const durationBuckets = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600];
/** A commit copies nothing (the files are staged already): milliseconds to a few minutes. */
const commitBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];

type DescribeResponse = Awaited<ReturnType<NativeConnection['workflowService']['describeWorkflowExecution']>>;
type ProtoFailure = NonNullable<NonNullable<DescribeResponse['pendingActivities']>[number]['lastFailure']>;

/** What the metrics read from the Temporal server: one workflow execution's description. */
export type DescribeWorkflow = (workflowId: string, runId?: string) => Promise<DescribeResponse>;

export interface WorkerMetrics {
  registry: Registry;
  /** The same activities, each call measured. */
  instrument(activities: CampaignActivities): CampaignActivities;
}

/** The `reason` label of a failure as the server recorded it. */
export function failureReason(failure: ProtoFailure | null | undefined): string {
  if (!failure) return 'unknown';
  if (failure.timeoutFailureInfo)
    return timeoutReasons[failure.timeoutFailureInfo.timeoutType ?? 0] ?? 'other';
  if (failure.applicationFailureInfo) {
    const type = failure.applicationFailureInfo.type ?? '';
    return knownReasons.has(type) ? type : 'other';
  }
  if (failure.canceledFailureInfo) return 'Cancelled';
  return 'other';
}

/** The campaign status a description shows: the workflow's CampaignStatus search attribute while
 * it runs or after it completed, the execution's own status when it ended otherwise. */
export function campaignStatusOf(d: DescribeResponse): StatusLabel | undefined {
  const info = d.workflowExecutionInfo;
  const payload = info?.searchAttributes?.indexedFields?.[campaignStatusKey.name];
  let attribute: CampaignStatus | undefined;
  try {
    if (payload) attribute = defaultPayloadConverter.fromPayload<CampaignStatus>(payload);
  } catch {
    attribute = undefined;
  }
  const known = (campaignStatuses as readonly string[]).includes(attribute ?? '') ? attribute : undefined;
  // WorkflowExecutionStatus wire numbers: 1 running, 2 completed, 3 failed, 4 canceled,
  // 5 terminated, 6 continued-as-new (not the latest run), 7 timed out.
  switch (info?.status) {
    case 1:
      return known ?? 'running';
    case 2:
      return known === 'cancelled' ? 'cancelled' : 'completed';
    case 3:
    case 7:
      return 'failed';
    case 4:
      return 'cancelled';
    case 5:
      return 'terminated';
    default:
      return undefined;
  }
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/**
 * The worker's metrics. `describe` reads workflow descriptions from the server: the reason of a
 * retry (how the previous attempt ended) and each tracked campaign's status. Without it, both
 * are unknown (retries count as reason "unknown"; no status gauge).
 */
export function createWorkerMetrics(describe?: DescribeWorkflow): WorkerMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const registers = [registry];
  const duration = new Histogram({
    name: 'moerl_stage_duration_seconds',
    help: 'Wall time of activity attempts (a rollout attempt is one shard), by stage and outcome (ok, failed, cancelled).',
    labelNames: ['stage', 'outcome'] as const,
    buckets: durationBuckets,
    registers,
  });
  const attempts = new Counter({
    name: 'moerl_activity_attempts_total',
    help: 'Activity attempts started, by stage.',
    labelNames: ['stage'] as const,
    registers,
  });
  const retries = new Counter({
    name: 'moerl_activity_retries_total',
    help: 'Activity attempts after the first, by stage and how the previous attempt ended as the server recorded it.',
    labelNames: ['stage', 'reason'] as const,
    registers,
  });
  const failures = new Counter({
    name: 'moerl_activity_failures_total',
    help: 'Activity attempts that failed in this worker, by stage and failure type ("other" for unlisted types).',
    labelNames: ['stage', 'reason'] as const,
    registers,
  });
  const tokens = new Counter({
    name: 'moerl_rollout_tokens_total',
    help: 'Tokens generated by completed rollout shards.',
    registers,
  });
  const samples = new Counter({
    name: 'moerl_rollout_samples_total',
    help: 'Samples generated by completed rollout shards.',
    registers,
  });
  const chunksRedone = new Counter({
    name: 'moerl_rollout_chunks_redone_total',
    help: 'Rollout chunks regenerated because an earlier attempt died before storing them.',
    registers,
  });
  const episodes = new Counter({
    name: 'moerl_rollout_episodes_total',
    help: 'Episodes of agentic rollouts in completed shards, by end reason.',
    labelNames: ['end_reason'] as const,
    registers,
  });
  const episodeTurns = new Counter({
    name: 'moerl_rollout_episode_turns_total',
    help: 'Policy turns of those episodes.',
    registers,
  });
  const toolCalls = new Counter({
    name: 'moerl_rollout_tool_calls_total',
    help: 'Tool calls of those episodes, by tool ("(unknown)" for a name the model made up).',
    labelNames: ['tool'] as const,
    registers,
  });
  const toolErrors = new Counter({
    name: 'moerl_rollout_tool_errors_total',
    help: 'Tool calls that did not run or failed, by error kind.',
    labelNames: ['error'] as const,
    registers,
  });
  const toolSeconds = new Counter({
    name: 'moerl_rollout_tool_seconds_total',
    help: 'Time episodes waited on tools, summed over episodes.',
    registers,
  });
  const generationSeconds = new Counter({
    name: 'moerl_rollout_generation_seconds_total',
    help: "Time episodes waited on their policy turns' generation, summed over episodes.",
    registers,
  });
  const rewardGroups = new Counter({
    name: 'moerl_reward_groups_total',
    help: 'Prompt groups scored by completed reward activities, by whether their rewards carry signal (not all equal).',
    labelNames: ['signal'] as const,
    registers,
  });
  const commitBytes = new Counter({
    name: 'moerl_checkpoint_commit_bytes_total',
    help: 'Bytes of the files of committed checkpoints (by their manifests).',
    registers,
  });
  const commitSeconds = new Histogram({
    name: 'moerl_checkpoint_commit_duration_seconds',
    help: 'Wall time of successful checkpoint commits (verify, manifest, LATEST, retention).',
    buckets: commitBuckets,
    registers,
  });
  const rankFailures = new Counter({
    name: 'moerl_train_job_rank_failures_total',
    help: 'Training jobs that failed with a named rank failing, by stage (prepare, update).',
    labelNames: ['stage'] as const,
    registers,
  });
  // Both series exist from the start, so the first failure is an increase rate() can see.
  for (const stage of ['prepare', 'update'] as const) rankFailures.inc({ stage }, 0);
  const epSeconds = new Gauge({
    name: 'moerl_update_ep_seconds',
    help: 'Expert-parallel communication time of the last optimizer step of the latest update.',
    registers,
  });
  const epBytes = new Gauge({
    name: 'moerl_update_ep_bytes',
    help: 'Expert-parallel bytes sent by rank 0 in the last optimizer step of the latest update.',
    registers,
  });
  const stepSeconds = new Gauge({
    name: 'moerl_update_step_seconds',
    help: 'Wall time of the last optimizer step of the latest update (EP share: ep_seconds / this).',
    registers,
  });
  const mismatchKl = new Gauge({
    name: 'moerl_update_mismatch_kl',
    help: "KL(rollout || trainer) over the tokens of the latest update's first step (k3 estimate).",
    registers,
  });
  const tisClipFraction = new Gauge({
    name: 'moerl_update_tis_clip_fraction',
    help: "Share of the tokens of the latest update's first step whose importance weight is truncated.",
    registers,
  });
  const campaignIteration = new Gauge({
    name: 'moerl_campaign_iteration',
    help: 'Iteration of the latest checkpoint this worker committed, per campaign.',
    labelNames: ['campaign'] as const,
    registers,
  });
  const campaignReward = new Gauge({
    name: 'moerl_campaign_mean_reward',
    help: 'Mean reward the latest committed checkpoint was scored with, per campaign.',
    labelNames: ['campaign'] as const,
    registers,
  });
  // The validation gauges live on the rollout workers that score validations; the overall figure
  // has an empty data_source (in PromQL, the same as no label).
  const validationLabels = ['campaign', 'data_source'] as const;
  const validationIteration = new Gauge({
    name: 'moerl_validation_iteration',
    help: 'Iteration of the latest checkpoint whose validation this worker scored, per campaign.',
    labelNames: ['campaign'] as const,
    registers,
  });
  const validationReward = new Gauge({
    name: 'moerl_validation_mean_reward',
    help: 'Mean validation reward of that checkpoint, per campaign and data_source ("" for all prompts).',
    labelNames: validationLabels,
    registers,
  });
  const validationPassAtK = new Gauge({
    name: 'moerl_validation_pass_at_k',
    help: 'Validation pass@k of that checkpoint (k: the validation samples per prompt), per campaign and data_source.',
    labelNames: validationLabels,
    registers,
  });
  /** Campaigns with validation series, oldest first, and the data sources each has series for. */
  const validated = new Map<string, string[]>();
  function forgetValidation(campaign: string) {
    validationIteration.remove(campaign);
    for (const source of validated.get(campaign) ?? []) {
      validationReward.remove({ campaign, data_source: source });
      validationPassAtK.remove({ campaign, data_source: source });
    }
    validated.delete(campaign);
  }
  function recordValidation(campaign: string, out: ValidationOutput) {
    forgetValidation(campaign);
    if (validated.size >= maxCampaigns) forgetValidation(validated.keys().next().value!);
    const groups: [string, { meanReward: number; passAtK: number }][] = [
      ['', out],
      ...Object.entries(out.bySource).slice(0, maxValidationSources),
    ];
    validated.set(
      campaign,
      groups.map(([source]) => source),
    );
    validationIteration.set({ campaign }, out.iteration);
    for (const [source, scores] of groups) {
      validationReward.set({ campaign, data_source: source }, scores.meanReward);
      validationPassAtK.set({ campaign, data_source: source }, scores.passAtK);
    }
  }
  const campaigns: string[] = [];
  let statusesReadAt = 0;

  /** Reads the tracked campaigns' statuses from the server, at most every statusRefreshMs. */
  async function refreshStatuses(gauge: Gauge<'campaign' | 'status'>, read: DescribeWorkflow) {
    if (Date.now() - statusesReadAt < statusRefreshMs) return;
    statusesReadAt = Date.now();
    await Promise.all(
      campaigns.map(async (campaign) => {
        // A campaign the server cannot describe now keeps the status it last showed.
        const d = await withTimeout(read(campaign), describeTimeoutMs, `describe ${campaign}`).catch(
          () => undefined,
        );
        const status = d && campaignStatusOf(d);
        if (!status || !campaigns.includes(campaign)) return;
        for (const s of campaignStatuses) gauge.set({ campaign, status: s }, s === status ? 1 : 0);
      }),
    );
  }
  const campaignStatus =
    describe &&
    new Gauge({
      name: 'moerl_campaign_status',
      help: 'Status of each campaign this worker committed checkpoints for: 1 on its current status, 0 on the others.',
      labelNames: ['campaign', 'status'] as const,
      registers,
      async collect() {
        await refreshStatuses(this, describe);
      },
    });

  /** Keeps `campaignId` among the tracked campaigns; true when it was not tracked yet. */
  function track(campaignId: string): boolean {
    const seen = campaigns.indexOf(campaignId);
    if (seen >= 0) campaigns.splice(seen, 1);
    campaigns.push(campaignId);
    if (campaigns.length > maxCampaigns) {
      const evicted = campaigns.shift()!;
      campaignIteration.remove(evicted);
      campaignReward.remove(evicted);
      for (const status of campaignStatuses) campaignStatus?.remove({ campaign: evicted, status });
    }
    return seen < 0;
  }

  /** Counts a retry under how its previous attempt ended, once the server has said so. */
  async function countRetry(stage: StageName, info: Info) {
    let reason = 'unknown';
    const execution = info.workflowExecution;
    if (describe && execution) {
      const d = await withTimeout(
        describe(execution.workflowId, execution.runId),
        describeTimeoutMs,
        'describe',
      ).catch(() => undefined);
      const pending = d?.pendingActivities?.find((p) => p.activityId === info.activityId);
      // The server keeps the previous attempt's failure on the pending activity while this one runs.
      if (pending && (pending.attempt ?? 0) >= info.attempt) reason = failureReason(pending.lastFailure);
    }
    retries.inc({ stage, reason });
  }

  const onSuccess: {
    [K in keyof CampaignActivities]?: (input: unknown, output: unknown, seconds: number) => void;
  } = {
    rolloutShard: (_input, output) => {
      const out = output as RolloutShardOutput;
      tokens.inc(out.tokens);
      samples.inc(out.samples);
      chunksRedone.inc(out.chunksRedone);
      const e = out.episodes;
      if (!e) return;
      for (const [end_reason, n] of Object.entries(e.endReasons)) episodes.inc({ end_reason }, n);
      episodeTurns.inc(e.policyTurns);
      for (const [tool, n] of Object.entries(e.toolCalls)) toolCalls.inc({ tool }, n);
      for (const [error, n] of Object.entries(e.toolErrors)) toolErrors.inc({ error }, n);
      toolSeconds.inc(e.toolSeconds);
      generationSeconds.inc(e.generationSeconds);
    },
    computeRewards: (_input, output) => {
      const { groups, groupsWithSignal } = output as RewardOutput;
      if (groups === undefined || groupsWithSignal === undefined) return;
      rewardGroups.inc({ signal: 'yes' }, groupsWithSignal);
      rewardGroups.inc({ signal: 'no' }, groups - groupsWithSignal);
    },
    updatePolicy: (_input, output) => {
      const m = (output as UpdateOutput).metrics;
      // A retry that found the update done returns no metrics: keep the last values.
      if (m.ep_seconds !== undefined) epSeconds.set(m.ep_seconds);
      if (m.ep_bytes !== undefined) epBytes.set(m.ep_bytes);
      if (m.seconds !== undefined) stepSeconds.set(m.seconds);
      if (m.mismatch_kl !== undefined) mismatchKl.set(m.mismatch_kl);
      if (m.tis_clip_frac !== undefined) tisClipFraction.set(m.tis_clip_frac);
    },
    scoreValidation: (input, output) =>
      recordValidation((input as { campaignId: string }).campaignId, output as ValidationOutput),
    commitCheckpoint: (input, _output, seconds) => {
      const { campaignId, staged, meanReward } = input as CheckpointInput;
      commitBytes.inc(staged.manifest.files.reduce((sum, f) => sum + f.bytes, 0));
      commitSeconds.observe(seconds);
      // A campaign new to this worker has its status read at the next scrape, not a refresh later.
      if (track(campaignId)) statusesReadAt = 0;
      campaignIteration.set({ campaign: campaignId }, staged.iteration);
      if (meanReward === null) campaignReward.remove(campaignId);
      else campaignReward.set({ campaign: campaignId }, meanReward);
    },
  };

  function wrap<I, O>(activity: keyof CampaignActivities, fn: (input: I) => Promise<O>) {
    const stage = stageOfActivity[activity];
    return async (input: I): Promise<O> => {
      const ctx = Context.current();
      attempts.inc({ stage });
      if (ctx.info.attempt > 1) void countRetry(stage, ctx.info);
      const started = process.hrtime.bigint();
      const end = duration.startTimer({ stage });
      try {
        const output = await fn(input);
        end({ outcome: 'ok' });
        onSuccess[activity]?.(input, output, Number(process.hrtime.bigint() - started) / 1e9);
        return output;
      } catch (err) {
        const cancelled = err instanceof CancelledFailure || ctx.cancellationSignal.aborted;
        end({ outcome: cancelled ? 'cancelled' : 'failed' });
        const type = err instanceof ApplicationFailure ? err.type : undefined;
        failures.inc({ stage, reason: type && knownReasons.has(type) ? type : 'other' });
        // The launcher's message names the rank ("update: rank 1 of 2 exited with code 3 ...").
        if (/\brank \d+ of \d+\b/.test(err instanceof Error ? err.message : '')) rankFailures.inc({ stage });
        throw err;
      }
    };
  }

  return {
    registry,
    instrument: (a) => ({
      prepareInputs: wrap('prepareInputs', a.prepareInputs),
      preparePolicy: wrap('preparePolicy', a.preparePolicy),
      rolloutShard: wrap('rolloutShard', a.rolloutShard),
      computeRewards: wrap('computeRewards', a.computeRewards),
      validationShard: wrap('validationShard', a.validationShard),
      scoreValidation: wrap('scoreValidation', a.scoreValidation),
      updatePolicy: wrap('updatePolicy', a.updatePolicy),
      commitCheckpoint: wrap('commitCheckpoint', a.commitCheckpoint),
      exportPolicy: wrap('exportPolicy', a.exportPolicy),
    }),
  };
}
export interface MetricsServer {
  /** `http://host:port/metrics`, with the port actually bound (port 0 picks a free one). */
  url: string;
  close(): Promise<void>;
}

/** Serves `registry` at GET /metrics in the Prometheus text format. */
export async function serveMetrics(registry: Registry, port: number, host: string): Promise<MetricsServer> {
  const server = createServer((req, res) => {
    if (req.method !== 'GET' || req.url?.split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found; metrics are at /metrics\n');
      return;
    }
    registry.metrics().then(
      (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
      (err: unknown) => res.writeHead(500, { 'content-type': 'text/plain' }).end(`${String(err)}\n`),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(new Error(`metrics server on ${host}:${port}: ${err.message}`)));
    server.listen(port, host, () => resolve());
  });
  const bound = (server.address() as AddressInfo).port;
  return {
    url: `http://${hostPort(host, bound)}/metrics`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** `host:port`, with an IPv6 host in brackets. */
export function hostPort(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/** A TCP port from a flag or env value: an integer 0..65535 (0: any free port). */
export function parsePort(text: string, what: string): number {
  const port = Number(text);
  if (!/^\d+$/.test(text.trim()) || port > 65535)
    throw new Error(`${what} must be a port number 0..65535, got "${text}"`);
  return port;
}
