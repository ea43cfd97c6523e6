// The episodes of an agentic campaign's rollout shard (spec `agent`, docs/agents.md): a row whose
// data_source has an environment is sampled as an episode on the shard's OpenAI-compatible engine
// instead of as one completion; its record carries the loss mask and the episode record beside
// the usual fields. One sandboxed tools pool per shard, closed with it.
import type { RolloutEngine } from '../engines/types.js';
import type { HfTokenizer } from '../models/tokenizer.js';
import { agentEnvironment, type AgentEnvironmentSpec, type AgentSpec } from '../../workflows/spec-agent.js';
import { engineTurnGenerator } from './engine-turns.js';
import { runEpisode, type EpisodeRecord } from './episode.js';
import { builtinToolSchemas, sandboxToolRunner, type SandboxToolRunner } from './sandbox-tools.js';
import { ToolCallParser, type ToolSchema } from './tool-calls.js';
import { environmentTurnIds } from './turn-render.js';

/** The schemas of an environment's tools, in the order it names them: the prompt's `tools`. */
export function environmentTools(env: AgentEnvironmentSpec): ToolSchema[] {
  if (env.functions) return env.functions as ToolSchema[];
  return (env.builtin ?? []).map((name) => builtinToolSchemas.find((t) => t.function.name === name)!);
}

/** The tools a row of `dataSource` is rendered with, or undefined (a one-shot completion). */
export function promptTools(agent: AgentSpec | undefined, dataSource: string): ToolSchema[] | undefined {
  const env = agentEnvironment(agent, dataSource);
  return env ? environmentTools(env) : undefined;
}

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
  /** Per environment of the spec: its tools' schemas, their parser and their sandboxed pool. */
  private readonly environments = new Map<
    AgentEnvironmentSpec,
    { tools: ToolSchema[]; parser: ToolCallParser; pool: SandboxToolRunner }
  >();

  constructor(private readonly opts: ShardEpisodesOptions) {}

  /** Whether rows of `dataSource` are episodes. */
  isEpisode(dataSource: string): boolean {
    return agentEnvironment(this.opts.agent, dataSource) !== undefined;
  }

  private environment(env: AgentEnvironmentSpec) {
    let made = this.environments.get(env);
    if (!made) {
      const tools = environmentTools(env);
      // A call is stopped where the episode stops waiting for it.
      const timeoutMs = this.opts.agent.toolCallSeconds * 1000;
      made = {
        tools,
        parser: new ToolCallParser(tools, this.opts.agent.toolCallFormat),
        pool: sandboxToolRunner(env.file ? { timeoutMs, tools: { file: env.file, tools } } : { timeoutMs }),
      };
      this.environments.set(env, made);
    }
    return made;
  }

  async sample(promptTokens: readonly number[], dataSource: string, seed: number, signal: AbortSignal) {
    const { agent, tokenizer } = this.opts;
    const env = agentEnvironment(agent, dataSource);
    if (!env) throw new Error(`data source ${dataSource} has no environment`);
    const { tools, parser, pool } = this.environment(env);
    const policy = engineTurnGenerator({
      engine: this.opts.engine,
      ...this.opts.sampling,
      seed,
      stopTokenIds: tokenizer.eosTokenIds,
      decode: (ids) => tokenizer.decode(ids),
    });
    const episode = await runEpisode(promptTokens, {
      policy,
      parser,
      tools: pool,
      renderEnvironmentTurn: (messages) => environmentTurnIds(tokenizer, messages, { tools }),
      limits: {
        maxTurns: agent.maxTurns,
        maxTokens: agent.maxEpisodeTokens ?? this.opts.maxNewTokens * agent.maxTurns,
        contextLength: this.opts.contextLength,
        toolCallMs: agent.toolCallSeconds * 1000,
        episodeMs: agent.episodeSeconds * 1000,
      },
      signal,
    });
    const sample: EpisodeSample = {
      tokens: episode.tokens,
      logprobs: episode.logprobs,
      loss_mask: episode.lossMask,
      episode: episode.record,
      finishReason: episode.record.end_reason === 'answered' ? 'stop' : 'length',
    };
    return sample;
  }

  close(): void {
    for (const { pool } of this.environments.values()) pool.close();
  }
}

/** One line on a chunk's episodes for the worker's log: turns, end reasons, calls, errors, tool time. */
export function describeEpisodes(records: readonly EpisodeRecord[]): string {
  const count = (into: Record<string, number>, key: string) => (into[key] = (into[key] ?? 0) + 1);
  const ends: Record<string, number> = {};
  const calls: Record<string, number> = {};
  const errors: Record<string, number> = {};
  let turns = 0;
  let toolMs = 0;
  for (const r of records) {
    count(ends, r.end_reason);
    for (const turn of r.turns) {
      if (turn.role === 'policy') turns++;
      else
        for (const c of turn.calls) {
          count(calls, c.name || '(unnamed)');
          if (c.error) count(errors, c.error);
          toolMs += c.latencyMs;
        }
    }
  }
  const perEpisode = records.length ? (turns / records.length).toFixed(2) : '0';
  return (
    `${records.length} episodes, ${perEpisode} policy turns each, ended ${JSON.stringify(ends)}, ` +
    `calls ${JSON.stringify(calls)}, errors ${JSON.stringify(errors)}, tool time ${(toolMs / 1000).toFixed(2)} s`
  );
}
