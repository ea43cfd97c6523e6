// Maps @aws-sdk/client-s3 failures to the store's typed errors. The SDK has already retried
// what its retry strategy considers transient by the time an error gets here.
import {
  errorCode,
  errorText,
  StoreAuthError,
  StoreError,
  StoreNotFoundError,
  StoreUnavailableError,
} from './errors.js';

// Error names (S3 error codes) that mean the credentials were rejected or lack permission.
// XAdminUserNotFound is versitygw's answer to an unknown access key id.
const authNames = new Set([
  'InvalidAccessKeyId',
  'SignatureDoesNotMatch',
  'AccessDenied',
  'AllAccessDisabled',
  'ExpiredToken',
  'InvalidToken',
  'TokenRefreshRequired',
  'XAdminUserNotFound',
  'CredentialsProviderError',
]);
const notFoundNames = new Set(['NoSuchKey', 'NotFound']);
// Node socket errors and the SDK's timeouts: the endpoint is unreachable or not answering.
const unreachableCodes = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EHOSTDOWN',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
]);

interface SdkError {
  name?: string;
  message?: string;
  $metadata?: { httpStatusCode?: number; attempts?: number };
}

/** The typed store error for an SDK failure of an operation on `key`. */
export function mapS3Error(store: string, key: string | undefined, err: unknown): StoreError {
  if (err instanceof StoreError) return err;
  const e = (err ?? {}) as SdkError;
  const name = e.name ?? '';
  const status = e.$metadata?.httpStatusCode;
  const attempts = e.$metadata?.attempts;
  const tries = attempts && attempts > 1 ? ` (after ${attempts} attempts)` : '';
  const reason = describeSdkError(e, status);

  if (authNames.has(name) || status === 403 || status === 401)
    return new StoreAuthError(
      store,
      key,
      `credentials missing or rejected, or access denied: ${reason}`,
      err,
    );
  if (name === 'NoSuchBucket')
    return new StoreError(store, key, `the bucket does not exist: ${reason}`, {
      retryable: false,
      cause: err,
    });
  if (key !== undefined && (notFoundNames.has(name) || status === 404))
    return new StoreNotFoundError(store, key, err);
  if (name === 'TimeoutError' || name === 'AbortError' || unreachableCodes.has(errorCode(err) ?? ''))
    return new StoreUnavailableError(store, key, `cannot reach the endpoint${tries}: ${reason}`, err);
  if (status !== undefined && (status >= 500 || status === 408 || status === 429))
    return new StoreUnavailableError(
      store,
      key,
      `the server is failing or throttling${tries}: ${reason}`,
      err,
    );
  // Other 4xx answers say the request itself is wrong: retrying it unchanged cannot help.
  const retryable = status === undefined || status >= 500;
  return new StoreError(store, key, reason, { retryable, cause: err });
}

// "SignatureDoesNotMatch (HTTP 403): The request signature ..." — the SDK names HEAD
// failures only by status ("NotFound", "Unknown"), as HEAD answers have no body.
function describeSdkError(e: SdkError, status: number | undefined): string {
  const name = e.name && e.name !== 'Error' ? e.name : errorCode(e);
  const text = e.message && e.message !== 'UnknownError' ? e.message : '';
  const head = [name, status ? `(HTTP ${status})` : ''].filter(Boolean).join(' ');
  return [head, text].filter(Boolean).join(': ') || errorText(e);
}
