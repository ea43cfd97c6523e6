// Stream helpers shared by the backends and by what checks bytes on their way (checkpoints,
// datasets).
import { createHash } from 'node:crypto';
import { Readable, Transform } from 'node:stream';

/** sha256 (hex) and size of everything a stream yields. */
export async function sha256OfStream(stream: Readable): Promise<{ sha256: string; bytes: number }> {
  const hash = createHash('sha256');
  let bytes = 0;
  for await (const chunk of stream) {
    hash.update(chunk as Buffer);
    bytes += (chunk as Buffer).length;
  }
  return { sha256: hash.digest('hex'), bytes };
}

/** A pass-through stream that hashes and counts what flows through it. */
export function hashingStream(): Transform & { digest(): { sha256: string; bytes: number } } {
  const hash = createHash('sha256');
  let bytes = 0;
  const t = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      hash.update(chunk);
      bytes += chunk.length;
      done(null, chunk);
    },
  });
  return Object.assign(t, { digest: () => ({ sha256: hash.digest('hex'), bytes }) });
}

/**
 * A byte stream over `open()`'s chunks whose errors (opening or mid-way) pass through
 * `mapError`, so consumers see the store's typed errors. Nothing is opened until the stream
 * is first read; destroying it early closes the source.
 */
export function mappedStream(
  open: () => AsyncIterable<Buffer | string> | Promise<AsyncIterable<Buffer | string>>,
  mapError: (err: unknown) => Error,
): Readable {
  async function* chunks(): AsyncGenerator<Buffer> {
    try {
      for await (const chunk of await open()) yield typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    } catch (err) {
      throw mapError(err);
    }
  }
  return Readable.from(chunks(), { objectMode: false });
}

/**
 * Cuts a byte stream into buffers of exactly `size` bytes (the last one shorter). Yields at
 * least one buffer, empty for an empty stream.
 */
export async function* fixedSizeParts(
  source: AsyncIterable<Buffer | string>,
  size: number,
): AsyncGenerator<Buffer> {
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  let yielded = false;
  for await (const piece of source) {
    let chunk = typeof piece === 'string' ? Buffer.from(piece) : piece;
    while (pendingBytes + chunk.length >= size) {
      const take = size - pendingBytes;
      pending.push(chunk.subarray(0, take));
      yield Buffer.concat(pending);
      yielded = true;
      pending = [];
      pendingBytes = 0;
      chunk = chunk.subarray(take);
    }
    if (chunk.length > 0) {
      pending.push(chunk);
      pendingBytes += chunk.length;
    }
  }
  if (pendingBytes > 0 || !yielded) yield Buffer.concat(pending);
}
