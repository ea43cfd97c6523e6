// One multi-turn episode, token in and token out (docs/agents.md). The policy generates until its
// turn ends; a turn with tool calls has them run and their results appended as the environment's
// turn (rendered ids, never re-tokenized text), a turn without any ends the episode. Every limit
// ends the episode with its reason. The engine behind TurnGenerator keeps its own KV cache: it is
// given only the ids appended since its last turn. The record is what training and the report
// read: the completion ids, their behaviour log-probs, the loss mask (1 on the policy's ids) and
// the turns with their token ranges and tool calls.
import type { ChatMessage } from '../models/chat-template.js';
import type { ToolCall, ToolCallError, ToolCallParser } from './tool-calls.js';

/** Version of EpisodeRecord as it is stored on a rollout line (`episode`). */
export const episodeFormatVersion = 1;

export const episodeEndReasons = [
  'answered', // a policy turn without tool calls
  'max-turns',
  'max-tokens', // the episode's completion budget
  'context-length', // the next turn would not fit the model's context
  'episode-time',
  // a call to a tool not declared idempotent was sent by a worker that died before its outcome
  // was journaled: sending it again might do twice what it does (docs/agents.md, the journal)
  'tool-outcome-unknown',
  'environment-done', // the environment (an OpenEnv episode) said it is over
  // the environment's session was lost and could not be driven back to where it was
  'environment-lost',
] as const;
export type EpisodeEndReason = (typeof episodeEndReasons)[number];

/** The policy side of an episode: one engine session whose KV cache holds every id so far. */
export interface TurnGenerator {
  /**
   * Appends `appended` (the prompt first, then each environment turn) and samples until an
   * end-of-turn id or `maxNewTokens`; `stopped` says it ended on an end-of-turn id.
   */
  generate(appended: readonly number[], maxNewTokens: number, signal: AbortSignal): Promise<PolicyTurn>;
  /**
   * Appends `appended` and a turn taken from the journal, as if it had been generated: the
   * session's history (its KV cache) holds it, nothing is sampled.
   */
  replay(appended: readonly number[], turn: PolicyTurn): void;
  /** The text of generated ids (parsed for tool calls only: nothing decoded is encoded again). */
  decode(tokens: readonly number[]): string;
}

export interface PolicyTurn {
  tokens: number[];
  logprobs: number[];
  stopped: boolean;
}

/** What runs the calls of one episode (sandboxed tools, an MCP server, an environment). */
export interface ToolRunner {
  /**
   * Resolves with the result text; rejects (or is aborted at the time limit) on failure. `key`,
   * the call's idempotency key, is the same each time this call of this episode is sent.
   */
  call(
    name: string,
    args: Record<string, unknown>,
    signal: AbortSignal,
    key?: string,
  ): Promise<string | EnvironmentStep>;
  /** Whether sending a call of `name` twice does what sending it once does. */
  idempotent(name: string): boolean;
  /**
   * Told of a call of this episode read back from the journal instead of sent: an environment
   * with state of its own (OpenEnv) drives a new session through it when it needs one.
   */
  replayed?(name: string, args: Record<string, unknown>, outcome: ToolCallRecord): void;
}

/** What a call to an environment with state returns: its observation, reward and whether it is over. */
export interface EnvironmentStep {
  text: string;
  reward?: number;
  done?: boolean;
  /** The session was lost and could not be brought back: the episode ends `environment-lost`. */
  lost?: boolean;
}

/**
 * An episode's view of its chunk's journal (journal.ts): what earlier attempts recorded, read
 * back instead of generated or called, and where this attempt records its own turns. A write
 * resolves once its entry is in the store; the episode goes on only then.
 */
export interface EpisodeJournal {
  /** Wall time of the episode when its last journaled entry was written (0 for none). */
  readonly elapsedMs: number;
  policyTurn(turn: number): JournaledPolicyTurn | undefined;
  /** Call `call` of turn `turn`: its outcome, its intent alone (sent, no outcome), or nothing. */
  call(turn: number, call: number): { outcome: ToolCallRecord } | { intent: true } | undefined;
  write(entry: EpisodeJournalEntry): Promise<void>;
}

