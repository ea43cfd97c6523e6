// The tiny Hugging Face campaign of the integration tests: a tiny Qwen3-MoE folder made by
// transformers (test/reference/hf_models.py) in an fs store, verl-schema Parquet prompts of
// arithmetic rows, rewards by data_source (a Python function of the user's and a built-in
// verifier), and the spec that trains it for 2 iterations on EP 2 ranks.
import { cp, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { CampaignSpec, CampaignSpecInput } from '../../workflows/spec.js';
import { testSpec } from './campaign-harness.js';
import { arithmeticRow, writeVerlParquet } from './dataset-fixtures.js';
import type { pythonReference } from './python-reference.js';

/** Rows of the training set: 2 iterations of 8 prompts roll over into epoch 1 in iteration 2. */
export const hfCampaignRows = 10;

// The user's reward function, verl's signature: a score any reader can recompute from the text.
const userFunction = `
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": (len(solution_str) % 4) / 4 + (0.5 if data_source == "arith" else 0.0)}
`;
/** What the user's function scores a completion of data_source `arith` (less its 0.5). */
export const expectedUserScore = (text: string) => ([...text].length % 4) / 4; // Python counts code points

/**
 * Writes under `dir`: the model (`dir/qwen3`, and in the store as models/tiny-qwen3), the
 * dataset (datasets/train.parquet in the store at `dir/store`) and the reward function
 * (`dir/score.py`). `publishedShape`: the model in the shape llama.cpp runs (hf_models.py).
 */
export async function writeHfCampaignFixture(
  dir: string,
  pyref: ReturnType<typeof pythonReference>,
  opts: { publishedShape?: boolean } = {},
): Promise<void> {
  const model = join(dir, 'qwen3');
  await pyref.run('hf_models.py', [
    ...['make', model, '--family', 'qwen3_moe'],
    ...(opts.publishedShape ? ['--published-shape'] : []),
  ]);
  await cp(model, join(dir, 'store', 'models', 'tiny-qwen3'), { recursive: true });
  await mkdir(join(dir, 'store', 'datasets'), { recursive: true });
  writeVerlParquet(
    join(dir, 'store', 'datasets', 'train.parquet'),
    Array.from({ length: hfCampaignRows }, (_, i) => arithmeticRow(i)),
    4,
  );
  await writeFile(join(dir, 'score.py'), userFunction);
}

/** The campaign on the fixture under `dir`; `overrides` at the top level (and orchestration). */
export function hfCampaignSpec(
  dir: string,
  name: string,
  overrides: Partial<CampaignSpecInput> = {},
): CampaignSpec {
  return testSpec({
    name,
    task: { dataset: { train: 'datasets/train.parquet', format: 'parquet' } },
    model: { huggingFace: 'models/tiny-qwen3/' },
    rewards: {
      default: { kind: 'python', file: join(dir, 'score.py') },
      bySource: { 'arith/hard': { kind: 'match' } },
    },
    iterations: 2,
    promptsPerIteration: 8,
    groupSize: 2,
    rolloutShards: 2,
    chunkSize: 1,
    epWorldSize: 2,
    store: { kind: 'fs', path: join(dir, 'store') },
    hyperparameters: { maxNewTokens: 24, minibatches: 1, epochs: 1 },
    ...overrides,
    orchestration: { continueAsNewEvery: 1, rolloutHeartbeatSeconds: 3, ...overrides.orchestration },
  });
}
