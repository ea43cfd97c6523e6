// The ObjectStore: where every bulk artifact of a campaign lives (specs, checkpoints,
// rollouts, rewards, metrics, logs; layout in docs/store.md). Two backends implement it: a
// local directory (fs.ts) and S3 or any S3-compatible server (s3.ts). Only keys travel in
// workflow payloads; the bytes stay here.
import type { Readable } from 'node:stream';

export type ObjectBody = Buffer | string | Readable;

export interface PutOptions {
  /** Content type recorded with the object where the backend keeps one (S3). */
  contentType?: string;
}

export interface ObjectInfo {
  bytes: number;
  /** The backend's entity tag where it has one (S3), without quotes. */
  etag?: string;
}

export interface ListedObject {
  key: string;
  bytes: number;
}

/**
 * Keys are `/`-separated relative paths (no leading `/`, no empty, `.` or `..` segments);
 * a malformed key throws StoreKeyError. Failures are StoreError subclasses (errors.ts):
 * StoreNotFoundError, StoreAuthError (not retryable), StoreUnavailableError (retryable).
 *
 * Consistency: an object is written whole or not at all — a reader sees the old content or
 * the new, never a part. Committing a group of objects (a checkpoint) is the caller's job:
 * write the parts, then the manifest last.
 *
 * A key may not also be the "directory" of other keys (`a` and `a/b`): the fs backend and
 * file-backed S3 servers cannot store both, and the campaign layout never needs it.
 */
export interface ObjectStore {
  /** One line for logs: backend and location, never credentials. */
  describe(): string;
  /** Writes (replaces) an object. A stream body is consumed; if it fails, nothing is written. */
  put(key: string, body: ObjectBody, opts?: PutOptions): Promise<void>;
  /** Streams a local file into an object (multipart upload for large files on S3). */
  putFile(key: string, localPath: string, opts?: PutOptions): Promise<void>;
  get(key: string): Promise<Buffer>;
  /** The object's bytes as a stream; a missing key surfaces as an 'error' event (StoreNotFoundError). */
  getStream(key: string): Readable;
  /**
   * Downloads to `localPath` through a temporary file in the same directory, renamed into
   * place when complete: `localPath` is never half-written (on failure it is left as it was).
   */
  getFile(key: string, localPath: string): Promise<void>;
  /** Size (and etag) of an object, or null when it does not exist. */
  head(key: string): Promise<ObjectInfo | null>;
  /** Every object whose key starts with `prefix` ('' = all), in key order, across all pages. */
  list(prefix: string): AsyncIterable<ListedObject>;
  /** Removes an object; removing a missing one is not an error. */
  delete(key: string): Promise<void>;
  /** Removes every object under `prefix` (not '': never the whole store); returns how many. */
  deletePrefix(prefix: string): Promise<number>;
  /**
   * Creates the object only if the key does not exist yet, atomically: of concurrent
   * callers exactly one gets true; the others get false and the winner's content stays.
   */
  createIfAbsent(key: string, body: Buffer | string): Promise<boolean>;
}
