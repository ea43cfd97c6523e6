// The episodes of an agentic campaign's rollout shard (spec `agent`, docs/agents.md): a row whose
// data_source has an environment is sampled as an episode on the shard's OpenAI-compatible engine
// instead of as one completion; its record carries the loss mask and the episode record beside
// the usual fields. The shard's environments (environments.ts) run the calls.
import { createHash } from 'node:crypto';
import type { RolloutEngine } from '../engines/types.js';
import type { HfTokenizer } from '../models/tokenizer.js';
import type { AgentSpec } from '../../workflows/spec-agent.js';
import { engineTurnGenerator } from './engine-turns.js';
import type { ShardEnvironments } from './environments.js';
import { runEpisode, type EpisodeJournal, type EpisodeRecord } from './episode.js';
import { environmentTurnIds } from './turn-render.js';

export interface EpisodeSample {
  tokens: number[];
  logprobs: number[];
  loss_mask: number[];
  episode: EpisodeRecord;
  finishReason: 'stop' | 'length';
}

export interface ShardEpisodesOptions {
  agent: AgentSpec;
  engine: RolloutEngine;
  tokenizer: HfTokenizer;
  sampling: { temperature: number; topP: number };
  /** The policy's context (its checkpoint's max_seq_len). */
  contextLength: number;
  /** The spec's maxNewTokens: with maxTurns, an episode's default budget. */
  maxNewTokens: number;
}

export class ShardEpisodes {
  constructor(
    private readonly opts: ShardEpisodesOptions,
    private readonly environments: ShardEnvironments,
  ) {}

  /**
   * One episode of a row of `dataSource`, journaled turn by turn in `durable.journal` (and read
   * back from it); `durable.id` names the episode in its calls' idempotency keys; `onTurn` is
   * told each policy turn (0-based) as it begins.
   */
  async sample(
    promptTokens: readonly number[],
    dataSource: string,
    seed: number,
    signal: AbortSignal,
    durable: { journal: EpisodeJournal; id: string; onTurn?: (turn: number) => void },
  ) {
    const { agent, tokenizer } = this.opts;
    const env = await this.environments.of(dataSource);
    if (!env) throw new Error(`data source ${dataSource} has no environment`);
    const { tools, parser } = env;
    // An environment with state gives each episode a session of its own.
    const session = env.runner.episode?.(seed);
    const runner = session ?? env.runner;
    const policy = engineTurnGenerator({
      engine: this.opts.engine,
      ...this.opts.sampling,
      seed,
      stopTokenIds: tokenizer.eosTokenIds,
      decode: (ids) => tokenizer.decode(ids),
    });
    let episode;
    try {
      episode = await runEpisode(promptTokens, {
        policy,
        parser,
        tools: runner,
        renderEnvironmentTurn: (messages) => environmentTurnIds(tokenizer, messages, { tools }),
        limits: {
          maxTurns: agent.maxTurns,
          maxTokens: agent.maxEpisodeTokens ?? this.opts.maxNewTokens * agent.maxTurns,
          contextLength: this.opts.contextLength,
          toolCallMs: agent.toolCallSeconds * 1000,
          episodeMs: agent.episodeSeconds * 1000,
        },
        signal,
        journal: durable.journal,
        ...(durable.onTurn ? { onTurn: durable.onTurn } : {}),
        callKey: (turn, call) => callIdempotencyKey(durable.id, turn, call),
      });
    } finally {
      await session?.close();
    }
    const sample: EpisodeSample = {
      tokens: episode.tokens,
      logprobs: episode.logprobs,
      loss_mask: episode.lossMask,
      episode: episode.record,
      // An episode that ended as it should (an answer, the environment's end) stopped; any limit cut it.
      finishReason:
        episode.record.end_reason === 'answered' || episode.record.end_reason === 'environment-done'
          ? 'stop'
          : 'length',
    };
    return sample;
  }
}

/** The idempotency key of call `call` of turn `turn` of episode `episode`: the same on every attempt. */
export function callIdempotencyKey(episode: string, turn: number, call: number): string {
  return createHash('sha256')
    .update(JSON.stringify([episode, turn, call]))
    .digest('hex')
    .slice(0, 32);
}
