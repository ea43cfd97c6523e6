// What `moerl report` reads: the workflow history of every run (cli/history.ts) and, from the
// campaign's store, the per-step training metrics each update left under metrics/<iter>.json.
import type { Client } from '@temporalio/client';
import * as keys from '../../activities/layout.js';
import { openStore } from '../../activities/store/index.js';
import { StoreNotFoundError } from '../../activities/store/errors.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import { CliError } from '../errors.js';
import { historyFromRecords, readCampaignRecords } from '../history.js';
import type { CampaignHistory, CampaignRecords } from '../history.js';

/** One optimizer step as moe_train reports it (rank 0, figures summed over ranks). */
export type TrainStep = Record<string, unknown>;

export interface ReportSource {
  records: CampaignRecords;
  history: CampaignHistory;
  spec: CampaignSpec;
  /** The store the metrics were read from, as `describe()` prints it. */
  store: string;
  /** Per iteration (GRPO updates, iteration ≥ 1): the steps of its metrics file. */
  trainSteps: Map<number, TrainStep[]>;
  /** Iterations with a committed update whose metrics file is not in the store. */
  metricsMissing: number[];
  /** Iterations whose update took no optimizer step (no group's rewards differed). */
  updatesSkipped: number[];
  /** When the source was read (ms): the end of the wall time of a campaign still running. */
  readAt: number;
}

export async function collectReport(
  client: Client,
  id: string,
  opts: { baseDir?: string } = {},
): Promise<ReportSource> {
  const records = await readCampaignRecords(client, id);
  const spec = records.input?.spec;
  if (!spec) throw new CliError(`campaign "${id}" has no start input in its history`);
  const history = historyFromRecords(records);
  const store = openStore(spec.store, { baseDir: opts.baseDir });
  const trainSteps = new Map<number, TrainStep[]>();
  const metricsMissing: number[] = [];
  const updatesSkipped: number[] = [];
  for (const it of history.iterations) {
    if (it.iteration < 1 || it.trainMetrics === null) continue;
    const key = keys.metricsKey(id, it.iteration);
    try {
      const doc = JSON.parse((await store.get(key)).toString('utf8')) as { steps?: unknown };
      if (!Array.isArray(doc.steps)) throw new CliError(`${store.describe()}: ${key}: no "steps" list`);
      const steps = doc.steps.filter(
        (s): s is TrainStep => typeof s === 'object' && s !== null && !('skipped' in s),
      );
      if (steps.length === 0) updatesSkipped.push(it.iteration);
      trainSteps.set(it.iteration, steps);
    } catch (err) {
      if (err instanceof StoreNotFoundError) metricsMissing.push(it.iteration);
      else if (err instanceof SyntaxError) throw new CliError(`${store.describe()}: ${key}: ${err.message}`);
      else throw err;
    }
  }
  return {
    records,
    history,
    spec,
    store: store.describe(),
    trainSteps,
    metricsMissing,
    updatesSkipped,
    readAt: Date.now(),
  };
}
