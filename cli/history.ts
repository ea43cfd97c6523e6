// Reads a campaign's workflow history across continue-as-new runs and turns it into one record
// per iteration: stage durations (activity scheduled → closed), attempts and failure reasons,
// the reward and rollout figures, and the hyperparameter changes accepted through updates; plus
// the runs, pauses and (for `moerl report`) every activity record.
import { defaultPayloadConverter, type Client, type WorkflowHandle } from '@temporalio/client';
import { addEpisodeStats, emptyEpisodeStats } from '../activities/agents/episode-stats.js';
import type {
  CampaignActivities,
  CheckpointOutput,
  EpisodeStats,
  PrepareInput,
  RewardOutput,
  RolloutShardOutput,
  UpdateOutput,
  ValidationOutput,
} from '../activities/types.js';
import { stageOfActivity } from '../activities/types.js';
import { stageNames } from '../workflows/types.js';
import type {
  CampaignInput,
  HyperparameterChange,
  StageName,
  ValidationSummary,
} from '../workflows/types.js';
import { isNotFound, notFound } from './campaigns.js';

type History = Awaited<ReturnType<WorkflowHandle['fetchHistory']>>;
export type HistoryEvent = NonNullable<History['events']>[number];
type Payloads =
  { payloads?: Parameters<typeof defaultPayloadConverter.fromPayload>[0][] | null } | null | undefined;
type ProtoFailure = {
  message?: string | null;
  applicationFailureInfo?: { type?: string | null } | null;
  timeoutFailureInfo?: { timeoutType?: number | string | null } | null;
} | null;
type Timestamp =
  { seconds?: number | { toNumber(): number } | null; nanos?: number | null } | null | undefined;

/** One scheduled activity as the history tells it. */
export interface ActivityRecord {
  activityId: string;
  activity: keyof CampaignActivities;
  stage: StageName;
  iteration: number;
  shard?: number;
  runId: string;
  scheduledAt: number;
  /** When the last attempt started (the history records only that one); null while none has closed. */
  startedAt: number | null;
  closedAt: number | null;
  outcome: 'running' | 'completed' | 'failed' | 'timed out' | 'cancelled';
  /** Attempts made (the last one included); 1 while the first attempt has not closed. */
  attempts: number;
  /** Failure reasons seen, as "attempt N: Type: message". */
  failures: string[];
  /** Of those, the failures that were heartbeat timeouts. */
  heartbeatTimeouts: number;
  result: unknown;
}

export interface StageHistory {
  /** First scheduled → last closed; null while an activity of the stage is still open. */
  seconds: number | null;
  /** Most attempts any one activity (shard) of the stage took. */
  attempts: number;
  activities: number;
  failures: string[];
  running: boolean;
}

export interface IterationHistory {
  iteration: number;
  stages: Partial<Record<StageName, StageHistory>>;
  meanReward: number | null;
  /** Key of the checkpoint committed for this iteration. */
  checkpoint: string | null;
  hyperparameterChanges: HyperparameterChange[];
  /** From the reward activity; null until it completed. */
  passRate: number | null;
  /** Samples whose reward function failed (scored 0), by reason; null when none did. */
  rewardFailures: { samples: number; byReason: Partial<Record<string, number>> } | null;
  /** Summed over the rollout shards' completed activities; null until every shard completed. */
  samples: number | null;
  tokens: number | null;
  rolloutTokensPerSecond: number | null;
  chunksRedone: number | null;
  /** An agentic campaign's episodes, summed over the shards; null without any, or until every shard completed. */
  episodes: EpisodeStats | null;
  /** The update's scalar metrics (its last optimizer step); null until the update completed. */
  trainMetrics: Record<string, number> | null;
  /** This iteration's checkpoint's validation scores; null when it was not validated (yet). */
  validation: ValidationSummary | null;
}

/** One workflow run of the campaign (continue-as-new starts the next). */
export interface RunSpan {
  runId: string;
  startedAt: string;
  /** Time of the run's last event so far; `closedAs` says whether it has ended and how. */
  lastEventAt: string;
  closedAs: 'continued-as-new' | 'completed' | 'failed' | 'cancelled' | 'terminated' | 'timed out' | null;
}

/** A pause signal and the resume signal that ended it (null while still paused). */
export interface PauseRecord {
  requestedAt: string;
  reason: string;
  resumedAt: string | null;
}

