// The built-in reward verifiers that need no subprocess: answer extraction for math (the last
// \boxed{...}, nesting handled, or `#### answer`), exact or normalised match, a
// multiple-choice letter, a regex-extracted answer, JSON matching a JSON Schema (ajv), and the
// format reward that any verifier can add with a weight. Each scores one sample from its
// completion text and the row's ground truth, and returns a number (1 correct, 0 not).
import { Ajv, type ValidateFunction } from 'ajv';
import { BadInputError } from './errors.js';

// ---- math answers ----

/**
 * The content of the last outermost `\boxed{...}` (or `\fbox{...}`) in `text`, braces balanced
 * so that `\boxed{\frac{1}{2}}` gives `\frac{1}{2}`; also the brace-less `\boxed 5`. Null when
 * none is complete.
 */
export function lastBoxed(text: string): string | null {
  const re = /\\(?:boxed|fbox)\s*(\{| )/g;
  let found: string | null = null;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    const start = m.index + m[0].length;
    if (m[1] === ' ') {
      const word = /^[^\s$]+/.exec(text.slice(start));
      if (word) found = word[0];
      continue;
    }
    let depth = 1;
    let i = start;
    for (; i < text.length && depth > 0; i++) {
      const c = text[i];
      if (c === '\\')
        i++; // an escaped brace (\{ or \}) does not count
      else if (c === '{') depth++;
      else if (c === '}') depth--;
    }
    if (depth === 0) {
      found = text.slice(start, i - 1);
      // Boxes inside this one are part of its answer: go on after it.
      re.lastIndex = i;
    }
  }
  return found;
}

/** The answer after the last `####` (GSM8K's form), up to the end of its line, or null. */
export function hashAnswer(text: string): string | null {
  const at = text.lastIndexOf('####');
  if (at < 0) return null;
  const answer = (text.slice(at + 4).split('\n')[0] ?? '').trim();
  return answer === '' ? null : answer;
}

/** A math completion's final answer: the last \boxed{...}, else `#### answer`, else null. */
export function mathAnswer(text: string): string | null {
  return lastBoxed(text) ?? hashAnswer(text);
}

// ---- text answers ----

/**
 * The normal form the "normalised" match compares: Unicode NFKC, lower case, runs of white
 * space as one space, trimmed, without a final period and without surrounding quotes or `$`.
 */
export function normaliseAnswer(text: string): string {
  let s = text.normalize('NFKC').toLowerCase().replace(/\s+/g, ' ').trim();
  s = s.replace(/\.$/, '').trim();
  const pairs: [string, string][] = [
    ['"', '"'],
    ["'", "'"],
    ['$', '$'],
  ];
  for (const [open, close] of pairs) {
    if (s.length >= 2 && s.startsWith(open) && s.endsWith(close)) s = s.slice(1, -1).trim();
  }
  return s;
}

/** Ground truth as the list of accepted answers (verl rows hold a string, a number or a list). */
export function acceptedAnswers(groundTruth: unknown): string[] {
  const values = Array.isArray(groundTruth) ? groundTruth : [groundTruth];
  return values.map((v) => (typeof v === 'string' ? v : JSON.stringify(v)));
}

/** 1 when `answer` equals one accepted answer: byte for byte, or after normaliseAnswer. */
export function matchScore(answer: string | null, groundTruth: unknown, normalise: boolean): number {
  if (answer === null) return 0;
  const accepted = acceptedAnswers(groundTruth);
  if (!normalise) return accepted.includes(answer) ? 1 : 0;
  const mine = normaliseAnswer(answer);
  return accepted.some((a) => normaliseAnswer(a) === mine) ? 1 : 0;
}

/** Compiles a user's regex, naming it in the error. */
export function compileRegex(pattern: string, flags: string | undefined, what: string): RegExp {
  try {
    return new RegExp(pattern, flags);
  } catch (err) {
    throw new BadInputError(
      `${what}: ${JSON.stringify(pattern)} is not a valid regex: ${(err as Error).message}`,
    );
  }
}

