// The rollout role of the engine contract (docs/engines.md#rollout-engines): what the rollout
// activity asks of a sampling engine that runs as a server, whatever engine it is. One file per
// engine kind implements it (openai.ts: any OpenAI-compatible completions server: llama.cpp's
// llama-server, vLLM, SGLang); a server that moerl starts itself has a supervisor beside it
// (llamacpp-server.ts).

/** One sample: a prompt given as token ids, sampled with its own seed. */
export interface CompletionRequest {
  /** The prompt's token ids (the model's own chat template already applied). */
  promptTokens: readonly number[];
  /** New tokens at most. */
  maxTokens: number;
  /** 0 = greedy. */
  temperature: number;
  /** Nucleus mass kept, in (0, 1]; 1 = the whole distribution. */
  topP: number;
  /**
   * The sample's seed, an integer in [0, 2^31 - 1] (llama.cpp reads it as an int32): the same
   * request with the same seed on the same engine gives the same tokens.
   */
  seed: number;
  /** Generate `maxTokens` tokens whatever they are (benchmarks, comparisons). */
  ignoreEos?: boolean;
  /**
   * Token ids that end the completion, where the engine takes them (vLLM, SGLang:
   * `stop_token_ids`). llama.cpp ends on its vocabulary's end-of-generation tokens instead.
   */
  stopTokenIds?: readonly number[];
}

/** Why a completion ended: a stop token (kept in `tokens`), or `maxTokens`. */
export type FinishReason = 'stop' | 'length';

export interface Completion {
  /** The sampled token ids, in order. */
  tokens: number[];
  /**
   * logprobs[i] = log p(tokens[i] | prompt, tokens[<i]) under the engine's model at temperature
   * 1 (the unscaled, untruncated distribution: llama.cpp's pre-sampling probabilities, vLLM's
   * raw_logprobs), one per token, finite.
   */
  logprobs: number[];
  finishReason: FinishReason;
}

/** A sampling engine behind an HTTP endpoint. */
export interface RolloutEngine {
  /** The engine kind, as a spec would name it ("openai"). */
  readonly kind: string;
  /** Where it is, for messages: origin and path, never credentials. */
  readonly endpoint: string;
  /** One completion; throws an EngineError (errors.ts) when it cannot. */
  complete(request: CompletionRequest, signal?: AbortSignal): Promise<Completion>;
  /** Whether the server answers its health check as ready now (false while loading or down). */
  isReady(signal?: AbortSignal): Promise<boolean>;
}

/**
 * Puts new weights behind an engine: an HTTP call where the engine has one (SGLang's
 * update_weights_from_disk, a vLLM server's update endpoint), a restart on the new files where it
 * has none (llama.cpp: llamacpp-server.ts). Resolves once the engine serves the new weights.
 */
export interface WeightsLoader {
  loadWeights(path: string, signal?: AbortSignal): Promise<void>;
}
