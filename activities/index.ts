// The activities a shipped worker registers. The data plane (object store, native rollout and
// trainer launches, verifiers) is not built yet: until it is, every activity fails at once with
// a non-retryable error saying so, and the campaign pauses itself with that reason. Nothing
// here pretends to do work.
import { ApplicationFailure } from '@temporalio/activity';
import type { CampaignActivities } from './types.js';

export const notBuiltErrorType = 'NotBuilt';

function notBuilt(activity: keyof CampaignActivities): never {
  throw ApplicationFailure.create({
    type: notBuiltErrorType,
    nonRetryable: true,
    message: `activity ${activity} is not built yet: the data plane (store, rollout, reward, trainer launch) has not landed`,
  });
}

export function createActivities(): CampaignActivities {
  return {
    preparePolicy: async () => notBuilt('preparePolicy'),
    rolloutShard: async () => notBuilt('rolloutShard'),
    computeRewards: async () => notBuilt('computeRewards'),
    updatePolicy: async () => notBuilt('updatePolicy'),
    commitCheckpoint: async () => notBuilt('commitCheckpoint'),
  };
}
