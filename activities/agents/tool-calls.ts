// The tool calls in a policy model's turn of a multi-turn agentic rollout: the turn's generated
// text is parsed in the model's own format (Hermes-style `<tool_call>` blocks, or Mistral's
// `[TOOL_CALLS]` array) and each call is checked against the tools the chat template was given
// (known name, arguments valid under the tool's JSON Schema). The text is untrusted, so nothing
// here throws on it: every problem becomes a ToolCallError whose message is short enough to be
// shown to the model as its tool turn, the way real agents answer a bad call. Only a bad tool
// list or bad limits (the campaign author's input) throw. Sizes and nesting are bounded before
// anything recursive (ajv, JSON.stringify) sees a call.
import { Ajv, type ValidateFunction } from 'ajv';
import { maxNestingDepth, measureValue } from '../datasets/limits.js';
import { BadInputError } from '../rewards/errors.js';

/**
 * How a model writes its tool calls:
 * - `hermes` (Qwen3, Qwen2.5, Hermes chat templates): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
 *   blocks anywhere in the text; the text outside them is the turn's content.
 * - `mistral` (Mistral / Mixtral v3 tokenizers): `[TOOL_CALLS]` then a JSON array of
 *   `{"name": ..., "arguments": {...}, "id"?: ...}`; the text before it is the content.
 */
export type ToolCallFormat = 'hermes' | 'mistral';

export const toolCallFormats: readonly ToolCallFormat[] = ['hermes', 'mistral'];

/** A tool in OpenAI's function-calling form: the same list a chat template receives as `tools`. */
export interface ToolSchema {
  type: 'function';
  function: {
    name: string;
    description?: string;
    /** JSON Schema of the arguments object; absent, any object is accepted. */
    parameters?: object;
  };
}

/** A well-formed call of a declared tool, its arguments valid under the tool's schema. */
export interface ToolCall {
  /** Position among the turn's calls, from 0 (messages count from 1, as a reader does). */
  index: number;
  name: string;
  arguments: Record<string, unknown>;
  /** The id the model gave the call (Mistral's format has one), when it gave a string. */
  id?: string;
}

export type ToolCallErrorKind =
  | 'bad-json'
  | 'unclosed'
  | 'not-an-object'
  | 'missing-name'
  | 'unknown-tool'
  | 'bad-arguments'
  | 'too-many-calls'
  | 'too-large'
  | 'too-deep';

/** A call that cannot be run, and why, in words meant for the model. */
export interface ToolCallError {
  /** Position among the turn's calls, from 0; for a problem of the whole Mistral array, 0. */
  index: number;
  kind: ToolCallErrorKind;
  /** The tool the call names, once that is known. */
  name?: string;
  /** E.g. `tool call 2: unknown tool "calc"; the tools are: calculator, python`. */
  message: string;
}

export interface ParsedTurn {
  /** The turn's text outside its tool calls, trimmed. */
  content: string;
  calls: ToolCall[];
  errors: ToolCallError[];
}

/** What one turn's tool calls may cost. */
export interface ToolCallLimits {
  /** Calls run from one turn; those after are one `too-many-calls` error. */
  maxCalls: number;
  /** UTF-8 bytes of one call's JSON (for Mistral's array: the array's, maxCalls times this). */
  maxCallBytes: number;
  /**
   * Levels of arrays and objects in one call's JSON, the call object itself being level 1 (its
   * arguments object level 2). At most maxNestingDepth, the depth measureValue can tell.
   */
  maxDepth: number;
}

/** 8 calls a turn, 64 KiB a call, 64 levels deep: far past what a real call needs. */
export const defaultToolCallLimits: ToolCallLimits = {
  maxCalls: 8,
  maxCallBytes: 64 * 1024,
  maxDepth: 64,
};

const hermesOpen = '<tool_call>';
const hermesClose = '</tool_call>';
const mistralMarker = '[TOOL_CALLS]';

/** A declared tool's arguments validator (undefined: any object), by tool name. */
interface CompiledTools {
  names: string[];
  validators: Map<string, ValidateFunction | undefined>;
}