/** A policy turn as journaled: what was generated and how long it took. */
export type JournaledPolicyTurn = PolicyTurn & { latencyMs: number };

export type EpisodeJournalEntry =
  | ({ kind: 'policy'; turn: number; elapsedMs: number } & JournaledPolicyTurn)
  | { kind: 'intent'; turn: number; call: number; name: string; key?: string; elapsedMs: number }
  | { kind: 'outcome'; turn: number; call: number; outcome: ToolCallRecord; elapsedMs: number };

export interface EpisodeLimits {
  maxTurns: number;
  /** Completion ids of the whole episode, the policy's and the environment's. */
  maxTokens: number;
  /** The model's context: prompt and completion. */
  contextLength: number;
  toolCallMs: number;
  episodeMs: number;
}

export interface ToolCallRecord {
  name: string;
  arguments: unknown;
  /** The text the tool turn shows for this call: its result or its error. */
  result: string;
  /** Why the call did not run or failed; absent when it returned. */
  error?: ToolCallError['kind'] | 'failed' | 'timeout' | 'outcome-unknown' | 'environment-lost';
  latencyMs: number;
  /** An environment's reward for this step, and whether it ended the episode (OpenEnv). */
  reward?: number;
  done?: boolean;
}

/** A turn's ids are completion[start, end). */
export type EpisodeTurn =
  | {
      role: 'policy';
      start: number;
      end: number;
      /** Generation time (absent on older lines). */ latencyMs?: number;
    }
  | { role: 'environment'; start: number; end: number; calls: ToolCallRecord[] };

export interface EpisodeRecord {
  version: typeof episodeFormatVersion;
  end_reason: EpisodeEndReason;
  turns: EpisodeTurn[];
  /** The rewards an environment gave the episode's steps, summed (absent when none gave one). */
  environment_reward?: number;
}

export interface Episode {
  /** Completion ids after the prompt: policy and environment turns in order. */
  tokens: number[];
  /** Behaviour log-prob of each policy id; 0 on the environment's. */
  logprobs: number[];
  /** 1 on the policy's ids (trained), 0 on the environment's. */
  lossMask: number[];
  record: EpisodeRecord;
}

export interface EpisodeOptions {
  policy: TurnGenerator;
  parser: ToolCallParser;
  tools: ToolRunner;
  /** The ids of an environment turn (helper: activities/agents/turn-render.ts). */
  renderEnvironmentTurn: (messages: ChatMessage[]) => number[];
  limits: EpisodeLimits;
  /** Aborts the episode from outside (the activity was cancelled); rejects with its reason. */
  signal?: AbortSignal;
  /** The clock of tool latencies and of the journal's elapsed times. */
  now?: () => number;
  /**
   * Where the turns are journaled and replayed from (durable episodes); without one nothing is
   * recorded. `callKey` names a call for its idempotency key.
   */
  journal?: EpisodeJournal;
  callKey?: (turn: number, call: number) => string;
  /** Told each policy turn (0-based) as it begins: the shard's heartbeat shows the furthest. */
  onTurn?: (turn: number) => void;
}

export async function runEpisode(promptTokens: readonly number[], opts: EpisodeOptions): Promise<Episode> {
  // A resumed episode has spent what its journal says of its time.
  const spent = opts.journal?.elapsedMs ?? 0;
  const episodeTime = timeLimit(Math.max(0, opts.limits.episodeMs - spent), opts.signal);
  try {
    return await episodeTurns(promptTokens, opts, episodeTime.signal);
  } finally {
    episodeTime.clear();
  }
}

