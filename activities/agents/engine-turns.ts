// An episode's policy on an OpenAI-compatible rollout engine (engines/openai.ts): each turn is
// one completion whose prompt is every id of the episode so far, sent as token ids, so the ids
// the server continues are exactly the episode's (no text goes back and forth) and its prefix
// cache holds the history; only the new turn is computed. Each turn has its own seed, drawn from
// the sample's: a turn asked again (a chunk redone) asks for the same tokens.
import { createHash } from 'node:crypto';
import type { RolloutEngine } from '../engines/types.js';
import type { TurnGenerator } from './episode.js';

export interface EngineTurnOptions {
  engine: RolloutEngine;
  temperature: number;
  topP: number;
  /** The sample's seed (rollout-generators.ts completionSeed). */
  seed: number;
  /** Ids that end a turn (the model's end-of-turn and eos ids), where the engine takes them. */
  stopTokenIds?: readonly number[];
  decode: (tokens: readonly number[]) => string;
}

/** The seed of turn `turn` (0-based) of a sample: turn 0 keeps the sample's own. */
export function turnSeed(seed: number, turn: number): number {
  if (turn === 0) return seed;
  return (
    createHash('sha256')
      .update(JSON.stringify([seed, turn]))
      .digest()
      .readUInt32BE(0) & 0x7fffffff
  );
}

export function engineTurnGenerator(opts: EngineTurnOptions): TurnGenerator {
  const history: number[] = [];
  let turn = 0;
  return {
    async generate(appended, maxNewTokens, signal) {
      history.push(...appended);
      const completion = await opts.engine.complete(
        {
          promptTokens: [...history],
          maxTokens: maxNewTokens,
          temperature: opts.temperature,
          topP: opts.topP,
          seed: turnSeed(opts.seed, turn++),
          ...(opts.stopTokenIds ? { stopTokenIds: opts.stopTokenIds } : {}),
        },
        signal,
      );
      history.push(...completion.tokens);
      return {
        tokens: completion.tokens,
        logprobs: completion.logprobs,
        stopped: completion.finishReason === 'stop',
      };
    },
    replay(appended, generated) {
      history.push(...appended, ...generated.tokens);
      turn++;
    },
    decode: opts.decode,
  };
}
