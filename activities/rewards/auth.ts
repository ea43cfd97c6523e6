// The reward model's credential: one header whose secret comes from the worker's environment or
// from a file on the worker. The spec names only the variable or the file, so the secret never
// reaches the spec, the workflow history or an error message.
import { readFileSync } from 'node:fs';
import { BadInputError } from './errors.js';

/** The spec's `reward.auth` (workflows/spec.ts): exactly one of secretEnv and secretFile. */
export interface RewardModelAuth {
  /** Header name, e.g. "authorization" or "x-api-key". */
  header: string;
  /** Put before the secret with one space, e.g. "Bearer"; none when absent. */
  scheme?: string | undefined;
  /** Environment variable of the worker holding the secret. */
  secretEnv?: string | undefined;
  /** File on the worker holding the secret (one trailing line break is ignored). */
  secretFile?: string | undefined;
}

/** The headers `auth` asks for, read now; BadInputError (never quoting the secret) when it cannot be. */
export function rewardAuthHeaders(
  auth: RewardModelAuth | undefined,
  env: NodeJS.ProcessEnv = process.env,
): Record<string, string> {
  if (!auth) return {};
  const fail = (what: string) => new BadInputError(`reward model auth: ${what}`);
  let secret: string;
  let where: string;
  if (auth.secretEnv !== undefined) {
    where = `environment variable ${auth.secretEnv}`;
    secret = env[auth.secretEnv] ?? '';
    if (secret === '') throw fail(`${where} is not set on this worker (it holds the ${auth.header} secret)`);
  } else if (auth.secretFile !== undefined) {
    where = `secret file ${auth.secretFile}`;
    try {
      secret = readFileSync(auth.secretFile, 'utf8').replace(/\r?\n$/, '');
    } catch (err) {
      throw fail(`cannot read ${where} on this worker: ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
    }
    if (secret === '') throw fail(`${where} is empty`);
  } else {
    throw fail('give secretEnv or secretFile');
  }
  // A line break would end the header early (and fetch refuses it with a message quoting it).
  if (/[\p{Cc}]/u.test(secret)) throw fail(`${where} holds a line break or another control character`);
  return { [auth.header]: auth.scheme ? `${auth.scheme} ${secret}` : secret };
}
