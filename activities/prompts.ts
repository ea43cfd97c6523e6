// The prompts of a dataset task, as the campaign's activities see them: which rows an iteration's
// shard trains on (from nothing but the campaign seed, the dataset's identity and the iteration's
// position, which the workflow holds: sampling.ts), the rows themselves read from the store, and each row's
// chat messages rendered with the model's own chat template into the token ids moe_generate
// samples from. Prompt ids stay global and consecutive per iteration, as for the built-in tasks:
// prompt p of iteration i is row drawn[p - (i - 1)·promptsPerIteration] of that iteration.
import { join } from 'node:path';
import type { CampaignSpec } from '../workflows/spec.js';
import { parseDatasetRef } from '../workflows/spec-dataset.js';
import type { DatasetSpec } from '../workflows/spec-dataset.js';
import {
  datasetLocation,
  readDatasetRows,
  shardPrompts,
  type DatasetIdentity,
  type DatasetInput,
  type DatasetRow,
} from './datasets/index.js';
import type { HfTokenizer } from './models/tokenizer.js';
import type { ShardEnvironments } from './agents/environments.js';
import type { ToolSchema } from './agents/tool-calls.js';
import { BadInputError } from './rewards/errors.js';
import type { ObjectStore } from './store/types.js';
import type { IterationDataset, StoreLocation } from './types.js';

export function datasetSpecOf(spec: CampaignSpec): DatasetSpec {
  if (!('dataset' in spec.task)) throw new BadInputError(`campaign ${spec.name} has no dataset task`);
  return spec.task.dataset;
}

/** The dataset file a spec names, in the store it lives in. */
export function datasetInput(
  spec: CampaignSpec,
  which: 'train' | 'validation',
  openStore: (location: StoreLocation) => ObjectStore,
): DatasetInput {
  const d = datasetSpecOf(spec);
  const ref = which === 'train' ? d.train : d.validation;
  if (ref === undefined) throw new BadInputError(`task.dataset has no ${which} file`);
  const parsed = parseDatasetRef(ref);
  if (typeof parsed === 'string') throw new BadInputError(`task.dataset.${which} ${ref}: ${parsed}`);
  const { location, key } = datasetLocation(parsed, spec.store);
  return { store: openStore(location), key };
}

/**
 * The rows of iteration `iteration`'s prompts [promptStart, promptStart + promptCount), in prompt
 * order; bytes that are not the campaign's (another sha256) are a DatasetChangedError.
 */
export async function iterationRows(
  spec: CampaignSpec,
  dataset: IterationDataset,
  range: { promptStart: number; promptCount: number },
  input: DatasetInput,
  cacheDir: string,
): Promise<DatasetRow[]> {
  const d = datasetSpecOf(spec);
  const drawn = shardPrompts({ seed: spec.seed, rows: dataset.identity.rows }, dataset.position, {
    shard: 0,
    ...range,
  });
  return readDatasetRows(
    input,
    drawn.map((p) => p.row),
    {
      format: d.format,
      columns: d,
      cacheDir: join(cacheDir, 'datasets'),
      expectedSha256: dataset.identity.sha256,
    },
  );
}

/**
 * Rows [promptStart, promptStart + promptCount) of the validation file, in order (a validation's
 * prompt id is its row number); bytes that are not the campaign's are a DatasetChangedError.
 */
export async function validationRows(
  deps: { openStore: (location: StoreLocation) => ObjectStore; cacheDir: string },
  input: { spec: CampaignSpec; dataset: DatasetIdentity },
  range: { promptStart: number; promptCount: number },
): Promise<DatasetRow[]> {
  const d = datasetSpecOf(input.spec);
  return readDatasetRows(
    datasetInput(input.spec, 'validation', deps.openStore),
    Array.from({ length: range.promptCount }, (_, i) => range.promptStart + i),
    {
      format: d.format,
      columns: d,
      cacheDir: join(deps.cacheDir, 'datasets'),
      expectedSha256: input.dataset.sha256,
    },
  );
}

/**
 * One line of moe_generate's --prompts file: the rendered prompt and its token ids, and the row's
 * data_source (an agentic campaign's episodes are chosen by it). A row of an episode's data
 * source is rendered with its environment's tools, as the chat template offers them.
 */
export function promptLine(
  promptId: number,
  row: DatasetRow,
  tokenizer: HfTokenizer,
  tools?: readonly ToolSchema[],
): string {
  const { text, ids } = tokenizer.renderChat(
    row.prompt.map((m) => ({ ...m })),
    { addGenerationPrompt: true, ...(tools ? { tools } : {}) },
  );
  return JSON.stringify({
    prompt_id: promptId,
    prompt: text,
    prompt_tokens: ids,
    data_source: row.dataSource,
  });
}

/** The --prompts file of rows with ids from `firstId`, each with its environment's tools. */
export async function promptLines(
  firstId: number,
  rows: readonly DatasetRow[],
  tokenizer: HfTokenizer,
  environments: ShardEnvironments | null,
): Promise<string> {
  const lines = [];
  for (const [i, row] of rows.entries()) {
    const env = environments ? await environments.of(row.dataSource) : undefined;
    lines.push(promptLine(firstId + i, row, tokenizer, env?.tools) + '\n');
  }
  return lines.join('');
}
