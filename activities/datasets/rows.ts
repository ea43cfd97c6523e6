// One dataset row in verl's schema — `data_source`, `prompt` (chat messages), `ability`,
// `reward_model: { style, ground_truth }`, `extra_info` — read from a decoded record through the
// spec's column names, with a problem for every field that is missing or of the wrong type.
import type { DatasetSpec } from '../../workflows/spec-dataset.js';
import type { ChatMessage as TemplateMessage } from '../models/chat-template.js';

export interface ChatMessage {
  role: string;
  content: string;
}

/** A row as the rest of moerl sees it, whatever the file's column names. */
export interface DatasetRow {
  /** 0-based index of the row in the file. */
  row: number;
  /** Chooses the row's reward function. */
  dataSource: string;
  /** The conversation to continue; a string prompt is one user message. */
  prompt: ChatMessage[];
  ability?: string;
  /** The reference answer for the reward function (any JSON value); absent when the row has none. */
  groundTruth?: unknown;
  extraInfo?: Record<string, unknown>;
  /**
   * The reference completion an SFT warm start learns; read only when asked for (responseKey):
   * one string, or a multi-turn demonstration, the turns after the prompt (assistant messages,
   * with their tool calls, and the tool messages answering them), ending with an assistant's.
   */
  response?: string | TemplateMessage[];
}

/** The spec's column names (task.dataset.*Key). */
export type DatasetColumns = Pick<
  DatasetSpec,
  'promptKey' | 'dataSourceKey' | 'groundTruthKey' | 'abilityKey' | 'extraInfoKey'
>;

/** verl's own names: the defaults of the spec. */
export const verlColumns: DatasetColumns = {
  promptKey: 'prompt',
  dataSourceKey: 'data_source',
  groundTruthKey: 'reward_model.ground_truth',
  abilityKey: 'ability',
  extraInfoKey: 'extra_info',
};

/** The top-level columns a row is read from (Parquet reads only these). */
export function topLevelColumns(columns: DatasetColumns): string[] {
  const names = Object.values(columns).map((path) => path.split('.')[0] as string);
  return [...new Set(names)];
}

/** The value at a column name or dotted path; a literal key with dots wins over the path. */
export function valueAtPath(record: Record<string, unknown>, path: string): unknown {
  if (path in record) return record[path];
  let cur: unknown = record;
  for (const part of path.split('.')) {
    if (cur === null || typeof cur !== 'object' || Array.isArray(cur)) return undefined;
    cur = (cur as Record<string, unknown>)[part];
  }
  return cur;
}

/**
 * Decoded Parquet values as JSON: 64-bit integers become numbers (strings past 2^53, which
 * JSON numbers cannot hold exactly), dates ISO strings, binary base64.
 */
export function jsonSafe(value: unknown): unknown {
  if (typeof value === 'bigint')
    return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  if (value instanceof Date) return value.toISOString();
  if (value instanceof Uint8Array) return Buffer.from(value).toString('base64');
  if (Array.isArray(value)) return value.map(jsonSafe);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = jsonSafe(v);
    return out;
  }
  return value;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return `an array of ${value.length}`;
  if (typeof value === 'object') return 'an object';
  const json = JSON.stringify(value);
  return `${typeof value} ${json.length > 40 ? `${json.slice(0, 37)}...` : json}`;
}

/** The names of a problem's field in messages: the column, and the spec key when mapped. */
function fieldName(columns: DatasetColumns, key: keyof DatasetColumns): string {
  const column = columns[key];
  return column === verlColumns[key] ? column : `${column} (task.dataset.${key})`;
}

function readPrompt(value: unknown): ChatMessage[] | string {
  if (typeof value === 'string')
    return value.length > 0 ? [{ role: 'user', content: value }] : 'an empty string';
  if (!Array.isArray(value))
    return `${describe(value)}, expected chat messages (an array of {role, content}) or a string`;
  if (value.length === 0) return 'an empty array, expected at least one message';
  const messages: ChatMessage[] = [];
  for (const [i, m] of value.entries()) {
    if (m === null || typeof m !== 'object' || Array.isArray(m))
      return `message ${i} is ${describe(m)}, expected {role, content}`;
    const { role, content } = m as Record<string, unknown>;
    if (typeof role !== 'string' || role === '')
      return `message ${i}: role is ${describe(role)}, expected a non-empty string`;
    if (typeof content !== 'string')
      return `message ${i}: content is ${describe(content)}, expected a string`;
    messages.push({ role, content });
  }
  return messages;
}