export interface CampaignHistory {
  campaignId: string;
  /** Run ids, oldest first. */
  runs: string[];
  runSpans: RunSpan[];
  iterations: IterationHistory[];
  hyperparameterChanges: HyperparameterChange[];
  pauses: PauseRecord[];
}

export function timestampMs(ts: Timestamp): number {
  if (!ts) return 0;
  const s = ts.seconds;
  const secs = s === null || s === undefined ? 0 : typeof s === 'number' ? s : s.toNumber();
  return secs * 1000 + (ts.nanos ?? 0) / 1e6;
}

/** The first payload of `payloads` as JSON, or undefined (none, or not JSON). */
export function decodePayloads<T>(payloads: Payloads): T | undefined {
  const payload = payloads?.payloads?.[0];
  if (!payload) return undefined;
  try {
    return defaultPayloadConverter.fromPayload<T>(payload);
  } catch {
    return undefined;
  }
}

/** A heartbeat timeout, as the server records it (TimeoutType HEARTBEAT = 4). */
function isHeartbeatTimeout(failure: ProtoFailure | undefined): boolean {
  const type = failure?.timeoutFailureInfo?.timeoutType;
  return type === 4 || type === 'TIMEOUT_TYPE_HEARTBEAT' || type === 'HEARTBEAT';
}

export function failureText(failure: ProtoFailure | undefined): string {
  if (!failure) return 'unknown failure';
  const type = failure.applicationFailureInfo?.type;
  return `${type ? `${type}: ` : ''}${failure.message ?? ''}`.split('\n')[0] as string;
}

/** The iteration (and shard) an activity input belongs to. */
function iterationOf(
  activity: keyof CampaignActivities,
  input: unknown,
): { iteration: number; shard?: number } {
  const i = (input ?? {}) as Record<string, unknown>;
  if (activity === 'preparePolicy') {
    const source = (i as Partial<PrepareInput>).source;
    return { iteration: source?.kind === 'fork' ? source.checkpoint.iteration : 0 };
  }
  if (activity === 'validationShard' || activity === 'scoreValidation') {
    const policy = i.policy as { iteration?: number } | undefined;
    const iteration = policy?.iteration ?? -1;
    return typeof i.shard === 'number' ? { iteration, shard: i.shard } : { iteration };
  }
  if (activity === 'commitCheckpoint') {
    const staged = i.staged as { iteration?: number } | undefined;
    return { iteration: staged?.iteration ?? -1 };
  }
  const iteration = typeof i.iteration === 'number' ? i.iteration : -1;
  return typeof i.shard === 'number' ? { iteration, shard: i.shard } : { iteration };
}

/** A pause or resume signal as the history records it. */
export interface SignalRecord {
  name: 'pause' | 'resume';
  at: number;
  reason: string;
}

const closedAs: [string, NonNullable<RunSpan['closedAs']>][] = [
  ['workflowExecutionContinuedAsNewEventAttributes', 'continued-as-new'],
  ['workflowExecutionCompletedEventAttributes', 'completed'],
  ['workflowExecutionFailedEventAttributes', 'failed'],
  ['workflowExecutionCanceledEventAttributes', 'cancelled'],
  ['workflowExecutionTerminatedEventAttributes', 'terminated'],
  ['workflowExecutionTimedOutEventAttributes', 'timed out'],
];

