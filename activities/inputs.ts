// The inputs activity: what a campaign on a Hugging Face model and a dataset of its own checks
// and copies once, before its first policy. The model's config, tokenizer and generation files go
// to the campaign's model/ (from the model folder, or the parent campaign's when forking), and the
// training dataset is validated whole — every row's fields, every data_source's reward, every
// prompt's length under the model's own chat template — with every problem named at once. The
// dataset's identity (sha256, bytes, rows) is what the workflow then holds: shards draw their rows
// from it, and a file that changes under the campaign is refused by its hash. A validation file
// is checked the same way, against the validation's maxNewTokens. The rows an SFT warm start
// learns are rendered here too, where the tokenizer is: the prompt with the chat template, the
// row's reference completion (task.dataset.responseKey) then the eos token, as the token ids
// moe_train sft reads (keys.sftExamplesKey).
import { join } from 'node:path';
import { Context } from '@temporalio/activity';
import { sftWarmStart, type CampaignSpec } from '../workflows/spec.js';
import { ShardEnvironments } from './agents/environments.js';
import { demonstrationIds } from './agents/turn-render.js';
import { isHfModel } from '../workflows/spec-model.js';
import { campaignValidation } from '../workflows/spec-validation.js';
import { DatasetError, epochPermutation, readDatasetRows, validateDataset } from './datasets/index.js';
import { ProblemList } from './datasets/errors.js';
import type { DatasetIdentity, DatasetInput } from './datasets/index.js';
import { withHeartbeat } from './heartbeat.js';
import * as keys from './layout.js';
import { campaignTokenizer, copyModelFiles, hfModelLocation } from './models/source.js';
import type { HfTokenizer } from './models/tokenizer.js';
import { datasetInput, datasetSpecOf } from './prompts.js';
import type { ActivityDeps } from './deps.js';
import type { ObjectStore } from './store/types.js';
import type { PrepareInputsInput, PrepareInputsOutput } from './types.js';

/** moe_train init --from-hf's context without --max-seq-len: min(max_position_embeddings, this). */
export const defaultHfContextLength = 4096;

export async function prepareInputs(
  deps: ActivityDeps,
  input: PrepareInputsInput,
): Promise<PrepareInputsOutput> {
  const ctx = Context.current();
  const { spec, campaignId } = input;
  const store = deps.openStore(spec.store);
  const progress = { step: 'model' };
  const datasets = await withHeartbeat(
    () => progress,
    async (): Promise<{ train: DatasetIdentity; validation: DatasetIdentity | null } | null> => {
      const model = spec.model;
      if (!isHfModel(model)) return null;
      const from = input.forkFrom
        ? { store, prefix: keys.modelPrefix(input.forkFrom.campaignId) }
        : (() => {
            const source = hfModelLocation(model, spec.store);
            return { store: deps.openStore(source.location), prefix: source.prefix };
          })();
      await copyModelFiles(from, { store, campaignId }, { checkWeights: !input.forkFrom });
      if (!('dataset' in spec.task)) return null;
      const tokenizer = await campaignTokenizer(store, campaignId, deps.cacheDir);
      const config = JSON.parse(
        (await store.get(`${keys.modelPrefix(campaignId)}/config.json`)).toString('utf8'),
      ) as { max_position_embeddings?: unknown };
      const positions =
        model.contextLength ??
        Math.min(
          typeof config.max_position_embeddings === 'number' ? config.max_position_embeddings : Infinity,
          defaultHfContextLength,
        );
      const d = datasetSpecOf(spec);
      const rewards = spec.rewards;
      // The warm start learns each training row's reference completion: every row needs one.
      const warmStart = spec.sftWarmStartSteps > 0 && !input.forkFrom;
      const check = (which: 'train' | 'validation', maxNewTokens: number) => {
        progress.step = `dataset ${which}`;
        return validateDataset(datasetInput(spec, which, deps.openStore), {
          format: d.format,
          columns: d,
          cacheDir: join(deps.cacheDir, 'datasets'),
          ...(warmStart && which === 'train' ? { responseKey: d.responseKey } : {}),
          ...(rewards
            ? {
                rewards: {
                  mapped: Object.keys(rewards.bySource ?? {}),
                  hasDefault: rewards.default !== undefined,
                  field: 'rewards.bySource',
                },
              }
            : {}),
          promptLimit: {
            countTokens: (messages) =>
              tokenizer.renderChat(
                messages.map((m) => ({ ...m })),
                { addGenerationPrompt: true },
              ).ids.length,
            maxTokens: positions - maxNewTokens,
            why: `a context of ${positions} positions less maxNewTokens ${maxNewTokens}`,
          },
        });
      };
      const train = await check('train', spec.hyperparameters.maxNewTokens);
      if (warmStart) {
        progress.step = 'sft examples';
        const trainFile = datasetInput(spec, 'train', deps.openStore);
        await writeSftExamples(
          { store, campaignId, spec, input: trainFile, identity: train, tokenizer, positions },
          deps,
        );
      }
      const validation = campaignValidation(spec);
      return {
        train,
        validation: validation
          ? await check('validation', validation.maxNewTokens ?? spec.hyperparameters.maxNewTokens)
          : null,
      };
    },
  );
  return {
    dataset: datasets?.train ?? null,
    validationDataset: datasets?.validation ?? null,
    attempt: ctx.info.attempt,
  };
}

