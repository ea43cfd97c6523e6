// What the HTTP clients of the data plane (the reward model, an OpenAI-compatible rollout server)
// share: why one attempt failed, a sleep that a cancel ends, a size-bounded body, and server text
// fit for an error message.
import { printable } from './printable.js';

/**
 * Why an attempt failed: "unavailable" may pass (retried), "rejected" is a 4xx answer to this
 * request, "protocol" a server that answered against its contract (a 2xx with a bad body, a
 * redirect, a body over the size limit); asking again would get the same answer.
 */
export type HttpFailureKind = 'unavailable' | 'rejected' | 'protocol';

export class AttemptError extends Error {
  constructor(
    message: string,
    readonly kind: HttpFailureKind,
    readonly status?: number,
  ) {
    super(message);
  }
}

/** Waits `ms`, or rejects with the signal's reason once it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Reads at most `limit` bytes of the body. Past it the stream is cancelled and the answer is
 * either "too large" (`fail`) or the bytes read so far (for an error status, quoted only).
 */
export async function readBody(
  response: Response,
  limit: number,
  onExceed: 'fail' | 'truncate',
): Promise<string> {
  const tooLarge = (bytes: string) =>
    new AttemptError(
      `response body of ${bytes} bytes exceeds the limit of ${limit} bytes (maxResponseBytes)`,
      'protocol',
      response.status,
    );
  const declared = Number(response.headers.get('content-length') ?? NaN);
  if (onExceed === 'fail' && declared > limit) {
    await response.body?.cancel();
    throw tooLarge(String(declared));
  }
  if (!response.body) return '';
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (total + value.byteLength > limit) {
      await reader.cancel();
      if (onExceed === 'fail') throw tooLarge(`more than ${limit}`);
      chunks.push(value.subarray(0, limit - total));
      break;
    }
    chunks.push(value);
    total += value.byteLength;
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** Characters of the server's answer quoted in a message at most. */
export const excerptChars = 200;

/**
 * Server text fit for an error message (and so for workflow history): `secrets` replaced by
 * "[redacted]", control and invisible formatting characters (terminal escapes, bidi overrides)
 * and runs of whitespace turned into one space, at most `excerptChars` characters.
 */
export function excerpt(text: string, secrets: readonly string[] = []): string {
  let redacted = text;
  for (const secret of secrets) redacted = redacted.split(secret).join('[redacted]');
  const clean = printable(redacted);
  const chars = Array.from(clean);
  return chars.length > excerptChars ? `${chars.slice(0, excerptChars).join('')}...` : clean;
}
