// DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13; docs/algorithms.md):
// a completion whose policy tokens run into the last `bufferTokens` before the longest a sample
// may train loses reward linearly, up to `penalty` at the limit. The reward file holds the shaped
// reward the trainer optimises; the iteration's statistics stay the task's own rewards.
import type { OverlongShaping } from '../../workflows/spec-algorithm.js';
import type { RolloutRecord } from './rollout-record.js';

/** The policy's own tokens of a record: an episode's environment tokens are not the policy's length. */
export function policyTokens(record: Pick<RolloutRecord, 'tokens' | 'loss_mask'>): number {
  return record.loss_mask ? record.loss_mask.filter((m) => m === 1).length : record.tokens.length;
}

/** The (non-positive) reward added to a sample of `length` policy tokens. */
export function overlongPenalty(length: number, o: OverlongShaping): number {
  const start = Math.max(0, o.maxTokens - o.bufferTokens);
  if (length <= start) return 0;
  return -o.penalty * Math.min(1, (length - start) / o.bufferTokens);
}
