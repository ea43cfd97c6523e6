// Scores one source of rollout JSONL with a RewardFunction: per-sample reward rows in input
// order, summary statistics, and the rewards JSONL that `moe_train grpo --rewards` reads.
import { BadRolloutError } from './errors.js';
import type { RewardFunction, RewardKind } from './reward-model.js';
import type { OverlongShaping } from '../../workflows/spec-algorithm.js';
import { overlongPenalty, policyTokens } from './overlong.js';
import { parseRolloutLine, type ParseOptions, type RolloutRecord } from './rollout-record.js';

/** One line of a rewards file (docs/native-model.md, "Rewards JSONL"). */
export interface RewardRow {
  prompt_id: number;
  sample_index: number;
  reward: number;
}

export interface GroupStats {
  prompt_id: number;
  samples: number;
  meanReward: number;
  /** Population standard deviation; 0 means GRPO gets no signal from this group. */
  stdReward: number;
  passRate: number;
}

export interface RewardStats {
  samples: number;
  meanReward: number;
  /** Population standard deviation over all samples. */
  stdReward: number;
  /** Fraction of samples that pass: reward >= 1 for binary rewards, > 0.5 for continuous ones. */
  passRate: number;
  /** Per prompt group, in order of first appearance; only when asked for. */
  perGroup?: GroupStats[];
}

export interface ScoredRollouts {
  /** What the trainer reads: the task's rewards, shaped when asked. */
  rows: RewardRow[];
  /** The task's rewards before any shaping: what the statistics describe. */
  taskRows: RewardRow[];
  stats: RewardStats;
}

/** Whether a sample with this reward counts as passed (docs/rewards.md, "Pass rate"). */
export function passes(reward: number, kind: RewardKind): boolean {
  return kind === 'binary' ? reward >= 1 : reward > 0.5;
}

function summarise(rewards: readonly number[], kind: RewardKind) {
  const n = rewards.length;
  if (n === 0) return { samples: 0, meanReward: 0, stdReward: 0, passRate: 0 };
  const mean = rewards.reduce((s, r) => s + r, 0) / n;
  const variance = rewards.reduce((s, r) => s + (r - mean) ** 2, 0) / n;
  const passed = rewards.filter((r) => passes(r, kind)).length;
  return { samples: n, meanReward: mean, stdReward: Math.sqrt(variance), passRate: passed / n };
}

/** The rows' rewards by prompt id, in order of first appearance. */
function rewardsByPrompt(rows: readonly RewardRow[]): Map<number, number[]> {
  const groups = new Map<number, number[]>();
  for (const row of rows) {
    const group = groups.get(row.prompt_id);
    if (group) group.push(row.reward);
    else groups.set(row.prompt_id, [row.reward]);
  }
  return groups;
}

/**
 * Of reward rows, the prompt groups and those whose rewards carry signal for the trainer: their
 * population standard deviation, of the float32 values the trainers read, is at least 1e-6
 * (native/rl/advantages.cc skips the others).
 */
export function groupsWithSignal(rows: readonly RewardRow[]): { groups: number; withSignal: number } {
  const groups = rewardsByPrompt(rows);
  let withSignal = 0;
  for (const rewards of groups.values()) {
    const r = rewards.map(Math.fround);
    let mean = 0;
    for (const x of r) mean += x / r.length;
    const variance = r.reduce((a, x) => a + (x - mean) ** 2, 0) / r.length;
    if (Math.sqrt(variance) >= 1e-6) withSignal++;
  }
  return { groups: groups.size, withSignal };
}

/** Statistics of reward rows; `perGroup` adds one entry per prompt id. */
export function rewardStats(rows: readonly RewardRow[], kind: RewardKind, perGroup = false): RewardStats {
  const stats: RewardStats = summarise(
    rows.map((r) => r.reward),
    kind,
  );
  if (perGroup) {
    stats.perGroup = [...rewardsByPrompt(rows)].map(([promptId, rewards]) => ({
      prompt_id: promptId,
      ...summarise(rewards, kind),
    }));
  }
  return stats;
}

