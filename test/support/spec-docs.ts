// A valid campaign spec document for spec tests; each malformed case changes one thing (or a
// few) in a fresh copy, and specProblems lists what the validator says of it.
import assert from 'node:assert/strict';
import { SpecError, parseCampaignSpec } from '../../workflows/spec.js';

/** Every problem the spec validator reports of `doc`; fails the test when it accepts the spec. */
export function specProblems(doc: unknown): string[] {
  try {
    parseCampaignSpec(doc);
  } catch (err) {
    assert.ok(err instanceof SpecError, `expected SpecError, got ${String(err)}`);
    return err.problems;
  }
  assert.fail('the spec was accepted');
}

export function validSpecDoc(): Record<string, unknown> {
  return {
    name: 'unit',
    task: { builtin: 'add' },
    model: { layers: 2, hidden: 64, heads: 4, experts: 8, topK: 2 },
    iterations: 5,
    promptsPerIteration: 16,
    groupSize: 4,
    rolloutShards: 2,
    chunkSize: 8,
    epWorldSize: 2,
    seed: 1,
  };
}

/**
 * A valid spec of a campaign on a Hugging Face model and a dataset task (verl's schema), scored
 * by the math verifier.
 */
export function hfSpecDoc(): Record<string, unknown> {
  return {
    ...validSpecDoc(),
    task: datasetTaskDoc(),
    model: { huggingFace: 'models/qwen3-moe' },
    rewards: { default: { kind: 'math' } },
  };
}

/** A dataset task in verl's schema (the defaults name every column), for `task:` of validSpecDoc. */
export function datasetTaskDoc(): Record<string, unknown> {
  return { dataset: { train: 'datasets/arith/train.parquet', format: 'parquet' } };
}
