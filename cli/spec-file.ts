// Loads a campaign spec from a YAML file: YAML syntax errors point at file:line:col, schema
// problems name the file, the line, the field, the bad value and what is allowed, all at once.
// `--set key=value` overrides (dotted paths) are applied to the document before validation.
import { readFileSync } from 'node:fs';
import { LineCounter, isMap, isNode, isPair, isScalar, parseDocument, type Document } from 'yaml';
import {
  SpecError,
  campaignSpecSchema,
  formatIssues,
  parseCampaignSpec,
  type CampaignSpec,
} from '../workflows/spec.js';
import { UsageError } from './errors.js';

/** One `--set key=value`: a dotted path into the spec and the parsed value. */
export interface SpecOverride {
  path: string[];
  value: unknown;
  /** The argument as written, for messages. */
  text: string;
}

/**
 * Names no spec field has that would reach an object's prototype machinery if used as a key:
 * `--set __proto__.x=1` must not change every object of the process.
 */
const forbiddenKeys: ReadonlySet<string> = new Set(['__proto__', 'constructor', 'prototype']);

/** Throws a UsageError when `key` is one of the forbidden names. */
export function checkFieldName(key: string, context: string): void {
  if (forbiddenKeys.has(key))
    throw new UsageError(`${context}: "${key}" is not allowed as a field name (no spec field has it)`);
}

/**
 * Parses `key=value`. Values `true`/`false` become booleans, numerals numbers, text starting
 * with `{`, `[` or `"` is read as JSON; anything else stays a string.
 */
export function parseOverride(arg: string): SpecOverride {
  const eq = arg.indexOf('=');
  if (eq <= 0) throw new UsageError(`--set expects key=value, got "${arg}"`);
  const key = arg.slice(0, eq).trim();
  const path = key.split('.');
  if (path.some((part) => part === '' || !/^[A-Za-z0-9_-]+$/.test(part))) {
    throw new UsageError(`--set ${arg}: "${key}" is not a dotted field path (e.g. hyperparameters.lr)`);
  }
  for (const part of path) checkFieldName(part, `--set ${arg}`);
  return { path, value: parseScalar(arg.slice(eq + 1).trim(), `--set ${arg}`), text: arg };
}

export function parseScalar(raw: string, context: string): unknown {
  if (raw === 'true') return true;
  if (raw === 'false') return false;
  if (/^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$/.test(raw)) return Number(raw);
  if (/^[[{"]/.test(raw)) {
    let value: unknown;
    try {
      value = JSON.parse(raw) as unknown;
    } catch {
      throw new UsageError(`${context}: "${raw}" is not valid JSON`);
    }
    // JSON.parse makes "__proto__" an own key, but code that copies the value by assignment
    // (a schema's record parser) would set a prototype with it.
    JSON.parse(raw, (key: string, v: unknown) => {
      if (key === '__proto__') checkFieldName(key, context);
      return v;
    });
    return value;
  }
  return raw;
}

/**
 * Returns a copy of `doc` with every override applied in order; sections are created as needed.
 * Only own properties are read and written (defineProperty, never `node[key] =`), so no key can
 * reach a prototype.
 */
export function applyOverrides(doc: unknown, overrides: readonly SpecOverride[]): unknown {
  const root: Record<string, unknown> = isPlainObject(doc) ? structuredClone(doc) : {};
  const set = (node: Record<string, unknown>, key: string, value: unknown) =>
    Object.defineProperty(node, key, { value, enumerable: true, writable: true, configurable: true });
  for (const { path, value, text } of overrides) {
    for (const key of path) checkFieldName(key, `--set ${text}`);
    let node = root;
    for (const [i, key] of path.slice(0, -1).entries()) {
      const next = Object.hasOwn(node, key) ? node[key] : undefined;
      if (next === undefined) set(node, key, {});
      else if (!isPlainObject(next)) {
        throw new UsageError(`--set ${text}: ${path.slice(0, i + 1).join('.')} is a value, not a section`);
      }
      node = node[key] as Record<string, unknown>;
    }
    set(node, path[path.length - 1] as string, value);
  }
  return root;
}

/** Reads, overrides and validates a spec file; throws SpecError (file named) or UsageError. */
export function loadSpecFile(file: string, overrides: readonly SpecOverride[] = []): CampaignSpec {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new UsageError(
      code === 'ENOENT' ? `spec file ${file} does not exist` : `cannot read ${file}: ${code}`,
    );
  }
  return parseSpecText(text, file, overrides);
}

/** Validates spec YAML `text`; `file` names it in messages. */
export function parseSpecText(
  text: string,
  file: string,
  overrides: readonly SpecOverride[] = [],
): CampaignSpec {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, uniqueKeys: true });
  if (doc.errors.length > 0) {
    throw new SpecError(
      doc.errors.map((e) => {
        const pos = lineCounter.linePos(e.pos[0]);
        return `${file}${pos ? `:${pos.line}:${pos.col}` : ''}: YAML syntax error: ${firstLine(e.message)}`;
      }),
      file,
    );
  }
  const parsed = doc.toJS() as unknown;
  if (!isPlainObject(parsed)) {
    const what =
      parsed === null || parsed === undefined
        ? 'an empty document'
        : Array.isArray(parsed)
          ? 'a list'
          : 'a scalar';
    throw new SpecError(
      [`${file}:1:1: the spec must be a mapping of fields (name, task, model, ...), got ${what}`],
      file,
    );
  }
  const document = applyOverrides(parsed, overrides);
  const result = campaignSpecSchema.safeParse(document);
  if (!result.success) {
    const lines = formatIssues(result.error.issues, document);
    throw new SpecError(
      result.error.issues.map((issue, i) => {
        const field = issue.path.map(String);
        if (issue.code === 'unrecognized_keys' && issue.keys[0] !== undefined) field.push(issue.keys[0]);
        const unknownKey = issue.code === 'unrecognized_keys';
        const fromOverride = overrides.find(
          (o) => isPrefix(o.path, field) || (unknownKey && isPrefix(field, o.path)),
        );
        if (fromOverride) return `--set ${fromOverride.text}: ${lines[i]}`;
        const pos = locate(
          doc,
          lineCounter,
          issue.path,
          issue.code === 'unrecognized_keys' ? issue.keys[0] : undefined,
        );
        return `${file}${pos ? `:${pos.line}:${pos.col}` : ''}: ${lines[i]}`;
      }),
      file,
    );
  }
  return parseCampaignSpec(document, file);
}

// The position of the node at `path` (or of the key `key` inside it), or of its nearest
// existing ancestor when the field is missing.
function locate(
  doc: Document,
  lineCounter: LineCounter,
  path: readonly PropertyKey[],
  key?: string,
): { line: number; col: number } | undefined {
  let node: unknown = doc.contents;
  let pos = rangeStart(node, lineCounter);
  for (const part of key === undefined ? path : [...path, key]) {
    if (!isMap(node)) break;
    const pair = node.items.find((p) => isPair(p) && isScalar(p.key) && String(p.key.value) === String(part));
    if (!pair) break;
    pos = rangeStart(pair.key, lineCounter) ?? pos;
    node = pair.value;
  }
  return pos;
}

function rangeStart(node: unknown, lineCounter: LineCounter): { line: number; col: number } | undefined {
  return isNode(node) && node.range ? lineCounter.linePos(node.range[0]) : undefined;
}

function isPrefix(prefix: readonly string[], path: readonly string[]): boolean {
  return prefix.length <= path.length && prefix.every((p, i) => p === path[i]);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function firstLine(message: string): string {
  return message.split('\n')[0] ?? message;
}
