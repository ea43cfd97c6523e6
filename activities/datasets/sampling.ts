// Deterministic prompt sampling from a dataset: which rows an iteration trains on, from nothing
// but (seed, epoch) and a position. Pure, with no imports: the workflow computes positions here. Every epoch is its own seeded shuffle of the rows
// (Fisher–Yates on splitmix64, the generator docs/tasks.md specifies); an iteration takes the
// next prompts in that order and rolls over into the next epoch mid-iteration when the epoch
// runs out. The workflow holds only the position, so these are pure functions: the same
// position and count give the same prompts on any worker, after any retry, continue-as-new,
// fork or resume.

/**
 * Where the next prompt comes from: row `permutation(epoch)[offset]`. A normalized position
 * has `0 <= offset < rows`; the end of an epoch is the start of the next one, never
 * `(epoch, rows)`, so a campaign resumed at an epoch boundary draws the next epoch's prompts
 * (the verl #7401 failure — a resume that trained zero steps — cannot be expressed).
 */
export interface DatasetPosition {
  epoch: number;
  offset: number;
}

/** One prompt drawn: the epoch it belongs to and its row index in the dataset file. */
export interface DrawnPrompt {
  epoch: number;
  row: number;
}

export interface SamplingInput {
  /** The campaign seed. */
  seed: number;
  /** Rows in the dataset (at least 1). */
  rows: number;
}

export const startPosition: DatasetPosition = { epoch: 0, offset: 0 };

const mask64 = (1n << 64n) - 1n;

/** splitmix64 as in docs/tasks.md: the state advances in place, each call returns the next value. */
export class SplitMix64 {
  constructor(public state: bigint) {
    this.state &= mask64;
  }

  next(): bigint {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & mask64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & mask64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & mask64;
    return z ^ (z >> 31n);
  }
}

/** FNV-1a-32 of a string's UTF-8 bytes (docs/tasks.md). TextEncoder, not Buffer: workflows use this file. */
export function fnv1a32(text: string): number {
  let h = 2166136261;
  for (const byte of new TextEncoder().encode(text)) h = Math.imul(h ^ byte, 16777619) >>> 0;
  return h;
}

// Separates the dataset shuffle's stream from any other use of the campaign seed.
const shuffleDomain = BigInt(fnv1a32('dataset-epoch'));

function checkInput({ seed, rows }: SamplingInput): void {
  if (!Number.isSafeInteger(seed) || seed < 0)
    throw new RangeError(`seed must be a non-negative integer, got ${seed}`);
  if (!Number.isInteger(rows) || rows < 1 || rows > 0xffffffff)
    throw new RangeError(`rows must be an integer in [1, 2^32 - 1], got ${rows}`);
}

/**
 * The order of an epoch's rows: a permutation of 0..rows-1 (4 bytes a row). The generator is
 * seeded like a prompt in docs/tasks.md — `s = seed; for v in (fnv1a32("dataset-epoch"),
 * epoch): z = splitmix64(s); s = s ^ z ^ v` — then Fisher–Yates from the last position down:
 * `j = splitmix64(s) % (i + 1)`, swap i and j. (The modulo's bias is below rows / 2^64.)
 */
export function epochPermutation(input: SamplingInput, epoch: number): Uint32Array {
  checkInput(input);
  if (!Number.isSafeInteger(epoch) || epoch < 0)
    throw new RangeError(`epoch must be a non-negative integer, got ${epoch}`);
  const cached = permutationCache.find(
    (c) => c.seed === input.seed && c.rows === input.rows && c.epoch === epoch,
  );
  if (cached) return cached.order;
  const g = new SplitMix64(BigInt(input.seed));
  for (const v of [shuffleDomain, BigInt(epoch)]) {
    const z = g.next();
    g.state ^= z ^ v;
  }
  const order = new Uint32Array(input.rows);
  for (let i = 0; i < input.rows; i++) order[i] = i;
  for (let i = input.rows - 1; i > 0; i--) {
    const j = Number(g.next() % BigInt(i + 1));
    const t = order[i] as number;
    order[i] = order[j] as number;
    order[j] = t;
  }
  permutationCache.unshift({ seed: input.seed, rows: input.rows, epoch, order });
  permutationCache.length = Math.min(permutationCache.length, 2);
  return order;
}

// An iteration spans at most two epochs (unless it draws more prompts than the dataset has),
// so the last two permutations are kept.
const permutationCache: { seed: number; rows: number; epoch: number; order: Uint32Array }[] = [];

/** The position `count` prompts after `position`, normalized (offset < rows). */
export function advancePosition(position: DatasetPosition, count: number, rows: number): DatasetPosition {
  checkPosition(position);
  if (!Number.isSafeInteger(count) || count < 0)
    throw new RangeError(`count must be a non-negative integer, got ${count}`);
  if (!Number.isInteger(rows) || rows < 1)
    throw new RangeError(`rows must be a positive integer, got ${rows}`);
  const total = position.offset + count;
  return { epoch: position.epoch + Math.floor(total / rows), offset: total % rows };
}

function checkPosition(p: DatasetPosition): void {
  if (!Number.isSafeInteger(p.epoch) || p.epoch < 0 || !Number.isSafeInteger(p.offset) || p.offset < 0)
    throw new RangeError(`a dataset position is two non-negative integers, got ${JSON.stringify(p)}`);
}

/**
 * The position iteration `iteration` (1-based) starts at: iterations draw consecutive blocks of
 * `promptsPerIteration` prompts, so a resume, a continue-as-new or a fork at iteration i starts
 * exactly where an uninterrupted campaign would.
 */
export function iterationPosition(
  iteration: number,
  promptsPerIteration: number,
  rows: number,
): DatasetPosition {
  return advancePosition(startPosition, (iteration - 1) * promptsPerIteration, rows);
}

/**
 * The `count` prompts from `position` on, in order, rolling over into the following epochs as
 * needed, and the position after them. A position at or past the end of its epoch (an offset
 * of `rows` or more, as a position saved by other code might say) counts on into the next.
 */
export function drawPrompts(
  input: SamplingInput,
  position: DatasetPosition,
  count: number,
): { prompts: DrawnPrompt[]; next: DatasetPosition } {
  checkInput(input);
  let at = advancePosition(position, 0, input.rows);
  const prompts: DrawnPrompt[] = [];
  while (prompts.length < count) {
    const order = epochPermutation(input, at.epoch);
    const take = Math.min(count - prompts.length, input.rows - at.offset);
    for (let k = 0; k < take; k++) prompts.push({ epoch: at.epoch, row: order[at.offset + k] as number });
    at = advancePosition(at, take, input.rows);
  }
  return { prompts, next: at };
}

/** A rollout shard's part of an iteration: prompts [promptStart, promptStart + promptCount). */
export interface ShardRange {
  shard: number;
  promptStart: number;
  promptCount: number;
}

/**
 * The prompts of one shard, given the iteration's starting position: the shard skips the
 * prompts of the shards before it, so every shard computes its own rows without the others'
 * and together they are exactly `drawPrompts(input, iterationStart, promptsPerIteration)`.
 */
export function shardPrompts(
  input: SamplingInput,
  iterationStart: DatasetPosition,
  range: ShardRange,
): DrawnPrompt[] {
  const from = advancePosition(iterationStart, range.promptStart, input.rows);
  return drawPrompts(input, from, range.promptCount).prompts;
}
