// The inputs activity: what a campaign on a Hugging Face model and a dataset of its own checks
// and copies once, before its first policy. The model's config, tokenizer and generation files go
// to the campaign's model/ (from the model folder, or the parent campaign's when forking), and the
// training dataset is validated whole — every row's fields, every data_source's reward, every
// prompt's length under the model's own chat template — with every problem named at once. The
// dataset's identity (sha256, bytes, rows) is what the workflow then holds: shards draw their rows
// from it, and a file that changes under the campaign is refused by its hash. A validation file
// is checked the same way, against the validation's maxNewTokens.
import { join } from 'node:path';
import { Context } from '@temporalio/activity';
import { isHfModel } from '../workflows/spec-model.js';
import { campaignValidation } from '../workflows/spec-validation.js';
import { validateDataset } from './datasets/index.js';
import type { DatasetIdentity } from './datasets/index.js';
import { withHeartbeat } from './heartbeat.js';
import * as keys from './layout.js';
import { campaignTokenizer, copyModelFiles, hfModelLocation } from './models/source.js';
import { datasetInput, datasetSpecOf } from './prompts.js';
import type { ActivityDeps } from './deps.js';
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
      const check = (which: 'train' | 'validation', maxNewTokens: number) => {
        progress.step = `dataset ${which}`;
        return validateDataset(datasetInput(spec, which, deps.openStore), {
          format: d.format,
          columns: d,
          cacheDir: join(deps.cacheDir, 'datasets'),
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