/**
 * A multi-turn demonstration (the turns after the prompt), or what is wrong with it. Assistant
 * messages keep their other fields (tool_calls, reasoning_content), as the chat template reads them.
 */
function readDemonstration(value: unknown[]): TemplateMessage[] | string {
  if (value.length === 0) return 'an empty array, expected the turns after the prompt';
  const messages: TemplateMessage[] = [];
  for (const [i, m] of value.entries()) {
    if (m === null || typeof m !== 'object' || Array.isArray(m))
      return `message ${i} is ${describe(m)}, expected {role, content}`;
    const message = m as Record<string, unknown>;
    const { role, content } = message;
    if (role !== 'assistant' && role !== 'tool')
      return `message ${i}: role is ${describe(role)}, expected assistant or tool (the turns after the prompt)`;
    if (typeof content !== 'string' && !(role === 'assistant' && (content === null || content === undefined)))
      return `message ${i}: content is ${describe(content)}, expected a string`;
    messages.push({ ...message, role, content: typeof content === 'string' ? content : '' });
  }
  if (messages[0]!.role !== 'assistant')
    return 'message 0 is a tool message, expected the assistant turn first';
  if (messages.at(-1)!.role !== 'assistant')
    return `message ${messages.length - 1} is a tool message, expected the demonstration to end with the assistant's turn`;
  return messages;
}

/**
 * The row, or the problems of the record (each `FIELD: what is wrong`, without the row number,
 * which the caller knows). `record` is JSON-safe (see jsonSafe). With `responseKey` (the spec's
 * task.dataset.responseKey) the row's reference completion is read too, and required.
 */
export function toDatasetRow(
  record: unknown,
  row: number,
  columns: DatasetColumns,
  responseKey?: string,
): { row: DatasetRow; problems?: undefined } | { row?: undefined; problems: string[] } {
  if (record === null || typeof record !== 'object' || Array.isArray(record))
    return { problems: [`${describe(record)}, expected an object`] };
  const r = record as Record<string, unknown>;
  const problems: string[] = [];
  const missing = (v: unknown) => v === undefined || v === null;

  const promptValue = valueAtPath(r, columns.promptKey);
  const prompt = missing(promptValue) ? 'missing' : readPrompt(promptValue);
  if (typeof prompt === 'string') problems.push(`${fieldName(columns, 'promptKey')}: ${prompt}`);

  const dataSource = valueAtPath(r, columns.dataSourceKey);
  if (missing(dataSource)) problems.push(`${fieldName(columns, 'dataSourceKey')}: missing`);
  else if (typeof dataSource !== 'string' || dataSource === '')
    problems.push(
      `${fieldName(columns, 'dataSourceKey')}: ${describe(dataSource)}, expected a non-empty string`,
    );

  const ability = valueAtPath(r, columns.abilityKey);
  if (!missing(ability) && typeof ability !== 'string')
    problems.push(`${fieldName(columns, 'abilityKey')}: ${describe(ability)}, expected a string`);

  const extraInfo = valueAtPath(r, columns.extraInfoKey);
  if (!missing(extraInfo) && (typeof extraInfo !== 'object' || Array.isArray(extraInfo)))
    problems.push(`${fieldName(columns, 'extraInfoKey')}: ${describe(extraInfo)}, expected an object`);

  const responseValue = responseKey === undefined ? undefined : valueAtPath(r, responseKey);
  const response = Array.isArray(responseValue) ? readDemonstration(responseValue) : responseValue;
  if (responseKey !== undefined && Array.isArray(responseValue) && typeof response === 'string')
    problems.push(`${responseKey} (task.dataset.responseKey): ${response}`);
  else if (
    responseKey !== undefined &&
    !Array.isArray(response) &&
    (typeof response !== 'string' || response === '')
  )
    problems.push(
      `${responseKey} (task.dataset.responseKey): ${missing(response) ? 'missing' : describe(response)}, expected the reference completion: a non-empty string, or the turns after the prompt`,
    );

  if (problems.length > 0) return { problems };
  const groundTruth = valueAtPath(r, columns.groundTruthKey);
  return {
    row: {
      row,
      dataSource: dataSource as string,
      prompt: prompt as ChatMessage[],
      ...(missing(ability) ? {} : { ability: ability as string }),
      ...(missing(groundTruth) ? {} : { groundTruth }),
      ...(missing(extraInfo) ? {} : { extraInfo: extraInfo as Record<string, unknown> }),
      ...(typeof response === 'string' || Array.isArray(response) ? { response } : {}),
    },
  };
}