/**
 * The rows an SFT warm start learns, one `{"prompt_tokens","tokens"}` line each (and
 * `loss_mask` for a multi-turn demonstration): the first
 * min(rows, steps × batch size) rows of the dataset's epoch-0 order, which moe_train sft cycles
 * through. A row too long for the model's context is named with its field.
 */
async function writeSftExamples(
  req: {
    store: ObjectStore;
    campaignId: string;
    spec: CampaignSpec;
    input: DatasetInput;
    identity: DatasetIdentity;
    tokenizer: HfTokenizer;
    positions: number;
  },
  deps: ActivityDeps,
): Promise<void> {
  const { spec, identity, tokenizer, positions } = req;
  const d = datasetSpecOf(spec);
  const responseKey = d.responseKey as string; // the spec refuses a warm start without it
  const warmStart = sftWarmStart(spec);
  const count = Math.min(identity.rows, warmStart.steps * warmStart.batchSize);
  const order = epochPermutation({ seed: spec.seed, rows: identity.rows }, 0).subarray(0, count);
  const rows = await readDatasetRows(req.input, [...order], {
    format: d.format,
    columns: d,
    cacheDir: join(deps.cacheDir, 'datasets'),
    expectedSha256: identity.sha256,
    responseKey,
  });
  const problems = new ProblemList();
  // An agentic campaign's rows are rendered with their environment's tools, as its episodes are.
  const environments = spec.agent ? new ShardEnvironments(spec.agent) : null;
  const lines: string[] = [];
  try {
    for (const row of rows) {
      const tools = (await environments?.of(row.dataSource))?.tools;
      const render = tools ? { tools } : {};
      const prompt = tokenizer.renderChat(
        row.prompt.map((m) => ({ ...m })),
        { addGenerationPrompt: true, ...render },
      ).ids;
      // A multi-turn demonstration is learned on its assistant turns only (the loss mask).
      const completion = Array.isArray(row.response)
        ? demonstrationIds(tokenizer, row.response, render)
        : { tokens: [...tokenizer.encode(row.response as string), tokenizer.eosTokenId] };
      const length = prompt.length + completion.tokens.length;
      if (length > positions)
        problems.add(
          `row ${row.row}: ${responseKey}: the prompt and this completion are ${length} tokens, over the model's context of ${positions} positions`,
        );
      lines.push(
        JSON.stringify({
          prompt_tokens: prompt,
          tokens: completion.tokens,
          ...('lossMask' in completion ? { loss_mask: completion.lossMask } : {}),
        }),
      );
    }
  } finally {
    await environments?.close();
  }
  if (problems.count > 0) throw new DatasetError(`${d.train} (SFT warm start)`, problems.list());
  await req.store.put(keys.sftExamplesKey(req.campaignId), lines.join('\n') + '\n', {
    contentType: 'application/x-ndjson',
  });
}
