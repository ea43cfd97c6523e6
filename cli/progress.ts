// Live progress of a campaign, shared by `moerl demo` and `moerl watch`: one poll loop (describe
// for the execution status and the server's attempts, then the status query) and one rendering
// of what it sees: a line per finished iteration and a live line for what is in flight.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client, WorkflowExecutionDescription } from '@temporalio/client';
import { printable } from '../activities/printable.js';
import { stageOfActivity } from '../activities/types.js';
import type { CampaignActivities, EpisodeStats, RolloutHeartbeat } from '../activities/types.js';
import type {
  CampaignState,
  DynamicSamplingSummary,
  IterationSummary,
  StageName,
} from '../workflows/types.js';
import { stageNames } from '../workflows/types.js';
import { describeCampaign, executionStatus, queryState, type CampaignMemo } from './campaigns.js';
import { reasonOf } from './command.js';
import { decimal, seconds } from './format.js';
import { decodePayloads, failureText } from './history.js';

/** The stages of every iteration (prepare runs once, before the first; validation beside the loop). */
export const iterationStages = stageNames.filter((s) => s !== 'prepare' && s !== 'validation');

export interface InFlightStage {
  iteration: number;
  stage: StageName;
  since: string;
  /** Activities of the stage still running (a rollout's shards). */
  activities: number;
  /** The highest attempt the server reports for the stage's activities (1 = first try). */
  attempt: number;
  lastFailure: string | null;
  /** What its shards' heartbeats say (rollout and validation), in the order the server lists them. */
  shards: ShardProgress[];
}

/** A shard's progress from its latest heartbeat. */
export interface ShardProgress {
  what: string;
  chunksStored: number;
  chunks: number;
  inChunk: RolloutHeartbeat['inChunk'] | null;
}

/** Shards whose progress the live line spells out; the others are counted. */
const shardsShown = 3;

/** What `moerl watch --json` prints, one per change. */
export interface ProgressSnapshot {
  campaignId: string;
  /** The campaign's own status (running, pausing, paused, completed, cancelled). */
  status: string;
  /** The workflow execution's: running while the campaign runs, then how it ended. */
  execution: string;
  pauseReason: string | null;
  committedIteration: number;
  totalIterations: number | null;
  inFlight: InFlightStage[];
  last: { iteration: number; meanReward: number; rolloutTokensPerSecond: number } | null;
  /** Estimated seconds to the last iteration from the recent iterations' stage times. */
  etaSeconds: number | null;
}

