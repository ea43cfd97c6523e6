// Economics and utilisation of a campaign: how busy each pool was, what the campaign cost per
// million generated and trained tokens, what interruptions cost, and how update time splits
// into EP communication and compute. Every formula is written out in docs/report.md.
import type { ActivityRecord } from '../history.js';
import type { RolloutShardOutput } from '../../activities/types.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import type { FleetSamples } from './fleet.js';
import type { ReportModel } from './model.js';
import type { PoolPrice, Prices } from './prices.js';

export interface PoolFigures extends PoolPrice {
  /** Length of the union of the pool's stage intervals (scheduled → closed). */
  busySeconds: number;
  busyFraction: number | null;
  /** nodes × price × wall hours; null without a price. */
  cost: number | null;
}

/** The rollout fleet as Prometheus saw it (cli/report/fleet.ts), against the work it did. */
export interface FleetFigures {
  source: string;
  stepSeconds: number;
  /** Σ pods × step: node-seconds of the rollout pool, one worker pod per node. */
  podSeconds: number;
  /** Σ ranks × step: the moe_generate ranks the fleet offered. */
  rankSeconds: number;
  meanPods: number;
  peakPods: number;
  /** Σ over the rollout pool's activities of (close − start) × the ranks each holds. */
  busyRankSeconds: number;
  /** busyRankSeconds ÷ rankSeconds; null when the fleet offered none. */
  busyFraction: number | null;
  /** podSeconds / 3600 × the rollout price; null without a price. */
  cost: number | null;
}

export interface InterruptionFigures {
  chunksRedone: number;
  /** Estimated: chunks redone × seconds per chunk of the same iteration's uninterrupted shards. */
  redoneChunkSeconds: number;
  /** Scheduled → start of the attempt that succeeded, for activities that needed more than one. */
  retryDelaySeconds: number;
  /** Part of the retry delays spent waiting for heartbeat timeouts (observed timeouts × timeout). */
  heartbeatWaitSeconds: number;
  /** Whole duration of activities that failed for good (the campaign paused, the stage ran again). */
  failedStageSeconds: number;
  lostSeconds: { rollout: number; train: number; control: number; total: number };
  lostCost: number | null;
}

export interface Economics {
  currency: string;
  wallSeconds: number;
  pools: {
    rollout: PoolFigures;
    train: PoolFigures;
    control: { busySeconds: number; busyFraction: number | null };
  };
  /** With `moerl report --prometheus`: the fleet measured; its cost replaces the rollout pool's below. */
  fleet: FleetFigures | null;
  totalCost: number | null;
  generatedTokens: number;
  trainedTokens: number | null;
  costPerMillionGeneratedTokens: number | null;
  rolloutCostPerMillionGeneratedTokens: number | null;
  costPerMillionTrainedTokens: number | null;
  trainCostPerMillionTrainedTokens: number | null;
  interruptions: InterruptionFigures;
  update: {
    seconds: number;
    epSeconds: number;
    computeSeconds: number;
    epShare: number | null;
    computeShare: number | null;
    epBytes: number;
  } | null;
}

type Pool = 'rollout' | 'train' | 'control';
const poolOf: Record<ActivityRecord['activity'], Pool> = {
  rolloutShard: 'rollout',
  computeRewards: 'rollout',
  validationShard: 'rollout',
  scoreValidation: 'rollout',
  prepareInputs: 'rollout',
  preparePolicy: 'train',
  updatePolicy: 'train',
  exportPolicy: 'train',
  commitCheckpoint: 'control',
};

/** Total length of the union of intervals [start, end] (ms), in seconds. */
export function unionSeconds(intervals: readonly [number, number][]): number {
  const sorted = [...intervals].filter(([a, b]) => b > a).sort((x, y) => x[0] - y[0]);
  let total = 0;
  let [from, to] = [Number.NEGATIVE_INFINITY, Number.NEGATIVE_INFINITY];
  for (const [a, b] of sorted) {
    if (a > to) {
      if (to > from) total += to - from;
      [from, to] = [a, b];
    } else to = Math.max(to, b);
  }
  if (to > from) total += to - from;
  return total / 1000;
}