async function episodeTurns(
  promptTokens: readonly number[],
  opts: EpisodeOptions,
  episodeSignal: AbortSignal,
): Promise<Episode> {
  const { policy, parser, limits, journal } = opts;
  const now = opts.now ?? Date.now;
  const startedAt = now() - (journal?.elapsedMs ?? 0);
  const elapsed = () => now() - startedAt;
  const outOfTime = () => episodeSignal.aborted && !opts.signal?.aborted;
  const episode: Episode = {
    tokens: [],
    logprobs: [],
    lossMask: [],
    record: { version: episodeFormatVersion, end_reason: 'answered', turns: [] },
  };
  const end = (reason: EpisodeEndReason) => {
    episode.record.end_reason = reason;
    return episode;
  };
  let appended: readonly number[] = promptTokens;
  for (let turn = 0; ; turn++) {
    if (turn === limits.maxTurns) return end('max-turns');
    const used = promptTokens.length + episode.tokens.length;
    const budget = Math.min(limits.maxTokens - episode.tokens.length, limits.contextLength - used);
    if (budget <= 0) return end(limits.maxTokens <= episode.tokens.length ? 'max-tokens' : 'context-length');
    opts.onTurn?.(turn);
    let generated = journal?.policyTurn(turn);
    if (generated) policy.replay(appended, generated);
    else {
      try {
        const began = now();
        generated = { ...(await policy.generate(appended, budget, episodeSignal)), latencyMs: 0 };
        generated.latencyMs = now() - began;
        await journal?.write({ kind: 'policy', turn, elapsedMs: elapsed(), ...generated });
      } catch (err) {
        if (outOfTime()) return end('episode-time');
        throw err;
      }
    }
    const start = episode.tokens.length;
    episode.tokens.push(...generated.tokens);
    episode.logprobs.push(...generated.logprobs);
    episode.lossMask.push(...generated.tokens.map(() => 1));
    episode.record.turns.push({
      role: 'policy',
      start,
      end: episode.tokens.length,
      latencyMs: generated.latencyMs,
    });
    if (!generated.stopped) {
      const atContext = promptTokens.length + episode.tokens.length >= limits.contextLength;
      return end(atContext ? 'context-length' : 'max-tokens');
    }
    const parsed = parser.parse(policy.decode(generated.tokens));
    if (parsed.calls.length === 0 && parsed.errors.length === 0) return end('answered');

    const calls = await runCalls(parsed, turn, opts, episodeSignal, elapsed);
    opts.signal?.throwIfAborted();
    if (outOfTime()) return end('episode-time');
    const rewards = calls.flatMap((c) => (c.reward !== undefined ? [c.reward] : []));
    if (rewards.length > 0)
      episode.record.environment_reward =
        (episode.record.environment_reward ?? 0) + rewards.reduce((a, b) => a + b);
    const ending = calls.some((c) => c.error === 'outcome-unknown')
      ? 'tool-outcome-unknown'
      : calls.some((c) => c.error === 'environment-lost')
        ? 'environment-lost'
        : calls.some((c) => c.done)
          ? 'environment-done'
          : null;
    if (ending) {
      episode.record.turns.push({
        role: 'environment',
        start: episode.tokens.length,
        end: episode.tokens.length,
        calls,
      });
      return end(ending);
    }
    const messages: ChatMessage[] = calls.map((c) => ({ role: 'tool', name: c.name, content: c.result }));
    const environment = opts.renderEnvironmentTurn(messages);
    if (promptTokens.length + episode.tokens.length + environment.length >= limits.contextLength)
      return end('context-length');
    if (episode.tokens.length + environment.length >= limits.maxTokens) return end('max-tokens');
    const envStart = episode.tokens.length;
    episode.tokens.push(...environment);
    episode.logprobs.push(...environment.map(() => 0));
    episode.lossMask.push(...environment.map(() => 0));
    episode.record.turns.push({ role: 'environment', start: envStart, end: episode.tokens.length, calls });
    appended = environment;
  }
}

