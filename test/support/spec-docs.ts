// A valid campaign spec document for spec tests; each malformed case changes one thing (or a
// few) in a fresh copy.
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

/** A dataset task in verl's schema (the defaults name every column), for `task:` of validSpecDoc. */
export function datasetTaskDoc(): Record<string, unknown> {
  return { dataset: { train: 'datasets/arith/train.parquet', format: 'parquet' } };
}