export function progressBar(done: number, total: number, width = 24): string {
  const filled = Math.min(width, Math.max(0, Math.round((width * done) / Math.max(1, total))));
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

/**
 * Seconds per iteration from the recent ones: the sum of the stages, or with staleness 1 or more
 * (the next rollouts run during the update) the longer of rollout + reward and update + checkpoint.
 */
export function etaSeconds(state: CampaignState, total: number, staleness: number): number | null {
  const recent = state.recentIterations;
  if (recent.length === 0 || state.status !== 'running') return null;
  const wall = (it: IterationSummary) => {
    const s = (k: StageName) => it.stageSeconds[k] ?? 0;
    const sampling = s('rollout') + s('reward');
    const training = s('update') + s('checkpoint');
    return staleness >= 1 ? Math.max(sampling, training) : sampling + training;
  };
  const perIteration = recent.reduce((sum, it) => sum + wall(it), 0) / recent.length;
  return Math.max(0, total - Math.max(0, state.committedIteration)) * perIteration;
}

export function snapshotOf(
  state: CampaignState,
  description: WorkflowExecutionDescription,
  spec: { iterations: number; staleness: number } | undefined,
): ProgressSnapshot {
  const pending = description.raw?.pendingActivities ?? [];
  const inFlight = new Map<string, InFlightStage>();
  for (const a of state.activeStages) {
    const key = `${a.iteration}/${a.stage}`;
    const seen = inFlight.get(key);
    if (seen) seen.activities++;
    else
      inFlight.set(key, {
        iteration: a.iteration,
        stage: a.stage,
        since: a.startedAt,
        activities: 1,
        attempt: 1,
        lastFailure: null,
        shards: [],
      });
  }
  // Pending activities carry no iteration, but a stage runs for one iteration at a time.
  for (const p of pending) {
    const stage = stageOfActivity[p.activityType?.name as keyof CampaignActivities] as StageName | undefined;
    const target = [...inFlight.values()].find((s) => s.stage === stage);
    if (!target) continue;
    const beat = decodePayloads<Partial<RolloutHeartbeat>>(p.heartbeatDetails);
    if (beat && typeof beat.what === 'string' && typeof beat.chunks === 'number')
      target.shards.push({
        what: beat.what,
        chunksStored: beat.chunksStored ?? 0,
        chunks: beat.chunks,
        inChunk: beat.inChunk ?? null,
      });
    const attempt = p.attempt ?? 1;
    if (attempt >= target.attempt) {
      target.attempt = attempt;
      if (p.lastFailure) target.lastFailure = failureText(p.lastFailure);
    }
  }
  const last = state.recentIterations.at(-1);
  return {
    campaignId: state.campaignId,
    status: state.status,
    execution: executionStatus(description),
    pauseReason: state.status === 'paused' || state.status === 'pausing' ? state.pauseReason : null,
    committedIteration: state.committedIteration,
    totalIterations: spec?.iterations ?? null,
    inFlight: [...inFlight.values()].sort((a, b) => a.iteration - b.iteration),
    last: last
      ? {
          iteration: last.iteration,
          meanReward: last.meanReward,
          rolloutTokensPerSecond: last.rolloutTokensPerSecond,
        }
      : null,
    etaSeconds: spec ? etaSeconds(state, spec.iterations, state.staleness ?? spec.staleness) : null,
  };
}

/** The demo's and watch's line for a finished iteration. */
export function iterationLine(it: IterationSummary, total: number): string {
  return (
    `${progressBar(it.iteration, total)} iteration ${String(it.iteration).padStart(3)}/${total}  reward ${decimal(it.meanReward)}  rollout ${Math.round(it.rolloutTokensPerSecond)} tok/s  ` +
    iterationStages.map((s) => `${s} ${seconds(it.stageSeconds[s])}`).join('  ') +
    (it.episodes ? `  ${episodesText(it.episodes)}` : '') +
    (it.dynamicSampling ? `  ${dynamicSamplingText(it.dynamicSampling)}` : '')
  );
}

/** "drew 64 more prompts in 2 rounds, 57 groups with signal, 71 filtered". */
export function dynamicSamplingText(d: DynamicSamplingSummary): string {
  const drew =
    d.rounds > 0
      ? `drew ${d.drawnPrompts} more prompts in ${d.rounds} round${d.rounds > 1 ? 's' : ''}, `
      : '';
  return `${drew}${d.groupsWithSignal} groups with signal, ${d.filteredGroups} filtered`;
}

/** "64 episodes, 2.3 turns each, 3 tool errors, tools 21% of their time". */
export function episodesText(e: EpisodeStats): string {
  const turns = e.episodes > 0 ? e.policyTurns / e.episodes : 0;
  const errors = Object.values(e.toolErrors).reduce((a, b) => a + b, 0);
  const waited = e.toolSeconds + e.generationSeconds;
  const share = waited > 0 ? `, tools ${Math.round((100 * e.toolSeconds) / waited)}% of their time` : '';
  return `${e.episodes} episodes, ${turns.toFixed(1)} turns each, ${errors} tool errors${share}`;
}

/** What is in flight: "rollout 4 (2 shards), update 3 attempt 2", or the pause and its reason. */
export function inFlightText(snap: ProgressSnapshot): string {
  if (snap.status === 'paused' || snap.status === 'pausing') {
    const waiting = snap.status === 'pausing' ? ` (waiting for ${stagesText(snap)})` : '';
    return `${snap.status}: ${snap.pauseReason ?? 'paused'}${waiting}`;
  }
  return stagesText(snap);
}

function stagesText(snap: ProgressSnapshot): string {
  return snap.inFlight
    .map((s) => {
      const shards = s.stage === 'rollout' && s.activities > 1 ? ` (${s.activities} shards)` : '';
      const attempt = s.attempt > 1 ? ` attempt ${s.attempt}` : '';
      const failure = s.lastFailure ? ` (last failure: ${s.lastFailure})` : '';
      const shown = s.shards.slice(0, shardsShown).map(shardText);
      if (s.shards.length > shardsShown) shown.push(`${s.shards.length - shardsShown} more`);
      const progress = shown.length > 0 ? ` [${shown.join('; ')}]` : '';
      return `${s.stage} ${s.iteration}${shards}${attempt}${failure}${progress}`;
    })
    .join(', ');
}

/** "rollout of iteration 12 shard 3: chunk 2/8, 41/64 episodes, turn 3" from its heartbeat. */
export function shardText(p: ShardProgress): string {
  const c = p.inChunk;
  if (!c) return `${p.what}: ${p.chunksStored}/${p.chunks} chunks`;
  const samples =
    c.turn !== undefined ? `${c.step}/${c.steps} episodes, turn ${c.turn}` : `${c.step}/${c.steps}`;
  return `${p.what}: chunk ${c.chunk + 1}/${p.chunks}, ${samples}`;
}

/** The live line: bar, committed/total, what is in flight, last reward and tokens/s, ETA. */
export function progressLine(snap: ProgressSnapshot): string {
  const total = snap.totalIterations;
  const committed = Math.max(0, snap.committedIteration);
  const parts = [
    total === null ? `${committed} committed` : `${progressBar(committed, total)} ${committed}/${total}`,
  ];
  const inFlight = inFlightText(snap);
  if (snap.execution !== 'running') parts.push(snap.execution);
  else if (inFlight) parts.push(inFlight);
  else parts.push(snap.status);
  if (snap.last)
    parts.push(
      `reward ${decimal(snap.last.meanReward)}`,
      `${Math.round(snap.last.rolloutTokensPerSecond)} tok/s`,
    );
  if (snap.etaSeconds !== null && snap.execution === 'running') parts.push(`ETA ${seconds(snap.etaSeconds)}`);
  // A pause reason and a last failure are others' text: no control character reaches the terminal.
  return parts.map(printable).join('  ');
}

export interface FollowUpdate {
  snapshot: ProgressSnapshot;
  state: CampaignState;
  /** Iterations finished since the last update, oldest first. */
  newIterations: IterationSummary[];
}

export interface FollowOptions {
  intervalMs: number;
  signal?: AbortSignal;
  /** Called after every poll whose snapshot differs from the one before. */
  onChange(update: FollowUpdate): void;
  /** Stops following early when it returns an outcome (the demo stops at a pause needing an operator). */
  stopWhen?(state: CampaignState): string | null;
  /** Called when a poll's status query fails while the workflow runs (the loop goes on). */
  onQueryError?(message: string): void;
}

export interface FollowResult {
  /** "completed", or how the execution ended with its reason, or stopWhen's; null when aborted. */
  outcome: string | null;
  /** The execution status at the end: running (stopped early or aborted), completed, cancelled, ... */
  execution: string;
  state: CampaignState | null;
  /** Every iteration seen finishing, oldest first. */
  iterations: IterationSummary[];
}

/**
 * Polls a campaign until its workflow closes (across continue-as-new runs), `stopWhen` gives an
 * outcome, or `signal` aborts. A CliError names a campaign that does not exist.
 */
export async function followCampaign(client: Client, id: string, opts: FollowOptions): Promise<FollowResult> {
  const seen = new Map<number, IterationSummary>();
  let state: CampaignState | null = null;
  let lastJson = '';
  let execution = 'running';
  for (;;) {
    const { handle, description } = await describeCampaign(client, id);
    execution = executionStatus(description);
    // The latest run is briefly the one that continued as new: the next is about to start.
    const closed = execution !== 'running' && execution !== 'continued as new';
    try {
      state = await queryState(client, handle);
    } catch (err) {
      if (!closed) opts.onQueryError?.(reasonOf(err));
    }
    if (state && execution !== 'continued as new') {
      const memo = description.memo as Partial<CampaignMemo> | undefined;
      const snapshot = snapshotOf(state, description, memo?.spec);
      const newIterations = state.recentIterations.filter((it) => !seen.has(it.iteration));
      for (const it of newIterations) seen.set(it.iteration, it);
      const json = JSON.stringify(snapshot);
      if (json !== lastJson || newIterations.length > 0) opts.onChange({ snapshot, state, newIterations });
      lastJson = json;
    }
    const iterations = () => [...seen.values()].sort((a, b) => a.iteration - b.iteration);
    if (closed) {
      const reason =
        execution === 'completed'
          ? ''
          : await handle.result().then(
              () => '',
              (err: unknown) => `: ${reasonOf(err)}`,
            );
      return { outcome: `${execution}${reason}`, execution, state, iterations: iterations() };
    }
    const early = state && opts.stopWhen?.(state);
    if (early) return { outcome: early, execution, state, iterations: iterations() };
    if (opts.signal?.aborted) return { outcome: null, execution, state, iterations: iterations() };
    await sleep(opts.intervalMs, undefined, { signal: opts.signal }).catch(() => undefined);
    if (opts.signal?.aborted) return { outcome: null, execution, state, iterations: iterations() };
  }
}