/** Activity records, accepted hyperparameter changes and signals of one run, from its events. */
export function readRunEvents(
  runId: string,
  events: readonly HistoryEvent[],
): {
  activities: ActivityRecord[];
  changes: HyperparameterChange[];
  continuedFrom: string | null;
  signals: SignalRecord[];
  span: RunSpan;
  input: CampaignInput | undefined;
} {
  const byEventId = new Map<string, ActivityRecord>();
  const activities: ActivityRecord[] = [];
  const changes: HyperparameterChange[] = [];
  const signals: SignalRecord[] = [];
  let continuedFrom: string | null = null;
  let input: CampaignInput | undefined;
  const span: RunSpan = { runId, startedAt: '', lastEventAt: '', closedAs: null };
  const close = (
    scheduledEventId: unknown,
    at: number,
    outcome: ActivityRecord['outcome'],
    failure?: ProtoFailure,
  ) => {
    const record = byEventId.get(String(scheduledEventId));
    if (!record) return;
    record.closedAt = at;
    record.outcome = outcome;
    if (failure) record.failures.push(`attempt ${record.attempts}: ${failureText(failure)}`);
    if (isHeartbeatTimeout(failure)) record.heartbeatTimeouts++;
  };
  for (const event of events) {
    const at = timestampMs(event.eventTime);
    if (!span.startedAt) span.startedAt = new Date(at).toISOString();
    span.lastEventAt = new Date(at).toISOString();
    for (const [field, how] of closedAs) if (event[field as keyof HistoryEvent]) span.closedAs = how;
    if (event.workflowExecutionStartedEventAttributes) {
      continuedFrom = event.workflowExecutionStartedEventAttributes.continuedExecutionRunId || null;
      input = decodePayloads<CampaignInput>(event.workflowExecutionStartedEventAttributes.input);
    } else if (event.workflowExecutionSignaledEventAttributes) {
      const a = event.workflowExecutionSignaledEventAttributes;
      if (a.signalName === 'pause' || a.signalName === 'resume')
        signals.push({
          name: a.signalName,
          at,
          reason: decodePayloads<{ reason?: string }>(a.input)?.reason ?? '',
        });
    } else if (event.activityTaskScheduledEventAttributes) {
      const a = event.activityTaskScheduledEventAttributes;
      const activity = a.activityType?.name as keyof CampaignActivities;
      if (!(activity in stageOfActivity)) continue;
      const record: ActivityRecord = {
        activityId: a.activityId ?? '',
        activity,
        stage: stageOfActivity[activity],
        ...iterationOf(activity, decodePayloads(a.input)),
        runId,
        scheduledAt: at,
        startedAt: null,
        closedAt: null,
        outcome: 'running',
        attempts: 1,
        failures: [],
        heartbeatTimeouts: 0,
        result: undefined,
      };
      byEventId.set(String(event.eventId), record);
      activities.push(record);
    } else if (event.activityTaskStartedEventAttributes) {
      // Written when the activity closes: `attempt` is the last one, `lastFailure` the one before.
      const a = event.activityTaskStartedEventAttributes;
      const record = byEventId.get(String(a.scheduledEventId));
      if (!record) continue;
      record.attempts = a.attempt ?? 1;
      record.startedAt = at;
      if (a.lastFailure)
        record.failures.push(`attempt ${record.attempts - 1}: ${failureText(a.lastFailure)}`);
      if (isHeartbeatTimeout(a.lastFailure)) record.heartbeatTimeouts++;
    } else if (event.activityTaskCompletedEventAttributes) {
      const a = event.activityTaskCompletedEventAttributes;
      close(a.scheduledEventId, at, 'completed');
      const record = byEventId.get(String(a.scheduledEventId));
      if (record) record.result = decodePayloads(a.result);
    } else if (event.activityTaskFailedEventAttributes) {
      const a = event.activityTaskFailedEventAttributes;
      close(a.scheduledEventId, at, 'failed', a.failure);
    } else if (event.activityTaskTimedOutEventAttributes) {
      const a = event.activityTaskTimedOutEventAttributes;
      close(a.scheduledEventId, at, 'timed out', a.failure);
    } else if (event.activityTaskCanceledEventAttributes) {
      close(event.activityTaskCanceledEventAttributes.scheduledEventId, at, 'cancelled');
    } else if (event.workflowExecutionUpdateCompletedEventAttributes) {
      const change = decodePayloads<HyperparameterChange>(
        event.workflowExecutionUpdateCompletedEventAttributes.outcome?.success,
      );
      if (change && typeof change.iteration === 'number') changes.push(change);
    }
  }
  return { activities, changes, continuedFrom, signals, span, input };
}

/** What the server says about activities of the current run that are still open (retrying). */
export interface PendingActivity {
  activityId: string;
  attempt: number;
  lastFailure: ProtoFailure | undefined;
}

