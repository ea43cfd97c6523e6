// The export activity: a committed checkpoint of a Hugging Face campaign written as a model folder
// (the spec's `export`), at <to>/<iteration, 6 digits>/, config.json last, while the campaign
// runs, so a serving fleet can pick up each new policy. It runs on a train worker, which has the
// native tools; a retry replaces what an earlier attempt left (a folder without config.json).
import { join } from 'node:path';
import { Context } from '@temporalio/activity';
import { parseModelRef } from '../workflows/spec-model.js';
import { datasetLocation } from './datasets/source.js';
import { withHeartbeat } from './heartbeat.js';
import { exportCheckpoint } from './models/export.js';
import { BadInputError } from './rewards/errors.js';
import type { ActivityDeps } from './deps.js';
import type { ExportInput, ExportOutput, StoreLocation } from './types.js';

/** The store rooted at checkpoint `iteration`'s export folder. */
export function exportLocation(to: string, campaignStore: StoreLocation, iteration: number): StoreLocation {
  const ref = parseModelRef(to);
  if (typeof ref === 'string') throw new BadInputError(`export.to ${to}: ${ref}`);
  const { location, key } = datasetLocation(ref, campaignStore);
  const folder = `${key}/${String(iteration).padStart(6, '0')}`;
  return location.kind === 'fs'
    ? { ...location, path: join(location.path, folder) }
    : { ...location, prefix: location.prefix ? `${location.prefix.replace(/\/+$/, '')}/${folder}` : folder };
}

export async function exportPolicy(deps: ActivityDeps, input: ExportInput): Promise<ExportOutput> {
  const ctx = Context.current();
  const { spec, campaignId, iteration } = input;
  if (!spec.export) throw new BadInputError(`campaign ${campaignId} has no export section`);
  const location = exportLocation(spec.export.to, spec.store, iteration);
  const target = deps.openStore(location);
  const progress = { step: 'download' };
  const result = await withHeartbeat(
    () => progress,
    () =>
      exportCheckpoint({
        store: deps.openStore(spec.store),
        campaignId,
        iteration,
        target: { kind: 'store', store: target },
        replace: true,
        workDir: deps.cacheDir,
        binDir: deps.binDir,
        signal: ctx.cancellationSignal,
        onStep: (line) => (progress.step = line),
      }),
  );
  return { iteration, out: target.describe(), files: result.files.length, attempt: ctx.info.attempt };
}