// Compiled once per tool list (the list is taken to be immutable); a list's own Ajv keeps two
// lists' schemas from clashing over an `$id`, and goes with the list when it is dropped.
const compiledByList = new WeakMap<readonly ToolSchema[], CompiledTools>();

function compileTools(tools: readonly ToolSchema[]): CompiledTools {
  const cached = compiledByList.get(tools);
  if (cached) return cached;
  if (!Array.isArray(tools))
    throw new BadInputError('the tools must be a list of {type: "function", function}');
  const ajv = new Ajv({ allErrors: false, strict: false });
  const compiled: CompiledTools = { names: [], validators: new Map() };
  tools.forEach((tool, i) => {
    const fn = (tool as Partial<ToolSchema> | null)?.function;
    const name = fn?.name;
    if (tool?.type !== 'function' || typeof name !== 'string' || name === '')
      throw new BadInputError(`tool ${i + 1}: expected {type: "function", function: {name, parameters}}`);
    if (compiled.validators.has(name)) throw new BadInputError(`tool "${name}" is declared twice`);
    const schema: unknown = fn?.parameters;
    let validate: ValidateFunction | undefined;
    if (schema !== undefined) {
      if (typeof schema !== 'object' || schema === null || Array.isArray(schema))
        throw new BadInputError(`tool "${name}": its parameters must be a JSON Schema object`);
      try {
        validate = ajv.compile(schema);
      } catch (err) {
        throw new BadInputError(
          `tool "${name}": its parameters are not a valid JSON Schema: ${(err as Error).message}`,
        );
      }
    }
    compiled.names.push(name);
    compiled.validators.set(name, validate);
  });
  compiledByList.set(tools, compiled);
  return compiled;
}

function checkLimits(limits: ToolCallLimits): void {
  for (const key of Object.keys(defaultToolCallLimits) as (keyof ToolCallLimits)[]) {
    if (!Number.isSafeInteger(limits[key]) || limits[key] < 1)
      throw new BadInputError(`tool call limit ${key}=${String(limits[key])} is not a positive whole number`);
  }
  if (limits.maxDepth < 2 || limits.maxDepth > maxNestingDepth)
    throw new BadInputError(
      `tool call limit maxDepth=${limits.maxDepth} is not between 2 and ${maxNestingDepth}`,
    );
}

/** Parses turns of one format against one tool list; build it once per rollout. */
export class ToolCallParser {
  readonly limits: ToolCallLimits;
  private readonly compiled: CompiledTools;

  /** Throws BadInputError for a bad tool list (naming the tool), format or limits. */
  constructor(
    tools: readonly ToolSchema[],
    readonly format: ToolCallFormat,
    limits: Partial<ToolCallLimits> = {},
  ) {
    if (!toolCallFormats.includes(format))
      throw new BadInputError(
        `unknown tool call format ${JSON.stringify(format)}; the formats are: ${toolCallFormats.join(', ')}`,
      );
    this.limits = { ...defaultToolCallLimits, ...limits };
    checkLimits(this.limits);
    this.compiled = compileTools(tools);
  }

  /** The declared tools' names, in the list's order. */
  get toolNames(): readonly string[] {
    return this.compiled.names;
  }

  /** The turn's content, its valid calls and its errors; never throws. */
  parse(text: string): ParsedTurn {
    return this.format === 'hermes' ? this.parseHermes(text) : this.parseMistral(text);
  }

