// Where a campaign's Hugging Face model comes from and what each part of moerl takes of it. The
// spec names a folder (a store key prefix or s3://bucket/prefix); the campaign copies the small
// files beside the weights (config, tokenizer, chat template, generation config) into its own
// `campaigns/<id>/model/` once, when it prepares, so rollouts and exports never depend on the
// source folder again; each trainer rank fetches config.json, the index and only the safetensors
// shards that hold its tensors (dense weights + its E/R experts), never the whole model.
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { parseModelRef } from '../../workflows/spec-model.js';
import type { HfModelSpec } from '../../workflows/spec-model.js';
import { datasetLocation } from '../datasets/source.js';
import * as keys from '../layout.js';
import { BadInputError } from '../rewards/errors.js';
import type { ObjectStore } from '../store/types.js';
import type { StoreLocation } from '../types.js';
import { loadTokenizer, type HfTokenizer } from './tokenizer.js';

export const hfIndexName = 'model.safetensors.index.json';
export const hfSingleWeightsName = 'model.safetensors';

/** A model folder: the store it is in and its key prefix there (no trailing slash). */
export interface HfModelLocation {
  location: StoreLocation;
  prefix: string;
}

/** The folder the spec names, reached like a dataset (the campaign store, or an S3 bucket). */
export function hfModelLocation(model: HfModelSpec, campaignStore: StoreLocation): HfModelLocation {
  const ref = parseModelRef(model.huggingFace);
  if (typeof ref === 'string') throw new BadInputError(`model.huggingFace ${model.huggingFace}: ${ref}`);
  const { location, key } = datasetLocation(ref, campaignStore);
  return { location, prefix: key };
}

/** Files a campaign needs of the model besides its weights; the rest of hfModelFiles is optional. */
const requiredModelFiles = ['config.json', 'tokenizer.json', 'tokenizer_config.json'] as const;

/**
 * Copies the model's config, tokenizer and generation files from `source` (a model folder, or
 * another campaign's model/ when forking) into the campaign's model/, config.json last. The
 * folder must hold weights (model.safetensors or the index); a missing required file is bad input
 * naming it. Copying again overwrites with the same bytes.
 */
export async function copyModelFiles(
  from: { store: ObjectStore; prefix: string },
  to: { store: ObjectStore; campaignId: string },
  opts: { checkWeights: boolean },
): Promise<void> {
  const where = `${from.prefix}/ in ${from.store.describe()}`;
  const present = new Set<string>();
  for (const name of [...keys.hfModelFiles, hfIndexName, hfSingleWeightsName])
    if ((await from.store.head(`${from.prefix}/${name}`)) !== null) present.add(name);
  const missing = requiredModelFiles.filter((n) => !present.has(n));
  if (missing.length > 0)
    throw new BadInputError(
      `the Hugging Face model folder ${where} has no ${missing.join(', ')} (a model folder holds config.json, the tokenizer and its safetensors)`,
    );
  if (opts.checkWeights && !present.has(hfIndexName) && !present.has(hfSingleWeightsName))
    throw new BadInputError(
      `the Hugging Face model folder ${where} has neither ${hfSingleWeightsName} nor ${hfIndexName}`,
    );
  const names = keys.hfModelFiles.filter((n) => present.has(n) && n !== 'config.json');
  for (const name of [...names, 'config.json'])
    await to.store.put(
      `${keys.modelPrefix(to.campaignId)}/${name}`,
      await from.store.get(`${from.prefix}/${name}`),
    );
}

/** The expert count of a config.json: transformers 4 says num_experts, 5 and Mixtral num_local_experts. */
export function configExperts(config: Record<string, unknown>): number | null {
  const n = config.num_local_experts ?? config.num_experts;
  return typeof n === 'number' && Number.isInteger(n) && n > 0 ? n : null;
}

// An expert's tensors carry its index (Qwen3-MoE mlp.experts.E., Mixtral block_sparse_moe.experts.E.).
const expertTensor = /\.experts\.(\d+)\./;

/**
 * The weight files rank `rank` of `worldSize` reads: every shard that holds a dense tensor or
 * one of experts [rank·E/R, (rank+1)·E/R). With one model.safetensors, that file. When E does not
 * divide by R every shard is listed and the import names the problem.
 */
export function rankWeightFiles(
  index: { weight_map?: unknown } | null,
  experts: number | null,
  rank: number,
  worldSize: number,
  where: string,
): string[] {
  if (index === null) return [hfSingleWeightsName];
  const map = index.weight_map;
  if (map === null || typeof map !== 'object' || Array.isArray(map))
    throw new BadInputError(`${where}: no "weight_map" object`);
  const files = new Set<string>();
  const perRank = experts !== null && experts % worldSize === 0 ? experts / worldSize : null;
  for (const [tensor, file] of Object.entries(map)) {
    if (typeof file !== 'string' || file.includes('/') || file === '' || file.startsWith('.'))
      throw new BadInputError(`${where}: tensor ${tensor} maps to ${JSON.stringify(file)}, not a file name`);
    const m = expertTensor.exec(tensor);
    const expert = m ? Number(m[1]) : null;
    if (expert === null || perRank === null || Math.floor(expert / perRank) === rank) files.add(file);
  }
  return [...files].sort();
}

/**
 * Fetches what rank `rank` of `worldSize` imports into `dir`: config.json, the index when there is
 * one, and the rank's weight files, under their own names (the index refers to them by name).
 */
export async function fetchModelForRank(
  model: { store: ObjectStore; prefix: string },
  dir: string,
  rank: number,
  worldSize: number,
): Promise<string[]> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const key = (name: string) => `${model.prefix}/${name}`;
  const config = parseJsonObject(await model.store.get(key('config.json')), key('config.json'));
  const hasIndex = (await model.store.head(key(hfIndexName))) !== null;
  const index = hasIndex ? parseJsonObject(await model.store.get(key(hfIndexName)), key(hfIndexName)) : null;
  const files = rankWeightFiles(index, configExperts(config), rank, worldSize, key(hfIndexName));
  const names = ['config.json', ...(hasIndex ? [hfIndexName] : []), ...files];
  for (const name of names) await model.store.getFile(key(name), join(dir, name));
  return names;
}

function parseJsonObject(bytes: Buffer, where: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    throw new BadInputError(`${where} is not valid JSON: ${(err as Error).message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value))
    throw new BadInputError(`${where} is not a JSON object`);
  return value as Record<string, unknown>;
}

const tokenizers = new Map<string, Promise<HfTokenizer>>();

/**
 * The tokenizer of a campaign's model (its model/ files, fetched into the worker's cache once per
 * process: they never change for a campaign).
 */
export function campaignTokenizer(
  store: ObjectStore,
  campaignId: string,
  cacheDir: string,
): Promise<HfTokenizer> {
  const id = `${store.describe()} ${campaignId}`;
  let found = tokenizers.get(id);
  if (!found) {
    found = (async () => {
      const dir = join(cacheDir, 'models', campaignId);
      await mkdir(dir, { recursive: true });
      for (const name of keys.hfModelFiles) {
        const key = `${keys.modelPrefix(campaignId)}/${name}`;
        if ((await store.head(key)) !== null) await store.getFile(key, join(dir, name));
      }
      return loadTokenizer(dir);
    })();
    found.catch(() => tokenizers.delete(id));
    tokenizers.set(id, found);
  }
  return found;
}
