// Error types of the reward stage. Each carries `type` (the Temporal failure type the campaign
// workflow matches against its non-retryable list) and `nonRetryable`, so an activity can turn
// any of them into an ApplicationFailure without guessing (toApplicationFailure).
import { ApplicationFailure } from '@temporalio/common';
import { badInputErrorType } from '../types.js';

/** Input that can never succeed (a malformed rollout, a prompt of the wrong format, bad options). */
export class BadInputError extends Error {
  readonly type: string = badInputErrorType;
  readonly nonRetryable: boolean = true;
  override name = 'BadInputError';
}

/** Where a bad rollout was found; every field that is known is named in the message too. */
export interface RolloutLocation {
  /** File name or store key the line came from. */
  source?: string;
  /** 1-based line number in the source. */
  line?: number;
  /** The record field that is wrong. */
  field?: string;
  task?: string;
  prompt?: string;
  prompt_id?: number;
  sample_index?: number;
}

/** A rollout record or prompt that does not follow docs/native-model.md or docs/tasks.md. */
export class BadRolloutError extends BadInputError {
  override name = 'BadRolloutError';
  constructor(
    message: string,
    readonly location: RolloutLocation = {},
  ) {
    super(message);
  }

  /** The same error with more of its location known; the message gains a `where: ` prefix. */
  at(where: string, location: RolloutLocation): BadRolloutError {
    return new BadRolloutError(`${where}: ${this.message}`, { ...this.location, ...location });
  }
}

/** Type of a reward-model failure that retrying later may fix (server down, timeouts, 5xx). */
export const rewardModelErrorType = 'RewardModelError';

/**
 * Type of a reward model that answered against the protocol (a 2xx with a malformed body, a
 * redirect, a body over the size limit): not retried, so the campaign pauses with the reason.
 */
export const rewardModelProtocolErrorType = 'RewardModelProtocol';

/**
 * The HTTP reward model failed. Non-retryable when the server rejected the request with a 4xx
 * (type BadInput: the same request will be rejected again) or broke the protocol (type
 * RewardModelProtocol: the server needs fixing); retryable (type RewardModelError) otherwise.
 */
export class RewardModelError extends Error {
  override name = 'RewardModelError';
  readonly type: string;
  readonly nonRetryable: boolean;
  constructor(
    message: string,
    readonly details: { status?: number; attempts: number; nonRetryable: boolean; protocol?: boolean },
  ) {
    super(message);
    this.nonRetryable = details.nonRetryable || details.protocol === true;
    this.type = details.protocol
      ? rewardModelProtocolErrorType
      : details.nonRetryable
        ? badInputErrorType
        : rewardModelErrorType;
  }
}

/**
 * The failure an activity should throw for `err`: errors of this module keep their type and
 * retryability; anything else is returned unchanged (Temporal treats it as retryable).
 */
export function toApplicationFailure(err: unknown): unknown {
  if (err instanceof BadInputError || err instanceof RewardModelError) {
    return ApplicationFailure.create({
      message: err.message,
      type: err.type,
      nonRetryable: err.nonRetryable,
      cause: err,
    });
  }
  return err;
}