/** Folds activity records (all runs) into one record per iteration, ascending. */
export function iterationsFrom(
  activities: readonly ActivityRecord[],
  changes: readonly HyperparameterChange[],
): IterationHistory[] {
  const byIteration = new Map<number, ActivityRecord[]>();
  for (const a of activities) {
    if (a.iteration < 0) continue;
    byIteration.set(a.iteration, [...(byIteration.get(a.iteration) ?? []), a]);
  }
  return [...byIteration.keys()]
    .sort((x, y) => x - y)
    .map((iteration) => {
      const records = byIteration.get(iteration) ?? [];
      const stages: Partial<Record<StageName, StageHistory>> = {};
      for (const stage of stageNames) {
        const rs = records.filter((r) => r.stage === stage);
        if (rs.length === 0) continue;
        const running = rs.some((r) => r.closedAt === null);
        // A stage that failed for good and was resumed is scheduled again: attempts add up per shard.
        const attemptsBySlot = new Map<string, number>();
        for (const r of rs)
          attemptsBySlot.set(String(r.shard), (attemptsBySlot.get(String(r.shard)) ?? 0) + r.attempts);
        stages[stage] = {
          seconds: running
            ? null
            : (Math.max(...rs.map((r) => r.closedAt ?? 0)) - Math.min(...rs.map((r) => r.scheduledAt))) /
              1000,
          attempts: Math.max(...attemptsBySlot.values()),
          activities: rs.length,
          failures: rs.flatMap((r) =>
            r.failures.map((f) => (r.shard === undefined ? f : `shard ${r.shard} ${f}`)),
          ),
          running,
        };
      }
      const reward = records
        .filter((r) => r.activity === 'computeRewards' && r.outcome === 'completed')
        .pop();
      const commit = records
        .filter((r) => r.activity === 'commitCheckpoint' && r.outcome === 'completed')
        .pop();
      const update = records.filter((r) => r.activity === 'updatePolicy' && r.outcome === 'completed').pop();
      const validation = records
        .filter((r) => r.activity === 'scoreValidation' && r.outcome === 'completed')
        .pop()?.result as ValidationOutput | undefined;
      const rollout = rolloutFigures(records);
      return {
        iteration,
        stages,
        meanReward: (reward?.result as RewardOutput | undefined)?.meanReward ?? null,
        checkpoint: (commit?.result as CheckpointOutput | undefined)?.checkpoint.key ?? null,
        hyperparameterChanges: changes.filter((c) => c.iteration === iteration),
        passRate: (reward?.result as RewardOutput | undefined)?.passRate ?? null,
        rewardFailures: rewardFailures(reward?.result as RewardOutput | undefined),
        ...rollout,
        trainMetrics: (update?.result as UpdateOutput | undefined)?.metrics ?? null,
        validation: validation ? validationSummary(validation) : null,
      };
    });
}

function validationSummary({ attempt: _attempt, ...summary }: ValidationOutput): ValidationSummary {
  return summary;
}

function rewardFailures(reward: RewardOutput | undefined): IterationHistory['rewardFailures'] {
  if (!reward?.failedSamples) return null;
  return { samples: reward.failedSamples, byReason: reward.failuresByReason ?? {} };
}

/**
 * Rollout figures of an iteration, summed over its shards: the last completed activity of each
 * shard (a rollout phase run again after a failed reward schedules every shard again).
 */
function rolloutFigures(records: readonly ActivityRecord[]) {
  const byShard = new Map<number, RolloutShardOutput>();
  for (const r of records)
    if (r.activity === 'rolloutShard' && r.outcome === 'completed' && r.result)
      byShard.set(r.shard ?? 0, r.result as RolloutShardOutput);
  const shards = [...byShard.values()];
  const open = records.some((r) => r.activity === 'rolloutShard' && r.closedAt === null);
  const sum = (f: (s: RolloutShardOutput) => number) =>
    shards.length === 0 || open ? null : shards.reduce((acc, s) => acc + (f(s) ?? 0), 0);
  return {
    samples: sum((s) => s.samples),
    tokens: sum((s) => s.tokens),
    rolloutTokensPerSecond: sum((s) => s.tokensPerSecond),
    chunksRedone: sum((s) => s.chunksRedone),
    episodes:
      open || !shards.some((s) => s.episodes)
        ? null
        : shards.reduce(
            (acc, s) => (s.episodes ? addEpisodeStats(acc, s.episodes) : acc),
            emptyEpisodeStats(),
          ),
  };
}

async function fetchRun(
  client: Client,
  id: string,
  runId?: string,
): Promise<{ runId: string; events: HistoryEvent[] }> {
  const handle = client.workflow.getHandle(id, runId);
  try {
    const history = await handle.fetchHistory();
    const events = history.events ?? [];
    const resolved = runId ?? (await handle.describe()).runId;
    return { runId: resolved, events };
  } catch (err) {
    if (isNotFound(err)) throw notFound(client, id);
    throw err;
  }
}

/**
 * Walks the campaign's runs from the latest back through each WorkflowExecutionStarted's
 * continuedExecutionRunId, newest first, calling `visit` until it returns false.
 */
