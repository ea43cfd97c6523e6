// Typed store failures. Every error names the store (its describe() line, never credentials)
// and the key, and says whether retrying can help: activities turn `retryable: false` into a
// non-retryable failure, so a bad key or rejected credentials stop a campaign stage at once
// instead of burning its retry budget.

export interface StoreErrorOptions {
  retryable: boolean;
  cause?: unknown;
}

/** Any store failure; `message` is `<store>: <key>: <detail>`. */
export class StoreError extends Error {
  override name = 'StoreError';
  readonly retryable: boolean;
  constructor(
    /** The store's describe() line. */
    readonly store: string,
    /** The key (or prefix) the operation was about; undefined for store-wide failures. */
    readonly key: string | undefined,
    detail: string,
    opts: StoreErrorOptions,
  ) {
    super(key === undefined ? `${store}: ${detail}` : `${store}: ${key}: ${detail}`, { cause: opts.cause });
    this.retryable = opts.retryable;
  }
}

/** The key does not exist (or names a directory of keys rather than an object). */
export class StoreNotFoundError extends StoreError {
  override name = 'StoreNotFoundError';
  constructor(store: string, key: string, cause?: unknown) {
    super(store, key, 'no such object', { retryable: false, cause });
  }
}

/** Credentials missing or rejected, or access denied: retrying with the same ones cannot help. */
export class StoreAuthError extends StoreError {
  override name = 'StoreAuthError';
  constructor(store: string, key: string | undefined, detail: string, cause?: unknown) {
    super(store, key, detail, { retryable: false, cause });
  }
}

/** The store cannot be reached or did not answer in time (after the client's own retries). */
export class StoreUnavailableError extends StoreError {
  override name = 'StoreUnavailableError';
  constructor(store: string, key: string | undefined, detail: string, cause?: unknown) {
    super(store, key, detail, { retryable: true, cause });
  }
}

/** A malformed key or prefix: a bug in the caller, never retried. */
export class StoreKeyError extends StoreError {
  override name = 'StoreKeyError';
  constructor(store: string, key: string, detail: string) {
    super(store, key, detail, { retryable: false });
    // Quoted: the key may be empty or hold spaces and control characters.
    this.message = `${store}: invalid key ${JSON.stringify(key)}: ${detail}`;
  }
}

/** Node's error code (ENOENT, ECONNREFUSED, ...) when there is one. */
export function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
