// The reward model's credential: one header whose secret comes from the worker's environment or
// from a file on the worker. The spec names only the variable or the file, so the secret never
// reaches the spec, the workflow history or an error message. A spec is untrusted: it may name
// only the variables and files the worker's operator allows (MOERL_REWARD_SECRET_ENVS,
// MOERL_REWARD_SECRET_FILES), never, say, TEMPORAL_API_KEY or the pod's service-account token.
import { readFileSync, realpathSync } from 'node:fs';
import { basename, dirname, isAbsolute, join, resolve, sep } from 'node:path';
import { BadInputError } from './errors.js';

/** Comma-separated environment variable names a spec's `secretEnv` may name. */
export const secretEnvsSetting = 'MOERL_REWARD_SECRET_ENVS';
/** Comma-separated absolute paths a spec's `secretFile` may name; one ending in "/" allows its files. */
export const secretFilesSetting = 'MOERL_REWARD_SECRET_FILES';

const list = (value: string | undefined) =>
  (value ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');

/** Whether the operator's setting allows `file` (symbolic links and ".." resolved first). */
function fileAllowed(file: string, allowed: string[]): boolean {
  // A file that does not exist is judged by where it would be, and reported unreadable below.
  let real: string;
  try {
    real = realpathSync(file);
  } catch {
    try {
      real = join(realpathSync(dirname(file)), basename(file));
    } catch {
      real = resolve(file);
    }
  }
  return allowed.some((a) => {
    if (!isAbsolute(a)) return false;
    try {
      if (!a.endsWith('/')) return a === real || realpathSync(a) === real;
      return real.startsWith(realpathSync(a) + sep);
    } catch {
      return false;
    }
  });
}

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
    if (!list(env[secretEnvsSetting]).includes(auth.secretEnv))
      throw fail(
        `${where} is not one this worker allows (${secretEnvsSetting}=${env[secretEnvsSetting] ?? ''}); ` +
          `the worker's operator lists the variables a spec may name`,
      );
    secret = env[auth.secretEnv] ?? '';
    if (secret === '') throw fail(`${where} is not set on this worker (it holds the ${auth.header} secret)`);
  } else if (auth.secretFile !== undefined) {
    where = `secret file ${auth.secretFile}`;
    if (!fileAllowed(auth.secretFile, list(env[secretFilesSetting])))
      throw fail(
        `${where} is not one this worker allows (${secretFilesSetting}=${env[secretFilesSetting] ?? ''}); ` +
          `the worker's operator lists the files a spec may name`,
      );
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
