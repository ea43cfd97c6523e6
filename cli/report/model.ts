// The report's data: one row per iteration (from the history, plus the store's training
// metrics), the markers the charts draw (hyperparameter changes, pauses, workflow runs), a
// timeline of every activity, and the header. Pure: the same source gives the same report.
import type { EpisodeStats } from '../../activities/types.js';
import type { ActivityRecord, IterationHistory, PauseRecord, RunSpan } from '../history.js';
import { specSummary, type SpecSummary } from '../campaigns.js';
import { keyValues } from '../format.js';
import type { ReportSource, TrainStep } from './collect.js';

/** Per iteration: means over the update's optimizer steps, sums where a sum is the figure. */
export interface TrainFigures {
  steps: number;
  /** Completion tokens trained, summed over steps (an epoch trains them again). */
  tokens: number;
  seconds: number;
  epSeconds: number;
  epBytes: number;
  loss: number | null;
  policyLoss: number | null;
  kl: number | null;
  entropy: number | null;
  clipFrac: number | null;
  gradNorm: number | null;
  auxLoss: number | null;
  zLoss: number | null;
  /** KL(rollout || trainer) and the share of tokens whose TIS weight is truncated, of the
   * update's first step: the one trained at the weights the rollouts were sampled with. */
  mismatchKl: number | null;
  tisClipFrac: number | null;
  /** [layer][expert] share of the layer's (token, slot) picks, mean over steps; null if not recorded. */
  expertLoadLayers: number[][] | null;
}

export type LoopStage = 'rollout' | 'reward' | 'update' | 'checkpoint';
export const loopStages: readonly LoopStage[] = ['rollout', 'reward', 'update', 'checkpoint'];

export interface ReportIteration {
  iteration: number;
  /** 1-based index of the workflow run that scheduled the iteration's first activity. */
  run: number;
  meanReward: number | null;
  passRate: number | null;
  samples: number | null;
  tokens: number | null;
  rolloutTokensPerSecond: number | null;
  chunksRedone: number | null;
  /** An agentic campaign's episodes (turns, end reasons, tool calls and time); null without any. */
  episodes: EpisodeStats | null;
  stageSeconds: Record<LoopStage, number | null>;
  /** Span of the iteration (previous commit closed → its own commit closed) not in any stage. */
  waitingSeconds: number | null;
  /** Attempts beyond the first, summed over the iteration's activities. */
  retries: number;
  /** Failed attempts the history names (each one an interruption of the stage). */
  failures: number;
  heartbeatTimeouts: number;
  hyperparameterChanges: string[];
  train: TrainFigures | null;
}

export interface ReportPause extends PauseRecord {
  /** The iteration whose stage ran first after the resume (null while paused). */
  beforeIteration: number | null;
}

export interface ReportRun extends RunSpan {
  index: number;
  /** Lowest iteration an activity of this run belongs to (null: the run scheduled none). */
  firstIteration: number | null;
}

export interface TimelineItem {
  stage: string;
  iteration: number;
  shard: number | null;
  /** Seconds since the campaign started. */
  start: number;
  end: number;
  attempts: number;
  outcome: ActivityRecord['outcome'];
}

export interface ReportHeader {
  campaignId: string;
  spec: SpecSummary;
  hyperparameters: string;
  forkedFrom: { campaignId: string; iteration: number } | null;
  status: string;
  startedAt: string;
  endedAt: string | null;
  wallSeconds: number;
  runs: number;
  checkpointsKept: { iteration: number; key: string; meanReward: number | null }[];
  store: string;
  temporalUi: string | null;
}

/** One validated checkpoint's scores on one data_source ("all" for every prompt). */
export interface ReportValidation {
  iteration: number;
  dataSource: string;
  meanReward: number;
  passAtK: number;
  k: number;
}