const perMillion = (cost: number | null, tokens: number | null) =>
  cost === null || tokens === null || tokens <= 0 ? null : cost / (tokens / 1e6);

/**
 * The measured fleet against the ranks the rollout pool's activities held while they ran: a
 * shard its rolloutEpWorldSize, any other rollout-queue activity one (as workers/demand.ts
 * counts the demand).
 */
function fleetFigures(
  samples: FleetSamples,
  activities: readonly ActivityRecord[],
  spec: CampaignSpec,
  price: number | null,
  readAt: number,
): FleetFigures {
  const step = samples.stepSeconds;
  const podSeconds = samples.pods.reduce((s, x) => s + x, 0) * step;
  const rankSeconds = samples.ranks.reduce((s, x) => s + x, 0) * step;
  let busyRankSeconds = 0;
  for (const a of activities) {
    if (poolOf[a.activity] !== 'rollout' || a.startedAt === null) continue;
    const ranks = a.activity === 'rolloutShard' ? spec.rolloutEpWorldSize : 1;
    busyRankSeconds += (Math.max(0, (a.closedAt ?? readAt) - a.startedAt) / 1000) * ranks;
  }
  return {
    source: samples.source,
    stepSeconds: step,
    podSeconds,
    rankSeconds,
    meanPods: samples.pods.length ? podSeconds / step / samples.pods.length : 0,
    peakPods: Math.max(0, ...samples.pods),
    busyRankSeconds,
    busyFraction: rankSeconds > 0 ? busyRankSeconds / rankSeconds : null,
    cost: price === null ? null : (podSeconds / 3600) * price,
  };
}

/** Seconds one chunk took in shards that were not interrupted, per iteration (mean). */
function chunkSeconds(activities: readonly ActivityRecord[]): Map<number, number> {
  const per = new Map<number, number[]>();
  for (const a of activities) {
    const out = a.result as RolloutShardOutput | undefined;
    if (a.activity !== 'rolloutShard' || a.outcome !== 'completed' || !out || a.attempts > 1) continue;
    if (!(out.tokensPerSecond > 0) || !(out.chunks > 0)) continue;
    per.set(a.iteration, [...(per.get(a.iteration) ?? []), out.tokens / out.tokensPerSecond / out.chunks]);
  }
  return new Map([...per].map(([i, xs]) => [i, xs.reduce((s, x) => s + x, 0) / xs.length]));
}

