// Errors of the rollout engines. Like the reward stage's (rewards/errors.ts), each carries
// `type` (the Temporal failure type) and `nonRetryable`, so the rollout activity can throw it as
// an ApplicationFailure without guessing: a server that breaks the protocol pauses the campaign
// with the reason, a server that is down is retried.
import { badInputErrorType } from '../types.js';

/** Type of an engine failure that retrying later may fix (down, restarting, 5xx, timeout). */
export const engineUnavailableErrorType = 'RolloutEngineUnavailable';

/**
 * Type of an engine that answered against the protocol (a 2xx whose body is not JSON, has no
 * completion, no log-probs or log-probs that do not match the tokens; a redirect; a body over
 * the size limit): asking again gets the same answer, so the campaign pauses with the reason.
 */
export const engineProtocolErrorType = 'RolloutEngineProtocol';

/**
 * Why a request failed: `unavailable` may pass (retried), `rejected` is a 4xx answer to this
 * request (bad input: a prompt too long for the server's context, a token outside the vocabulary),
 * `protocol` a server that broke docs/engines.md's rollout contract.
 */
export type EngineFailureKind = 'unavailable' | 'rejected' | 'protocol';

export class EngineError extends Error {
  override name = 'EngineError';
  readonly type: string;
  readonly nonRetryable: boolean;
  constructor(
    message: string,
    readonly kind: EngineFailureKind,
    readonly details: { status?: number; attempts: number } = { attempts: 1 },
  ) {
    super(message);
    this.nonRetryable = kind !== 'unavailable';
    this.type = {
      unavailable: engineUnavailableErrorType,
      rejected: badInputErrorType,
      protocol: engineProtocolErrorType,
    }[kind];
  }
}
