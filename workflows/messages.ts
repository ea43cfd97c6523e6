// Messages a campaign accepts: wire names are the constant names minus their suffix.
import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';
import type { CampaignChange } from './spec.js';
import type { CampaignState, HyperparameterChange } from './types.js';

/** Pause at the next stage boundary; running stages finish first. */
export const pauseSignal = defineSignal<[{ reason?: string }]>('pause');
/** Resume a paused campaign (also retries an iteration whose stage failed for good). */
export const resumeSignal = defineSignal<[{ reason?: string }]>('resume');

export interface SetHyperparametersInput {
  changes: CampaignChange;
  reason?: string;
}
/** Change hyperparameters; the accepted change is recorded with the first iteration it applies to. */
export const setHyperparametersUpdate = defineUpdate<HyperparameterChange, [SetHyperparametersInput]>(
  'setHyperparameters',
);

export const statusQuery = defineQuery<CampaignState>('status');
