// One line of a rollout chunk (docs/native-model.md, "Rollout JSONL") parsed and checked into a
// typed record. Every error is a BadRolloutError naming the source, the line and the field:
// a malformed rollout is bad input, and regenerating the same chunk would write it again.
import { episodeRecordProblem, type EpisodeRecord } from '../agents/episode.js';
import { BadRolloutError } from './errors.js';

export const finishReasons = ['stop', 'length'] as const;
export type FinishReason = (typeof finishReasons)[number];

/** Token id of <eos> of the built-in tasks' tokenizer; a sample that finished with "stop" ends with it. */
export const eosTokenId = 1;

export interface ParseOptions {
  /** The ids a "stop" sample may end with: a Hugging Face model's own (default: the built-in <eos>). */
  eosIds?: readonly number[];
}

/** One generated sample; field names are the JSONL keys. */
export interface RolloutRecord {
  prompt_id: number;
  sample_index: number;
  iteration: number;
  task: string;
  prompt: string;
  prompt_tokens: number[];
  /** Generated ids, ending with <eos> when finish_reason is "stop". */
  tokens: number[];
  /** Decoded completion, up to but not including <eos>. */
  text: string;
  /** Behaviour log-prob of each entry of `tokens`. */
  logprobs: number[];
  finish_reason: FinishReason;
  /**
   * 1 where `tokens[i]` is the policy's own (trained), 0 where an environment wrote it (a tool
   * result of a multi-turn episode); absent for a one-shot completion, where all are trained.
   */
  loss_mask?: number[];
  /** A multi-turn episode's turns and tool calls (docs/agents.md); `loss_mask` goes with it. */
  episode?: EpisodeRecord;
}

/** Where a line came from, for error messages. */
export interface LineLocation {
  /** File name or store key. */
  source: string;
  /** 1-based line number. */
  line: number;
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function describe(value: Json | undefined): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object') return 'an object';
  const text = typeof value === 'number' ? String(value) : JSON.stringify(value);
  return `${typeof value} ${text.length > 40 ? `${text.slice(0, 40)}...` : text}`;
}

function isCount(value: Json | undefined): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

function isFiniteNumber(value: Json | undefined): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

function isFinishReason(value: string): value is FinishReason {
  return (finishReasons as readonly string[]).includes(value);
}

/** Parses one rollout JSONL line; throws BadRolloutError naming source, line and field. */
export function parseRolloutLine(text: string, at: LineLocation, opts: ParseOptions = {}): RolloutRecord {
  const where = `${at.source} line ${at.line}`;
  // Annotated so that TypeScript narrows after `if (...) fail(...)`.
  const fail: (message: string, field?: string) => never = (message, field) => {
    throw new BadRolloutError(`malformed rollout: ${where}: ${message}`, {
      source: at.source,
      line: at.line,
      ...(field === undefined ? {} : { field }),
    });
  };

  let parsed: Json;
  try {
    parsed = JSON.parse(text) as Json;
  } catch (err) {
    fail(`not valid JSON (${(err as Error).message})`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    fail(`expected a JSON object, got ${describe(parsed)}`);
  }
  const obj = parsed;
  const field = (name: string): Json => {
    const value = obj[name];
    if (value === undefined) fail(`missing field "${name}"`, name);
    return value;
  };
  const count = (name: string): number => {
    const value = field(name);
    if (!isCount(value)) fail(`field "${name}" must be a non-negative integer, got ${describe(value)}`, name);
    return value;
  };
  const string = (name: string): string => {
    const value = field(name);
    if (typeof value !== 'string') fail(`field "${name}" must be a string, got ${describe(value)}`, name);
    return value;
  };
  const numbers = (name: string, what: string, ok: (x: Json) => x is number): number[] => {
    const value = field(name);
    if (!Array.isArray(value))
      fail(`field "${name}" must be an array of ${what}, got ${describe(value)}`, name);
    const bad = value.findIndex((x) => !ok(x));
    if (bad >= 0) {
      fail(`field "${name}" must be an array of ${what}; element ${bad} is ${describe(value[bad])}`, name);
    }
    return value as number[];
  };
  const finishReason = (): FinishReason => {
    const value = string('finish_reason');
    if (!isFinishReason(value)) {
      const allowed = finishReasons.map((r) => `"${r}"`).join(', ');
      fail(`field "finish_reason" must be one of ${allowed}, got ${JSON.stringify(value)}`, 'finish_reason');
    }
    return value;
  };

  const record: RolloutRecord = {
    prompt_id: count('prompt_id'),
    sample_index: count('sample_index'),
    iteration: count('iteration'),
    task: string('task'),
    prompt: string('prompt'),
    prompt_tokens: numbers('prompt_tokens', 'token ids', isCount),
    tokens: numbers('tokens', 'token ids', isCount),
    text: string('text'),
    // A literal such as 1e400 parses to Infinity, so finiteness is checked, not assumed.
    logprobs: numbers('logprobs', 'finite numbers', isFiniteNumber),
    finish_reason: finishReason(),
  };
  if (record.logprobs.length !== record.tokens.length) {
    fail(
      `field "logprobs" has ${record.logprobs.length} entries for ${record.tokens.length} tokens`,
      'logprobs',
    );
  }
  if (obj.loss_mask !== undefined) {
    const isBit = (x: Json): x is number => x === 0 || x === 1;
    record.loss_mask = numbers('loss_mask', '0 (an environment token) or 1 (the policy token)', isBit);
    if (record.loss_mask.length !== record.tokens.length)
      fail(
        `field "loss_mask" has ${record.loss_mask.length} entries for ${record.tokens.length} tokens`,
        'loss_mask',
      );
  }
  if (obj.episode !== undefined) {
    const problem = episodeRecordProblem(obj.episode, record.tokens.length, record.loss_mask);
    if (problem) fail(`field "episode": ${problem}`, 'episode');
    record.episode = obj.episode as unknown as EpisodeRecord;
  }
  const eosIds = opts.eosIds ?? [eosTokenId];
  if (record.finish_reason === 'stop' && !eosIds.includes(record.tokens[record.tokens.length - 1] ?? -1)) {
    const ids = eosIds.length === 1 ? `<eos> (id ${eosIds[0]})` : `a stop id (${eosIds.join(', ')})`;
    fail(`field "tokens" must end with ${ids} when finish_reason is "stop"`, 'tokens');
  }
  return record;
}