// The calls of one turn in the order the model wrote them (a later call may rely on an earlier
// one's effect), bad ones answered with their error text; each within the call time limit. With
// a journal, a call's intent is in the store before it is sent and its outcome before the next
// call; a call journaled whole is not sent again, nor one with an intent alone unless its tool
// is idempotent (then with the same key).
async function runCalls(
  parsed: ReturnType<ToolCallParser['parse']>,
  turn: number,
  opts: EpisodeOptions,
  episodeSignal: AbortSignal,
  elapsed: () => number,
): Promise<ToolCallRecord[]> {
  const { tools, journal } = opts;
  const toolCallMs = opts.limits.toolCallMs;
  const now = opts.now ?? Date.now;
  type Slot = { index: number; run: () => Promise<ToolCallRecord> };
  const send = async (c: ToolCall, key: string | undefined): Promise<ToolCallRecord> => {
    const started = now();
    const callTime = timeLimit(toolCallMs, episodeSignal);
    const signal = callTime.signal;
    const record = { name: c.name, arguments: c.arguments };
    try {
      const answer = await abortable(tools.call(c.name, c.arguments, signal, key), signal);
      if (typeof answer === 'string') return { ...record, result: answer, latencyMs: now() - started };
      return {
        ...record,
        result: answer.text,
        latencyMs: now() - started,
        ...(answer.lost ? { error: 'environment-lost' as const } : {}),
        ...(answer.reward !== undefined ? { reward: answer.reward } : {}),
        ...(answer.done ? { done: true } : {}),
      };
    } catch (err) {
      const timedOut = signal.aborted && !episodeSignal.aborted;
      const why = timedOut
        ? `timed out after ${toolCallMs} ms`
        : `failed: ${(err as Error)?.message ?? String(err)}`;
      return {
        ...record,
        result: `tool "${c.name}" ${why}`,
        error: timedOut ? 'timeout' : 'failed',
        latencyMs: now() - started,
      };
    } finally {
      callTime.clear();
    }
  };
  const slots: Slot[] = [
    ...parsed.errors.map((e) => ({
      index: e.index,
      run: async (): Promise<ToolCallRecord> => ({
        name: e.name ?? '',
        arguments: null,
        result: e.message,
        error: e.kind,
        latencyMs: 0,
      }),
    })),
    ...parsed.calls.map((c) => ({
      index: c.index,
      run: async (): Promise<ToolCallRecord> => {
        const key = opts.callKey?.(turn, c.index);
        const journaled = journal?.call(turn, c.index);
        if (journaled && 'outcome' in journaled) {
          tools.replayed?.(c.name, c.arguments, journaled.outcome);
          return journaled.outcome;
        }
        if (journaled && !tools.idempotent(c.name))
          return {
            name: c.name,
            arguments: c.arguments,
            result: `tool "${c.name}" was called by an attempt that was lost before its outcome was recorded; it is not idempotent, so it is not called again`,
            error: 'outcome-unknown',
            latencyMs: 0,
          };
        if (!journaled)
          await journal?.write({
            kind: 'intent',
            turn,
            call: c.index,
            name: c.name,
            key,
            elapsedMs: elapsed(),
          });
        const outcome = await send(c, key);
        // A call cut short by the episode's end has no outcome to keep.
        if (!episodeSignal.aborted)
          await journal?.write({ kind: 'outcome', turn, call: c.index, outcome, elapsedMs: elapsed() });
        return outcome;
      },
    })),
  ].sort((a, b) => a.index - b.index);
  const records: ToolCallRecord[] = [];
  for (const slot of slots) {
    if (episodeSignal.aborted) break;
    const record = await slot.run();
    records.push(record);
    // The calls after one that ended the episode are not sent.
    if (record.error === 'outcome-unknown' || record.error === 'environment-lost' || record.done) break;
  }
  return records;
}

/** `work`, or a rejection as soon as `signal` aborts (a tool that ignores its signal is not waited for). */
function abortable<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err as Error);
      },
    );
  });
}

/**
 * A signal that aborts after `ms` or with `parent`. Its timer keeps the process alive, unlike
 * AbortSignal.timeout's: a tool that never answers must still be timed out. `clear` when done.
 */
