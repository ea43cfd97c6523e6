// JSONL datasets, streamed: one JSON object a line, row i on line i + 1. Only one line is held
// at a time, and a line is never held past `maxLineBytes` (a file without newlines must not
// take the worker's memory).
import { measureValue, nestingProblem } from './limits.js';

/** Longest line read, by default: 64 MiB, far beyond any prompt. */
export const defaultMaxLineBytes = 64 * 1024 * 1024;

export interface JsonlLine {
  /** 0-based row index (= line number − 1). */
  row: number;
  /** The line without its end (`\n` or `\r\n`); null when longer than maxLineBytes. */
  text: string | null;
}

/**
 * The lines of a byte stream, in order. A final line without `\n` counts; the empty piece after
 * a final `\n` does not.
 */
export async function* jsonlLines(
  source: AsyncIterable<Buffer>,
  maxLineBytes = defaultMaxLineBytes,
): AsyncGenerator<JsonlLine> {
  let parts: Buffer[] = [];
  let length = 0;
  let tooLong = false;
  let row = 0;
  const finish = (): JsonlLine => {
    let text: string | null = null;
    if (!tooLong) {
      let line = parts.length === 1 ? (parts[0] as Buffer) : Buffer.concat(parts, length);
      if (line.length > 0 && line[line.length - 1] === 0x0d) line = line.subarray(0, line.length - 1);
      text = line.toString('utf8');
    }
    parts = [];
    length = 0;
    tooLong = false;
    return { row: row++, text };
  };
  for await (const chunk of source) {
    let start = 0;
    for (;;) {
      const end = chunk.indexOf(0x0a, start);
      const piece = chunk.subarray(start, end < 0 ? chunk.length : end);
      if (!tooLong) {
        if (length + piece.length > maxLineBytes) {
          tooLong = true;
          parts = [];
        } else if (piece.length > 0) parts.push(piece);
      }
      length += piece.length;
      if (end < 0) break;
      yield finish();
      start = end + 1;
    }
  }
  if (length > 0 || tooLong) yield finish();
}

/** The decoded record of a line, or what is wrong with it (not JSON, nested too deep). */
export function parseJsonlLine(
  line: JsonlLine,
  maxLineBytes = defaultMaxLineBytes,
): { record: unknown } | { problem: string } {
  if (line.text === null) return { problem: `longer than ${maxLineBytes} bytes` };
  if (line.text.trim() === '') return { problem: 'an empty line, expected a JSON object' };
  let record: unknown;
  try {
    record = JSON.parse(line.text) as unknown;
  } catch (err) {
    return { problem: `not JSON: ${(err as Error).message}` };
  }
  const deep = nestingProblem(measureValue(record).depth);
  return deep === undefined ? { record } : { problem: deep };
}
