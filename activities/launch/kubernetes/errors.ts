// Kubernetes API failures, mapped in one place to the failures the activities throw: rejected
// credentials, a forbidden verb, a missing namespace and an object the API server refuses are
// non-retryable (the same call fails again); an unreachable or overloaded API server is
// retryable. Every message names the verb, the resource and the namespace.
import { ApiException } from '@kubernetes/client-node';
import { ApplicationFailure } from '@temporalio/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { badInputErrorType } from '../../types.js';

/** Type of a Kubernetes API failure that may go away (API server down, overloaded, a conflict). */
export const kubernetesUnavailableErrorType = 'KubernetesUnavailable';
/** Type of a request the API server refuses for good (credentials, RBAC, a missing namespace). */
export const kubernetesRejectedErrorType = 'KubernetesRejected';

/** What a request was about, for the message: `create` `jobs/x` in `ns`. */
export interface ApiCall {
  verb: string;
  resource: string;
  namespace: string;
}

/** The fields of a Kubernetes Status object (the body of every API error). */
interface ApiStatusBody {
  message?: string;
  reason?: string;
  details?: { kind?: string; name?: string };
}

/** The HTTP code and Status body of an API error; undefined code for a network failure. */
export function apiStatus(err: unknown): { code: number | undefined; body: ApiStatusBody } {
  if (err instanceof ApiException) {
    const raw: unknown = err.body;
    let body: ApiStatusBody = {};
    if (typeof raw === 'string') {
      try {
        body = JSON.parse(raw) as ApiStatusBody;
      } catch {
        body = { message: raw.slice(0, 500) };
      }
    } else if (raw && typeof raw === 'object') body = raw as ApiStatusBody;
    return { code: err.code, body };
  }
  // Watch failures carry the HTTP code as statusCode.
  const statusCode = (err as { statusCode?: unknown } | null)?.statusCode;
  return { code: typeof statusCode === 'number' ? statusCode : undefined, body: {} };
}

export const isNotFound = (err: unknown): boolean => apiStatus(err).code === 404;
export const isAlreadyExists = (err: unknown): boolean => {
  const { code, body } = apiStatus(err);
  return code === 409 && body.reason === 'AlreadyExists';
};

function detail(err: unknown): string {
  const { body } = apiStatus(err);
  if (body.message) return body.message;
  const code = (err as { code?: unknown } | null)?.code;
  const message = (err instanceof Error ? err.message : String(err)).split('\n')[0] ?? '';
  return typeof code === 'string' && !message.includes(code) ? `${code}: ${message}` : message;
}

/** The failure an activity throws for `err` from `call`; failures pass through unchanged. */
export function kubernetesFailure(err: unknown, call: ApiCall): ApplicationFailure {
  if (err instanceof ApplicationFailure) return err;
  const { code, body } = apiStatus(err);
  const what = `${call.verb} ${call.resource} in namespace ${call.namespace}`;
  const rejected = (type: string, message: string) =>
    ApplicationFailure.create({
      type,
      nonRetryable: true,
      message,
      cause: err instanceof Error ? err : undefined,
    });
  if (code === 401)
    return rejected(
      kubernetesRejectedErrorType,
      `Kubernetes API: cannot ${what}: the API server rejected the worker's credentials (401): check its kubeconfig or service account token`,
    );
  if (code === 403)
    return rejected(
      kubernetesRejectedErrorType,
      `Kubernetes API: cannot ${what}: forbidden (403): ${detail(err)}; the worker's ServiceAccount needs a Role allowing it`,
    );
  if (code === 404 && body.details?.kind === 'namespaces')
    return rejected(
      kubernetesRejectedErrorType,
      `Kubernetes API: cannot ${what}: namespace ${body.details.name ?? call.namespace} does not exist (launcher.namespace)`,
    );
  if (code === 400 || code === 422)
    return rejected(
      badInputErrorType,
      `Kubernetes API: cannot ${what}: the API server rejected it (${code}): ${detail(err)}`,
    );
  if (code === 404 || code === 405 || code === 413 || code === 415)
    return rejected(kubernetesRejectedErrorType, `Kubernetes API: cannot ${what} (${code}): ${detail(err)}`);
  // 409 conflicts, 429, 5xx, timeouts and network failures: worth another try.
  return ApplicationFailure.create({
    type: kubernetesUnavailableErrorType,
    message: `Kubernetes API: cannot ${what}${code ? ` (${code})` : ''}: ${detail(err)}`,
    cause: err instanceof Error ? err : undefined,
  });
}

export const isRetryable = (failure: ApplicationFailure): boolean => !failure.nonRetryable;

/** Attempts of one API call before its failure is the activity's (about 15 s in all). */
const callAttempts = 5;

/**
 * Runs `request`, retrying a retryable failure with exponential backoff (an API server restart
 * takes seconds); throws the mapped failure. `ok` turns an error that is an answer (a 404 to a
 * GET, a 409 to a create) into a result instead.
 */
export async function apiCall<T>(
  call: ApiCall,
  request: () => Promise<T>,
  ok?: (err: unknown) => T | undefined,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await request();
    } catch (err) {
      const answer = ok?.(err);
      if (answer !== undefined) return answer;
      const failure = kubernetesFailure(err, call);
      if (!isRetryable(failure) || attempt >= callAttempts) throw failure;
      await sleep(500 * 2 ** (attempt - 1));
    }
  }
}