  private parseHermes(text: string): ParsedTurn {
    const turn: ParsedTurn = { content: '', calls: [], errors: [] };
    const outside: string[] = [];
    const bodies: (string | null)[] = []; // null: a block with no closing tag
    let pos = 0;
    let close = -1; // kept across blocks so that many nested opens do not rescan the text
    for (;;) {
      const open = text.indexOf(hermesOpen, pos);
      if (open < 0) {
        outside.push(text.slice(pos));
        break;
      }
      outside.push(text.slice(pos, open));
      const start = open + hermesOpen.length;
      if (close < start) close = text.indexOf(hermesClose, start);
      if (close < 0) {
        bodies.push(null); // the turn ended inside this call: the rest of it is the broken call
        break;
      }
      const nextOpen = text.indexOf(hermesOpen, start);
      if (nextOpen >= 0 && nextOpen < close) {
        bodies.push(null); // opened again before it closed
        pos = nextOpen;
        continue;
      }
      bodies.push(text.slice(start, close));
      pos = close + hermesClose.length;
    }
    turn.content = outside.join('').trim();
    bodies.slice(0, this.limits.maxCalls).forEach((body, index) => {
      if (body === null)
        turn.errors.push({
          index,
          kind: 'unclosed',
          message: `tool call ${index + 1}: ${hermesOpen} is not closed by ${hermesClose} (the turn may have run out of tokens)`,
        });
      else this.addCall(turn, this.callFromText(body, index));
    });
    this.addTooMany(turn, bodies.length);
    return turn;
  }

  private parseMistral(text: string): ParsedTurn {
    const at = text.indexOf(mistralMarker);
    const turn: ParsedTurn = { content: (at < 0 ? text : text.slice(0, at)).trim(), calls: [], errors: [] };
    if (at < 0) return turn;
    const json = text.slice(at + mistralMarker.length).trim();
    const wholeError = (kind: ToolCallErrorKind, problem: string): ParsedTurn => {
      turn.errors.push({ index: 0, kind, message: `tool calls: ${problem}` });
      return turn;
    };
    const bytes = Buffer.byteLength(json, 'utf8');
    const maxBytes = this.limits.maxCalls * this.limits.maxCallBytes;
    if (bytes > maxBytes)
      return wholeError(
        'too-large',
        `the JSON after ${mistralMarker} is ${bytes} bytes, past the limit of ${maxBytes}`,
      );
    if (json === '')
      return wholeError('bad-json', `nothing after ${mistralMarker}; expected a JSON array of calls`);
    const parsed = parseJson(json);
    if ('problem' in parsed)
      return wholeError('bad-json', `not valid JSON after ${mistralMarker}: ${parsed.problem}`);
    // A lone object instead of a one-call array is what the model meant.
    const values = Array.isArray(parsed.value) ? parsed.value : [parsed.value];
    values.slice(0, this.limits.maxCalls).forEach((value, index) => {
      this.addCall(turn, this.callFromValue(value, index, undefined));
    });
    this.addTooMany(turn, values.length);
    return turn;
  }

  private addCall(turn: ParsedTurn, result: ToolCall | ToolCallError): void {
    if ('kind' in result) turn.errors.push(result);
    else turn.calls.push(result);
  }

  private addTooMany(turn: ParsedTurn, count: number): void {
    const max = this.limits.maxCalls;
    if (count <= max) return;
    const skipped = count === max + 1 ? `call ${max + 1} was` : `calls ${max + 1} to ${count} were`;
    turn.errors.push({
      index: max,
      kind: 'too-many-calls',
      message: `tool call ${max + 1}: ${count} tool calls in one turn, past the limit of ${max}; ${skipped} not run`,
    });
  }

  /** One Hermes block's call: its size is checked on the text, before JSON.parse. */
  private callFromText(body: string, index: number): ToolCall | ToolCallError {
    const failure = callFailure(index);
    const bytes = Buffer.byteLength(body, 'utf8');
    if (bytes > this.limits.maxCallBytes)
      return failure(
        'too-large',
        `the call is ${bytes} bytes, past the limit of ${this.limits.maxCallBytes}`,
      );
    if (body.trim() === '')
      return failure('bad-json', `the block is empty; expected {"name": ..., "arguments": {...}}`);
    const parsed = parseJson(body);
    if ('problem' in parsed) return failure('bad-json', `not valid JSON: ${parsed.problem}`);
    return this.callFromValue(parsed.value, index, bytes);
  }