export interface ReportModel {
  header: ReportHeader;
  iterations: ReportIteration[];
  /** Validated checkpoints (the initial policy's included), all prompts first, then per data_source. */
  validations: ReportValidation[];
  hyperparameterChanges: { iteration: number; label: string; reason: string; at: string }[];
  pauses: ReportPause[];
  runs: ReportRun[];
  timeline: TimelineItem[];
  /** Figures the sources do not hold, said once each instead of drawn as zeros. */
  absent: string[];
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const mean = (xs: (number | null)[]): number | null => {
  const vs = xs.filter((x): x is number => x !== null);
  return vs.length ? vs.reduce((a, b) => a + b, 0) / vs.length : null;
};

export function trainFigures(steps: readonly TrainStep[]): TrainFigures | null {
  if (steps.length === 0) return null;
  const sum = (k: string) => steps.reduce((acc, s) => acc + (num(s[k]) ?? 0), 0);
  const avg = (k: string) => mean(steps.map((s) => num(s[k])));
  const layers = steps.map((s) => s.expert_load_layers).filter((l): l is number[][] => Array.isArray(l));
  let expertLoadLayers: number[][] | null = null;
  if (layers.length === steps.length && layers[0] && layers[0].length > 0)
    expertLoadLayers = layers[0].map((row, l) =>
      row.map((_, e) => layers.reduce((acc, step) => acc + (num(step[l]?.[e]) ?? 0), 0) / layers.length),
    );
  return {
    steps: steps.length,
    tokens: sum('tokens'),
    seconds: sum('seconds'),
    epSeconds: sum('ep_seconds'),
    epBytes: sum('ep_bytes'),
    loss: avg('loss'),
    policyLoss: avg('policy_loss'),
    kl: avg('kl'),
    entropy: avg('entropy'),
    clipFrac: avg('clip_frac'),
    gradNorm: avg('grad_norm'),
    auxLoss: avg('aux_loss'),
    zLoss: avg('z_loss'),
    mismatchKl: num(steps[0]?.mismatch_kl),
    tisClipFrac: num(steps[0]?.tis_clip_frac),
    expertLoadLayers,
  };
}

/** Checkpoints committed and not removed by a later commit's retention, in iteration order. */
function checkpointsKept(activities: readonly ActivityRecord[]): ReportHeader['checkpointsKept'] {
  const kept = new Map<string, ReportHeader['checkpointsKept'][number]>();
  for (const a of [...activities].sort((x, y) => (x.closedAt ?? 0) - (y.closedAt ?? 0))) {
    if (a.activity !== 'commitCheckpoint' || a.outcome !== 'completed') continue;
    const out = a.result as {
      checkpoint: { iteration: number; key: string; meanReward: number | null };
      removed: string[];
    };
    for (const key of out.removed ?? []) kept.delete(key);
    const c = out.checkpoint;
    kept.set(c.key, { iteration: c.iteration, key: c.key, meanReward: c.meanReward });
  }
  return [...kept.values()].sort((x, y) => x.iteration - y.iteration);
}

const iso = (ms: number) => new Date(ms).toISOString();
const ms = (text: string) => new Date(text).getTime();

/** The campaign's wall time (ms): the first run's first event to the last run's last, or null while it runs. */
export function campaignWindow(source: ReportSource): { startedAt: number; endedAt: number | null } {
  const first = source.records.runSpans[0];
  const last = source.records.runSpans.at(-1);
  const ended = last?.closedAs && last.closedAs !== 'continued-as-new';
  return {
    startedAt: first ? ms(first.startedAt) : source.readAt,
    endedAt: ended && last ? ms(last.lastEventAt) : null,
  };
}

export function buildModel(source: ReportSource, temporalUi: string | null): ReportModel {
  const { records, history, spec } = source;
  const acts = records.activities;
  const { startedAt, endedAt } = campaignWindow(source);
  const last = records.runSpans.at(-1);
  const runIndex = new Map(records.runSpans.map((r, i) => [r.runId, i + 1]));

  const commitClosed = (iteration: number) =>
    acts.find(
      (a) => a.activity === 'commitCheckpoint' && a.iteration === iteration && a.outcome === 'completed',
    )?.closedAt ?? null;
  const iterations = history.iterations
    .filter((it) => it.iteration >= 1 && !it.stages.prepare)
    .map((it): ReportIteration => row(it));
  function row(it: IterationHistory): ReportIteration {
    const own = acts.filter((a) => a.iteration === it.iteration && a.stage !== 'prepare');
    const stageSeconds = Object.fromEntries(
      loopStages.map((s) => [s, it.stages[s]?.seconds ?? null]),
    ) as Record<LoopStage, number | null>;
    const end = commitClosed(it.iteration);
    const previous =
      commitClosed(it.iteration - 1) ?? Math.min(...own.map((a) => a.scheduledAt), Number.POSITIVE_INFINITY);
    const busy = loopStages.reduce((acc, s) => acc + (stageSeconds[s] ?? 0), 0);
    const span = end === null || !Number.isFinite(previous) ? null : (end - previous) / 1000;
    return {
      iteration: it.iteration,
      run: runIndex.get(own.sort((a, b) => a.scheduledAt - b.scheduledAt)[0]?.runId ?? '') ?? 0,
      meanReward: it.meanReward,
      passRate: it.passRate,
      samples: it.samples,
      tokens: it.tokens,
      rolloutTokensPerSecond: it.rolloutTokensPerSecond,
      chunksRedone: it.chunksRedone,
      episodes: it.episodes,
      stageSeconds,
      waitingSeconds: span === null ? null : Math.max(0, span - busy),
      retries: own.reduce((acc, a) => acc + a.attempts - 1, 0),
      failures: own.reduce((acc, a) => acc + a.failures.length, 0),
      heartbeatTimeouts: own.reduce((acc, a) => acc + a.heartbeatTimeouts, 0),
      hyperparameterChanges: it.hyperparameterChanges.map((c) => keyValues(c.changes)),
      train: trainFigures(source.trainSteps.get(it.iteration) ?? []),
    };
  }

  const pauses = history.pauses.map((p): ReportPause => {
    const resumed = p.resumedAt === null ? null : ms(p.resumedAt);
    const next =
      resumed === null
        ? undefined
        : acts.filter((a) => a.scheduledAt >= resumed).sort((a, b) => a.scheduledAt - b.scheduledAt)[0];
    return { ...p, beforeIteration: next?.iteration ?? null };
  });
  const runs = records.runSpans.map((r, i): ReportRun => {
    const its = acts.filter((a) => a.runId === r.runId).map((a) => a.iteration);
    return { ...r, index: i + 1, firstIteration: its.length ? Math.min(...its) : null };
  });
  const timeline = acts.map((a): TimelineItem => ({
    stage: a.stage,
    iteration: a.iteration,
    shard: a.shard ?? null,
    start: (a.scheduledAt - startedAt) / 1000,
    end: ((a.closedAt ?? endedAt ?? source.readAt) - startedAt) / 1000,
    attempts: a.attempts,
    outcome: a.outcome,
  }));

  const absent: string[] = [];
  if (source.metricsMissing.length)
    absent.push(
      `training metrics of iterations ${source.metricsMissing.join(', ')}: no metrics file in the store (${source.store})`,
    );
  if (source.updatesSkipped.length)
    absent.push(
      `training metrics of iterations ${source.updatesSkipped.join(', ')}: the update took no step (every group's rewards were equal)`,
    );
  const trained = iterations.filter((it) => it.train);
  if (trained.length && trained.every((it) => it.train?.expertLoadLayers === null))
    absent.push('expert load per layer: the trainer that ran these updates did not record it');
  const accounted = source.metricsMissing.length + source.updatesSkipped.length;
  if (iterations.length && iterations.every((it) => it.train === null) && !accounted)
    absent.push('training metrics: no update has completed yet');

  const forkFrom = records.input?.forkFrom;
  return {
    header: {
      campaignId: history.campaignId,
      spec: specSummary(spec),
      hyperparameters: keyValues(spec.hyperparameters),
      forkedFrom: forkFrom ? { campaignId: forkFrom.campaignId, iteration: forkFrom.iteration } : null,
      status: last?.closedAs && last.closedAs !== 'continued-as-new' ? last.closedAs : 'running',
      startedAt: iso(startedAt),
      endedAt: endedAt === null ? null : iso(endedAt),
      wallSeconds: ((endedAt ?? source.readAt) - startedAt) / 1000,
      runs: records.runSpans.length,
      checkpointsKept: checkpointsKept(acts),
      store: source.store,
      temporalUi,
    },
    iterations,
    validations: history.iterations.flatMap(({ validation: v }) =>
      v
        ? [
            {
              iteration: v.iteration,
              dataSource: 'all',
              meanReward: v.meanReward,
              passAtK: v.passAtK,
              k: v.k,
            },
            ...Object.entries(v.bySource).map(([dataSource, s]) => ({
              iteration: v.iteration,
              dataSource,
              meanReward: s.meanReward,
              passAtK: s.passAtK,
              k: v.k,
            })),
          ]
        : [],
    ),
    hyperparameterChanges: history.hyperparameterChanges.map((c) => ({
      iteration: c.iteration,
      label: keyValues(c.changes),
      reason: c.reason,
      at: c.at,
    })),
    pauses,
    runs,
    timeline,
    absent,
  };
}