export async function walkRuns(
  client: Client,
  id: string,
  visit: (run: { runId: string; events: HistoryEvent[] }) => boolean,
): Promise<void> {
  let runId: string | undefined;
  for (;;) {
    const run = await fetchRun(client, id, runId);
    if (!visit(run)) return;
    const started = run.events[0]?.workflowExecutionStartedEventAttributes;
    const previous = started?.continuedExecutionRunId;
    if (!previous) return;
    runId = previous;
  }
}

/** Everything the histories of all runs record, oldest run first, before folding per iteration. */
export interface CampaignRecords {
  campaignId: string;
  runSpans: RunSpan[];
  activities: ActivityRecord[];
  changes: HyperparameterChange[];
  signals: SignalRecord[];
  /** The first run's input: the spec as started, and the checkpoint a fork started from. */
  input: CampaignInput | undefined;
}

/** Pause signals paired with the resume that followed each (repeated pauses fold into one). */
export function pausesFrom(signals: readonly SignalRecord[]): PauseRecord[] {
  const pauses: PauseRecord[] = [];
  for (const s of signals) {
    const open = pauses.at(-1)?.resumedAt === null ? pauses.at(-1) : undefined;
    if (s.name === 'pause' && !open)
      pauses.push({ requestedAt: new Date(s.at).toISOString(), reason: s.reason, resumedAt: null });
    else if (s.name === 'resume' && open) open.resumedAt = new Date(s.at).toISOString();
  }
  return pauses;
}

/** Every run's records, with what the server knows of activities still retrying. */
export async function readCampaignRecords(client: Client, id: string): Promise<CampaignRecords> {
  const runs: { runId: string; events: HistoryEvent[] }[] = [];
  await walkRuns(client, id, (run) => (runs.unshift(run), true));
  const activities: ActivityRecord[] = [];
  const changes: HyperparameterChange[] = [];
  const signals: SignalRecord[] = [];
  const runSpans: RunSpan[] = [];
  let input: CampaignInput | undefined;
  for (const run of runs) {
    const read = readRunEvents(run.runId, run.events);
    activities.push(...read.activities);
    changes.push(...read.changes);
    signals.push(...read.signals);
    runSpans.push(read.span);
    input ??= read.input;
  }
  // Activities still retrying in the latest run: the server knows their attempt and last failure.
  const latest = runs[runs.length - 1];
  if (latest) {
    const description = await client.workflow.getHandle(id, latest.runId).describe();
    const pending = (description.raw.pendingActivities ?? []).map((p): PendingActivity => ({
      activityId: p.activityId ?? '',
      attempt: p.attempt ?? 1,
      lastFailure: p.lastFailure,
    }));
    for (const p of pending) {
      const record = activities.find(
        (a) => a.runId === latest.runId && a.activityId === p.activityId && !a.closedAt,
      );
      if (!record) continue;
      record.attempts = p.attempt;
      if (p.lastFailure) record.failures.push(`attempt ${p.attempt - 1}: ${failureText(p.lastFailure)}`);
      if (isHeartbeatTimeout(p.lastFailure)) record.heartbeatTimeouts++;
    }
  }
  return { campaignId: id, runSpans, activities, changes, signals, input };
}

export function historyFromRecords(records: CampaignRecords): CampaignHistory {
  return {
    campaignId: records.campaignId,
    runs: records.runSpans.map((r) => r.runId),
    runSpans: records.runSpans,
    iterations: iterationsFrom(records.activities, records.changes),
    hyperparameterChanges: records.changes,
    pauses: pausesFrom(records.signals),
  };
}

/** The whole campaign history, folded per iteration. */
export async function readCampaignHistory(client: Client, id: string): Promise<CampaignHistory> {
  return historyFromRecords(await readCampaignRecords(client, id));
}

/** The last checkpoint committed in the campaign's history (newest run first), or null. */
export async function lastCommittedCheckpoint(
  client: Client,
  id: string,
): Promise<CheckpointOutput['checkpoint'] | null> {
  let found: CheckpointOutput['checkpoint'] | null = null;
  await walkRuns(client, id, (run) => {
    const commits = readRunEvents(run.runId, run.events).activities.filter(
      (a) => a.activity === 'commitCheckpoint' && a.outcome === 'completed',
    );
    found = (commits.pop()?.result as CheckpointOutput | undefined)?.checkpoint ?? null;
    return found === null;
  });
  return found;
}