export function economics(
  model: ReportModel,
  activities: readonly ActivityRecord[],
  spec: CampaignSpec,
  prices: Prices,
  readAt: number,
  fleetSamples: FleetSamples | null = null,
): Economics {
  const wall = model.header.wallSeconds;
  const end = (a: ActivityRecord) => a.closedAt ?? readAt;
  const busy = (pool: Pool) =>
    unionSeconds(activities.filter((a) => poolOf[a.activity] === pool).map((a) => [a.scheduledAt, end(a)]));
  const fraction = (s: number) => (wall > 0 ? s / wall : null);
  const pool = (name: 'rollout' | 'train'): PoolFigures => {
    const p = prices[name];
    const busySeconds = busy(name);
    return {
      ...p,
      busySeconds,
      busyFraction: fraction(busySeconds),
      cost: p.nodeHourPrice === null ? null : p.nodes * p.nodeHourPrice * (wall / 3600),
    };
  };
  const rollout = pool('rollout');
  const train = pool('train');
  const control = busy('control');
  const fleet = fleetSamples
    ? fleetFigures(fleetSamples, activities, spec, prices.rollout.nodeHourPrice, readAt)
    : null;
  const rolloutCost = fleet ? fleet.cost : rollout.cost;
  const totalCost = rolloutCost === null || train.cost === null ? null : rolloutCost + train.cost;

  const generatedTokens = model.iterations.reduce((s, it) => s + (it.tokens ?? 0), 0);
  const trained = model.iterations.filter((it) => it.train);
  const trainedTokens = trained.length ? trained.reduce((s, it) => s + (it.train?.tokens ?? 0), 0) : null;

  // Interruptions: every second below is node time spent on work that was thrown away or waited.
  const heartbeat = {
    rollout: spec.orchestration.rolloutHeartbeatSeconds,
    train: spec.orchestration.updateHeartbeatSeconds,
    control: 0,
  };
  const lost = { rollout: 0, train: 0, control: 0, total: 0 };
  let retryDelaySeconds = 0;
  let heartbeatWaitSeconds = 0;
  let failedStageSeconds = 0;
  let redoneChunkSeconds = 0;
  let chunksRedone = 0;
  const perChunk = chunkSeconds(activities);
  const campaignPerChunk = perChunk.size
    ? [...perChunk.values()].reduce((s, x) => s + x, 0) / perChunk.size
    : 0;
  for (const a of activities) {
    const p = poolOf[a.activity];
    let seconds = 0;
    if (a.attempts > 1 && a.startedAt !== null) {
      const delay = Math.max(0, (a.startedAt - a.scheduledAt) / 1000);
      retryDelaySeconds += delay;
      heartbeatWaitSeconds += Math.min(delay, a.heartbeatTimeouts * heartbeat[p]);
      seconds += delay;
    }
    if (a.outcome === 'failed' || a.outcome === 'timed out') {
      const d = (end(a) - a.scheduledAt) / 1000;
      failedStageSeconds += d;
      seconds += d;
    }
    const out = a.result as RolloutShardOutput | undefined;
    if (a.activity === 'rolloutShard' && a.outcome === 'completed' && out?.chunksRedone) {
      const redone = out.chunksRedone * (perChunk.get(a.iteration) ?? campaignPerChunk);
      chunksRedone += out.chunksRedone;
      redoneChunkSeconds += redone;
      seconds += redone;
    }
    lost[p] += seconds;
    lost.total += seconds;
  }
  // A rollout or reward activity holds one rollout node; a training job the whole train pool.
  const lostCost =
    rollout.nodeHourPrice === null || train.nodeHourPrice === null
      ? null
      : (lost.rollout / 3600) * rollout.nodeHourPrice +
        (lost.train / 3600) * train.nodes * train.nodeHourPrice;

  const figures = trained.map((it) => it.train!);
  const upd = figures.length
    ? (() => {
        const seconds = figures.reduce((s, f) => s + f.seconds, 0);
        const epSeconds = figures.reduce((s, f) => s + f.epSeconds, 0);
        return {
          seconds,
          epSeconds,
          computeSeconds: seconds - epSeconds,
          epShare: seconds > 0 ? epSeconds / seconds : null,
          computeShare: seconds > 0 ? (seconds - epSeconds) / seconds : null,
          epBytes: figures.reduce((s, f) => s + f.epBytes, 0),
        };
      })()
    : null;

  return {
    currency: prices.currency,
    wallSeconds: wall,
    pools: { rollout, train, control: { busySeconds: control, busyFraction: fraction(control) } },
    fleet,
    totalCost,
    generatedTokens,
    trainedTokens,
    costPerMillionGeneratedTokens: perMillion(totalCost, generatedTokens),
    rolloutCostPerMillionGeneratedTokens: perMillion(rolloutCost, generatedTokens),
    costPerMillionTrainedTokens: perMillion(totalCost, trainedTokens),
    trainCostPerMillionTrainedTokens: perMillion(train.cost, trainedTokens),
    interruptions: {
      chunksRedone,
      redoneChunkSeconds,
      retryDelaySeconds,
      heartbeatWaitSeconds,
      failedStageSeconds,
      lostSeconds: lost,
      lostCost,
    },
    update: upd,
  };
}