/**
 * Parses every non-empty line of `source` (a file name or store key, for messages), scores all
 * samples with `reward` and returns one row per sample in input order, plus statistics.
 * With `overlong`, each row's reward is shaped by DAPO's length penalty; the statistics stay the
 * unshaped rewards (a pass is the task's). Throws BadRolloutError for a malformed line or a
 * (prompt id, sample index) seen twice.
 */
export async function scoreRollouts(
  lines: AsyncIterable<string> | Iterable<string>,
  source: string,
  reward: RewardFunction,
  options: { perGroup?: boolean; overlong?: OverlongShaping } & ParseOptions = {},
): Promise<ScoredRollouts> {
  const records: RolloutRecord[] = [];
  const seen = new Map<string, number>();
  let lineNumber = 0;
  for await (const line of lines) {
    lineNumber++;
    // Blank lines are skipped (a trailing newline, as the native readers do); line numbers count them.
    if (line.trim() === '') continue;
    const record = parseRolloutLine(line, { source, line: lineNumber }, options);
    const key = `${record.prompt_id}/${record.sample_index}`;
    const first = seen.get(key);
    if (first !== undefined) {
      throw new BadRolloutError(
        `malformed rollout: ${source} line ${lineNumber}: prompt ${record.prompt_id} sample ` +
          `${record.sample_index} already appeared on line ${first}`,
        { source, line: lineNumber, field: 'sample_index' },
      );
    }
    seen.set(key, lineNumber);
    records.push(record);
  }
  let rewards: number[] = [];
  try {
    if (records.length > 0) rewards = await reward.score(records);
  } catch (err) {
    // A reward function names the sample it rejected; name its line of the source too.
    const { prompt_id: promptId, sample_index: sampleIndex } =
      err instanceof BadRolloutError ? err.location : {};
    const line = seen.get(`${promptId}/${sampleIndex}`);
    if (!(err instanceof BadRolloutError) || err.location.source !== undefined || line === undefined)
      throw err;
    throw err.at(`malformed rollout: ${source} line ${line}`, { source, line });
  }
  if (rewards.length !== records.length) {
    throw new Error(
      `reward ${reward.name} returned ${rewards.length} rewards for ${records.length} samples of ${source}`,
    );
  }
  const taskRows = records.map((record, i) => {
    const value = rewards[i] as number;
    if (typeof value !== 'number' || !Number.isFinite(value)) {
      throw new Error(`reward ${reward.name} returned ${String(value)} for sample ${i} of ${source}`);
    }
    return { prompt_id: record.prompt_id, sample_index: record.sample_index, reward: value };
  });
  const { overlong } = options;
  const rows = overlong
    ? taskRows.map((row, i) => ({
        ...row,
        reward: row.reward + overlongPenalty(policyTokens(records[i] as RolloutRecord), overlong),
      }))
    : taskRows;
  return { rows, taskRows, stats: rewardStats(taskRows, reward.kind, options.perGroup ?? false) };
}

/**
 * The rewards JSONL `moe_train grpo --rewards` reads and `moe_reward --out` writes: one
 * `{"prompt_id":p,"sample_index":s,"reward":r}` line per row, each ending with a newline.
 */
export function formatRewardsJsonl(rows: readonly RewardRow[]): string {
  return rows
    .map((row) => {
      if (!Number.isSafeInteger(row.prompt_id) || !Number.isSafeInteger(row.sample_index)) {
        throw new Error(`reward row ids must be integers, got ${JSON.stringify(row)}`);
      }
      if (!Number.isFinite(row.reward)) {
        throw new Error(
          `reward of prompt ${row.prompt_id} sample ${row.sample_index} is ${row.reward}, not finite`,
        );
      }
      return `{"prompt_id":${row.prompt_id},"sample_index":${row.sample_index},"reward":${JSON.stringify(row.reward)}}\n`;
    })
    .join('');
}
