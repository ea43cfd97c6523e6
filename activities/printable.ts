// Text from outside the program (a reward server's answer, a --reason, a rank's log tail) made
// fit for one line of a terminal, a log or an error message.

/**
 * `text` with control characters (terminal escapes, carriage returns, bells, C1 codes),
 * invisible formatting characters (bidi overrides, zero-width marks) and runs of whitespace each
 * turned into one space, trimmed.
 */
export function printable(text: string): string {
  return text.replace(/[\s\p{Cc}\p{Cf}]+/gu, ' ').trim();
}
