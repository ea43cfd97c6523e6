// The activities a worker registers, built from their dependencies. Failures are mapped to
// Temporal's retry semantics in one place: bad input, rejected credentials and other store
// failures that cannot go away by themselves are not retried; an unreachable store, a crashed
// tool or a lost rank is.
import { ApplicationFailure } from '@temporalio/common';
import { Context } from '@temporalio/activity';
import { commitCheckpoint } from './checkpoints.js';
import { withHeartbeat } from './heartbeat.js';
import type { ActivityDeps } from './deps.js';
import { DatasetChangedError, DatasetError } from './datasets/index.js';
import { exportPolicy } from './export.js';
import { prepareInputs } from './inputs.js';
import { computeRewards } from './reward.js';
import { BadInputError, RewardModelError, toApplicationFailure } from './rewards/errors.js';
import { rolloutShard, validationShard } from './rollout.js';
import { scoreValidation } from './validation.js';
import { StoreAuthError, StoreError, StoreNotFoundError } from './store/index.js';
import { badInputErrorType } from './types.js';
import type { CampaignActivities, CheckpointInput, CheckpointOutput } from './types.js';
import { preparePolicy, updatePolicy } from './update.js';

export type { ActivityDeps } from './deps.js';

/** The Temporal failure for an error an activity did not map itself. */
export function toFailure(err: unknown): unknown {
  if (err instanceof ApplicationFailure) return err;
  if (err instanceof StoreAuthError)
    return ApplicationFailure.create({
      type: 'StoreAuth',
      nonRetryable: true,
      message: err.message,
      cause: err,
    });
  // Everything the activities read was written (and committed) before: a missing object is lost data.
  if (err instanceof StoreNotFoundError)
    return ApplicationFailure.create({
      type: badInputErrorType,
      nonRetryable: true,
      message: err.message,
      cause: err,
    });
  if (err instanceof BadInputError || err instanceof RewardModelError) return toApplicationFailure(err);
  if (err instanceof DatasetError || err instanceof DatasetChangedError)
    return ApplicationFailure.create({
      type: err.type,
      nonRetryable: true,
      message: err.message,
      cause: err,
    });
  // Any other store failure retrying cannot help (no such bucket, a malformed key, a request the
  // server rejects): without this it would be retried, for rollouts without end.
  if (err instanceof StoreError && !err.retryable)
    return ApplicationFailure.create({
      type: err.name,
      nonRetryable: true,
      message: err.message,
      cause: err,
    });
  return err;
}

function mapped<I, O>(fn: (deps: ActivityDeps, input: I) => Promise<O>, deps: ActivityDeps) {
  return async (input: I): Promise<O> => {
    try {
      return await fn(deps, input);
    } catch (err) {
      throw toFailure(err);
    }
  };
}

async function commit(deps: ActivityDeps, input: CheckpointInput): Promise<CheckpointOutput> {
  const out = await withHeartbeat(
    () => ({ committing: input.staged.key }),
    () =>
      commitCheckpoint(deps.openStore(input.spec.store), input.staged, {
        meanReward: input.meanReward,
        keepLast: input.spec.retention.keepLast,
        keepBest: input.spec.retention.keepBest,
        keepIteration: input.referenceIteration,
        protectIterations: input.protectIterations ?? [],
        now: new Date(),
      }),
  );
  return { ...out, attempt: Context.current().info.attempt };
}

export function createActivities(deps: ActivityDeps): CampaignActivities {
  return {
    prepareInputs: mapped(prepareInputs, deps),
    preparePolicy: mapped(preparePolicy, deps),
    rolloutShard: mapped(rolloutShard, deps),
    computeRewards: mapped(computeRewards, deps),
    validationShard: mapped(validationShard, deps),
    scoreValidation: mapped(scoreValidation, deps),
    updatePolicy: mapped(updatePolicy, deps),
    commitCheckpoint: mapped(commit, deps),
    exportPolicy: mapped(exportPolicy, deps),
  };
}