/** The last match of `re` in `text`: its first capture group when it has one, else the whole match. */
export function lastMatch(re: RegExp, text: string): string | null {
  const global = new RegExp(re.source, re.flags.includes('g') ? re.flags : `${re.flags}g`);
  let found: string | null = null;
  for (const m of text.matchAll(global)) found = m[1] ?? m[0];
  return found;
}

// ---- multiple choice ----

/**
 * The letter a multiple-choice completion chose, among `letters` (e.g. "ABCD"): the last
 * \boxed{X}, else the last "answer is X" / "answer: (X)", else a completion that is only the
 * letter ("B", "(B)", "B." or "B) text"). Upper case, or null.
 */
export function choiceLetter(text: string, letters: string): string | null {
  const set = `[${letters.replace(/[\]\\^-]/g, '\\$&')}]`;
  const boxed = lastBoxed(text);
  if (boxed !== null) {
    const m = new RegExp(`^\\s*\\(?(${set})\\)?\\s*$`, 'i').exec(boxed);
    if (m) return (m[1] as string).toUpperCase();
  }
  const stated = lastMatch(new RegExp(`answer\\s*(?:is|:)?\\s*:?\\s*\\(?(${set})\\b\\)?`, 'i'), text);
  if (stated !== null) return stated.toUpperCase();
  const alone = new RegExp(`^\\s*\\(?(${set})(?:[).:]|\\s*$)`, 'i').exec(text);
  return alone ? (alone[1] as string).toUpperCase() : null;
}

/** The letter the ground truth names ("B", "(b)", "B) Paris"), or null. */
export function truthLetter(groundTruth: unknown, letters: string): string | null {
  return typeof groundTruth === 'string' ? choiceLetter(groundTruth, letters) : null;
}

// ---- JSON Schema ----

const ajv = new Ajv({ allErrors: false, strict: false });
const validators = new Map<string, ValidateFunction>();

/** A compiled validator of `schema` (an object, or its JSON text), cached by its text. */
export function schemaValidator(schema: unknown, what: string): ValidateFunction {
  const text = typeof schema === 'string' ? schema : JSON.stringify(schema);
  let validate = validators.get(text);
  if (!validate) {
    try {
      validate = ajv.compile(
        typeof schema === 'string' ? (JSON.parse(schema) as object) : (schema as object),
      );
    } catch (err) {
      throw new BadInputError(`${what} is not a valid JSON Schema: ${(err as Error).message}`);
    }
    if (validators.size >= 256) validators.clear();
    validators.set(text, validate);
  }
  return validate;
}

/**
 * The JSON value a completion gives: the last ```json fenced block, else the whole text, else
 * the span from its first `{` or `[` to its last `}` or `]`; undefined when none parses.
 */
export function completionJson(text: string): unknown {
  const candidates: string[] = [];
  const fenced = lastMatch(/```(?:json)?\s*\n([\s\S]*?)```/, text);
  if (fenced !== null) candidates.push(fenced);
  candidates.push(text);
  const first = text.search(/[{[]/);
  const last = Math.max(text.lastIndexOf('}'), text.lastIndexOf(']'));
  if (first >= 0 && last > first) candidates.push(text.slice(first, last + 1));
  for (const candidate of candidates) {
    try {
      return JSON.parse(candidate) as unknown;
    } catch {
      // the next candidate
    }
  }
  return undefined;
}

/** 1 when the completion's JSON is valid against `validate`. */
export function jsonSchemaScore(text: string, validate: ValidateFunction): number {
  const value = completionJson(text);
  return value !== undefined && validate(value) ? 1 : 0;
}

// ---- format reward ----

/** `weight` added to a verifier's score when the completion matches `pattern`. */
export interface FormatReward {
  pattern: string;
  flags?: string;
  weight: number;
}

/** The format bonus of one completion: `weight` when `re` matches it, else 0. */
export function formatBonus(re: RegExp, weight: number, text: string): number {
  re.lastIndex = 0;
  return re.test(text) ? weight : 0;
}
