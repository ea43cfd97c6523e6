// Prices of the two node pools a campaign holds, from a small YAML file and/or flags (flags win).
// Every bad value is an error naming the file or flag and what is allowed.
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { z } from 'zod';
import type { CampaignSpec } from '../../workflows/spec.js';
import { UsageError } from '../errors.js';

export interface PoolPrice {
  /** Price of one node for one hour, in `currency`; null when not given (no cost computed). */
  nodeHourPrice: number | null;
  /** Nodes the pool holds for the campaign. */
  nodes: number;
}

export interface Prices {
  currency: string;
  rollout: PoolPrice;
  train: PoolPrice;
}

const pool = z.strictObject({
  nodeHourPrice: z.number().nonnegative().finite().optional(),
  nodes: z.number().int().positive().optional(),
});
const pricesFile = z.strictObject({
  currency: z.string().min(1).max(8).optional(),
  rollout: pool.optional(),
  train: pool.optional(),
});

export interface PriceFlags {
  file?: string;
  rolloutPrice?: string;
  trainPrice?: string;
  rolloutNodes?: string;
  trainNodes?: string;
  currency?: string;
}

function number(flag: string, text: string | undefined, integer: boolean): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  const ok =
    text.trim() !== '' && Number.isFinite(value) && value >= 0 && (!integer || Number.isInteger(value));
  if (!ok || (integer && value === 0))
    throw new UsageError(
      `${flag}: got "${text}"; expected ${integer ? 'a whole number of nodes, at least 1' : 'a price, a number ≥ 0'}`,
    );
  return value;
}

/** Reads the prices file (if any), applies the flags over it, and fills node counts from the spec. */
export function resolvePrices(flags: PriceFlags, spec: CampaignSpec | undefined): Prices {
  let file: z.infer<typeof pricesFile> = {};
  if (flags.file !== undefined) {
    let text: string;
    try {
      text = readFileSync(flags.file, 'utf8');
    } catch (err) {
      throw new UsageError(`--prices ${flags.file}: cannot read it (${(err as Error).message})`);
    }
    let doc: unknown;
    try {
      doc = parse(text) ?? {};
    } catch (err) {
      throw new UsageError(
        `--prices ${flags.file}: YAML syntax error: ${(err as Error).message.split('\n')[0]}`,
      );
    }
    const parsed = pricesFile.safeParse(doc);
    if (!parsed.success)
      throw new UsageError(
        `--prices ${flags.file}: ${parsed.error.issues
          .map((i) => `${i.path.join('.') || '(top level)'}: ${i.message}`)
          .join('; ')}`,
      );
    file = parsed.data;
  }
  return {
    currency: flags.currency ?? file.currency ?? 'USD',
    rollout: {
      nodeHourPrice:
        number('--rollout-price', flags.rolloutPrice, false) ?? file.rollout?.nodeHourPrice ?? null,
      // One rollout node per shard: shards run in parallel, one on each Spot node.
      nodes:
        number('--rollout-nodes', flags.rolloutNodes, true) ??
        file.rollout?.nodes ??
        spec?.rolloutShards ??
        1,
    },
    train: {
      nodeHourPrice: number('--train-price', flags.trainPrice, false) ?? file.train?.nodeHourPrice ?? null,
      nodes: number('--train-nodes', flags.trainNodes, true) ?? file.train?.nodes ?? 1,
    },
  };
}