function timeLimit(ms: number, parent?: AbortSignal): { signal: AbortSignal; clear(): void } {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error(`time limit of ${ms} ms`)), ms);
  const onParent = () => controller.abort(parent?.reason);
  if (parent?.aborted) onParent();
  else parent?.addEventListener('abort', onParent, { once: true });
  return {
    signal: controller.signal,
    clear: () => {
      clearTimeout(timer);
      parent?.removeEventListener('abort', onParent);
    },
  };
}

/** The ids of a sample's answer: an episode's last policy turn, or a one-shot completion whole. */
export function answerTokens(sample: { tokens: number[]; episode?: EpisodeRecord }): number[] {
  const turns = sample.episode?.turns;
  if (!turns) return sample.tokens;
  const last = [...turns].reverse().find((t) => t.role === 'policy');
  return last ? sample.tokens.slice(last.start, last.end) : [];
}

/**
 * What is wrong with `value` as the episode record of a rollout line whose completion has
 * `tokens` ids and loss mask `lossMask`, or null. The turns must tile the completion in order,
 * and the mask must be 1 on the policy's turns and 0 on the environment's.
 */
export function episodeRecordProblem(
  value: unknown,
  tokens: number,
  lossMask: readonly number[] | undefined,
): string | null {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return 'must be an object';
  const r = value as Record<string, unknown>;
  if (r.version !== episodeFormatVersion)
    return `version ${JSON.stringify(r.version)} is not one this moerl reads (${episodeFormatVersion})`;
  if (!(episodeEndReasons as readonly unknown[]).includes(r.end_reason))
    return `end_reason ${JSON.stringify(r.end_reason)} is not one of ${episodeEndReasons.join(', ')}`;
  if (!Array.isArray(r.turns) || r.turns.length === 0) return 'turns must be a non-empty array';
  if (lossMask === undefined) return 'an episode needs its loss_mask';
  if (
    r.environment_reward !== undefined &&
    (typeof r.environment_reward !== 'number' || !Number.isFinite(r.environment_reward))
  )
    return 'environment_reward must be a finite number';
  let at = 0;
  for (const [i, turn] of (r.turns as unknown[]).entries()) {
    const t = (turn ?? {}) as Record<string, unknown>;
    if (t.role !== 'policy' && t.role !== 'environment')
      return `turn ${i}: role must be policy or environment`;
    if (
      t.start !== at ||
      !Number.isSafeInteger(t.end) ||
      (t.end as number) < at ||
      (t.end as number) > tokens
    )
      return `turn ${i}: [start, end) must follow the previous turn within the ${tokens} ids (from ${at})`;
    const bit = t.role === 'policy' ? 1 : 0;
    for (let k = at; k < (t.end as number); k++)
      if (lossMask[k] !== bit) return `turn ${i} (${t.role}): loss_mask[${k}] must be ${bit}`;
    if (t.role === 'environment') {
      if (!Array.isArray(t.calls)) return `turn ${i}: calls must be an array`;
      for (const [j, c] of (t.calls as unknown[]).entries()) {
        const call = (c ?? {}) as Record<string, unknown>;
        const latency = call.latencyMs;
        if (typeof call.name !== 'string' || typeof call.result !== 'string')
          return `turn ${i} call ${j}: name and result must be strings`;
        if (typeof latency !== 'number' || !Number.isFinite(latency) || latency < 0)
          return `turn ${i} call ${j}: latencyMs must be a non-negative number`;
      }
    }
    at = t.end as number;
  }
  if (at !== tokens) return `the turns end at id ${at} of ${tokens}`;
  return null;
}

/**
 * The messages of an episode after its prompt, for a reward function over the whole trajectory:
 * each policy turn's text (decoded, special tokens left out) and each call's result.
 */
export function episodeMessages(
  sample: { tokens: number[]; episode: EpisodeRecord },
  decode: (ids: number[]) => string,
): { role: string; content: string; name?: string }[] {
  return sample.episode.turns.flatMap((t) =>
    t.role === 'policy'
      ? [{ role: 'assistant', content: decode(sample.tokens.slice(t.start, t.end)) }]
      : t.calls.map((c) => ({ role: 'tool', name: c.name, content: c.result })),
  );
}