  /** A parsed call, checked; `bytes` undefined when its JSON text was not measured yet. */
  private callFromValue(value: unknown, index: number, bytes: number | undefined): ToolCall | ToolCallError {
    const failure = callFailure(index);
    const { maxDepth, maxCallBytes } = this.limits;
    // measureValue is not recursive, and its depth stops growing past maxNestingDepth >= maxDepth.
    if (measureValue(value).depth > maxDepth)
      return failure(
        'too-deep',
        `the call nests more than ${maxDepth} levels deep, past the limit of ${maxDepth}`,
      );
    // Safe now that the depth is bounded.
    const size = bytes ?? Buffer.byteLength(JSON.stringify(value), 'utf8');
    if (size > maxCallBytes)
      return failure('too-large', `the call is ${size} bytes, past the limit of ${maxCallBytes}`);
    if (!isObject(value))
      return failure('not-an-object', `expected {"name": ..., "arguments": {...}}, got ${describe(value)}`);
    const name = value['name'];
    if (typeof name !== 'string' || name === '')
      return failure('missing-name', `no "name": expected the tool's name as a string`);
    if (!this.compiled.validators.has(name)) {
      const known = this.compiled.names.length > 0 ? this.compiled.names.join(', ') : '(none)';
      return failure('unknown-tool', `unknown tool ${quote(name)}; the tools are: ${known}`, name);
    }
    const args = this.argumentsOf(value['arguments']);
    if (typeof args === 'string')
      return failure('bad-arguments', `"arguments" of ${quote(name)} ${args}`, name);
    const validate = this.compiled.validators.get(name);
    if (validate && !validate(args))
      return failure(
        'bad-arguments',
        `arguments do not match the schema of ${quote(name)}: ${schemaProblem(validate)}`,
        name,
      );
    const call: ToolCall = { index, name, arguments: args };
    if (typeof value['id'] === 'string') call.id = value['id'];
    return call;
  }

  /** The arguments object, or what is wrong with the value given (a phrase after its name). */
  private argumentsOf(given: unknown): Record<string, unknown> | string {
    if (given === undefined) return {}; // some models leave it out for a tool without parameters
    if (isObject(given)) return given;
    if (typeof given !== 'string') return `must be a JSON object, got ${describe(given)}`;
    // Some models give the arguments as JSON text, as OpenAI's API returns them.
    const parsed = parseJson(given);
    if ('problem' in parsed) return `is a string that is not valid JSON: ${parsed.problem}`;
    // Within the call, the arguments object is level 2.
    if (measureValue(parsed.value).depth + 1 > this.limits.maxDepth)
      return `nest more than ${this.limits.maxDepth} levels deep, past the limit of ${this.limits.maxDepth}`;
    return isObject(parsed.value)
      ? parsed.value
      : `must be a JSON object, got a string holding ${describe(parsed.value)}`;
  }
}

/**
 * `text`'s tool calls in `format`, checked against `tools`: a one-off form of ToolCallParser
 * (the tools' schemas are compiled once per list all the same).
 */
export function parseToolCalls(
  text: string,
  format: ToolCallFormat,
  tools: readonly ToolSchema[],
  limits?: Partial<ToolCallLimits>,
): ParsedTurn {
  return new ToolCallParser(tools, format, limits).parse(text);
}

function callFailure(index: number) {
  return (kind: ToolCallErrorKind, problem: string, name?: string): ToolCallError => {
    const error: ToolCallError = { index, kind, message: `tool call ${index + 1}: ${problem}` };
    if (name !== undefined) error.name = name;
    return error;
  };
}

// V8's JSON.parse is not recursive, so deep text is safe here; the depth is checked after.
function parseJson(text: string): { value: unknown } | { problem: string } {
  try {
    return { value: JSON.parse(text) as unknown };
  } catch (err) {
    return { problem: clip((err as Error).message, 200) };
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

/** A model-written name in a message: quoted, and clipped so that a huge one stays short. */
function quote(name: string): string {
  return JSON.stringify(clip(name, 64));
}

function clip(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/** Ajv's first error as `/path must ...` (allErrors is off: one is enough for the model). */
function schemaProblem(validate: ValidateFunction): string {
  const error = validate.errors?.[0];
  if (!error) return 'invalid';
  const where = error.instancePath === '' ? '' : `${error.instancePath} `;
  const extra = (error.params as { additionalProperty?: unknown }).additionalProperty;
  return `${where}${error.message ?? 'is invalid'}${typeof extra === 'string' ? `: ${quote(extra)}` : ''}`;
}
