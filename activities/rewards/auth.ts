// The reward model's credential: one header whose secret comes from the worker's environment or
// from a file on the worker. The spec names only the variable or the file, so the secret never
// reaches the spec, the workflow history or an error message. A spec is untrusted: it may name
// only the variables and files the worker's operator allows, each paired with the origins it may
// go to (MOERL_REWARD_SECRET_ENVS, MOERL_REWARD_SECRET_FILES), never, say, TEMPORAL_API_KEY or
// the pod's service-account token, and never an allowed secret to a server of its own.
import { readFileSync, realpathSync } from 'node:fs';
import { basename, dirname, isAbsolute, join, resolve, sep } from 'node:path';
import { BadInputError } from './errors.js';

/**
 * Comma-separated `NAME=ORIGIN` pairs: the environment variables a spec's `secretEnv` may name,
 * each with an origin (scheme, host and port, e.g. https://rm.internal:8443) its secret may go to.
 */
export const secretEnvsSetting = 'MOERL_REWARD_SECRET_ENVS';
/**
 * Comma-separated `PATH=ORIGIN` pairs: the absolute paths a spec's `secretFile` may name (one
 * ending in "/" allows its files), each with an origin its secret may go to.
 */
export const secretFilesSetting = 'MOERL_REWARD_SECRET_FILES';

/** One allowed secret of a setting, and where it may go. */
interface AllowedSecret {
  secret: string;
  origin: string;
}

/**
 * A setting's pairs; an entry without an origin, or with one that is not a bare http(s) origin,
 * is the operator's mistake, named (a secret allowed to go anywhere is what the pairs prevent).
 */
function allowedSecrets(setting: string, env: NodeJS.ProcessEnv): AllowedSecret[] {
  const fail = (entry: string, why: string) =>
    new BadInputError(
      `reward model auth: ${setting} entry ${JSON.stringify(entry)} ${why}; ` +
        `the worker's operator pairs each secret with the origin it may go to, e.g. ${setting}=${setting === secretEnvsSetting ? 'RM_TOKEN' : '/run/secrets/rm-token'}=https://rm.internal:8443`,
    );
  return list(env[setting]).map((entry) => {
    const at = entry.lastIndexOf('=');
    if (at <= 0) throw fail(entry, 'names no origin');
    const secret = entry.slice(0, at).trim();
    const text = entry.slice(at + 1).trim();
    let url: URL;
    try {
      url = new URL(text);
    } catch {
      throw fail(entry, `has ${JSON.stringify(text)}, not an origin`);
    }
    if (
      (url.protocol !== 'https:' && url.protocol !== 'http:') ||
      url.username ||
      url.password ||
      url.pathname !== '/' ||
      url.search ||
      url.hash
    )
      throw fail(entry, `has ${JSON.stringify(text)}, not an http(s) origin (scheme, host and port only)`);
    return { secret, origin: url.origin };
  });
}

const list = (value: string | undefined) =>
  (value ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');

/** Whether the allowed path `a` (a file, or a folder ending in "/") holds `file` (symbolic links and ".." resolved first). */
function fileAllowed(file: string, a: string): boolean {
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
  if (!isAbsolute(a)) return false;
  try {
    if (!a.endsWith('/')) return a === real || realpathSync(a) === real;
    return real.startsWith(realpathSync(a) + sep);
  } catch {
    return false;
  }
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
  url: string,
  env: NodeJS.ProcessEnv = process.env,
): Record<string, string> {
  if (!auth) return {};
  const fail = (what: string) => new BadInputError(`reward model auth: ${what}`);
  let origin: string;
  try {
    origin = new URL(url).origin;
  } catch {
    throw fail(`url ${JSON.stringify(url)} is not a URL`);
  }
  /** The setting's origins for the secret, checked against the spec's url. */
  const checkAllowed = (where: string, setting: string, matches: (a: AllowedSecret) => boolean) => {
    const allowed = allowedSecrets(setting, env).filter(matches);
    if (allowed.length === 0)
      throw fail(
        `${where} is not one this worker allows (${setting}=${env[setting] ?? ''}); ` +
          `the worker's operator lists the secrets a spec may name, each with the origins it may go to`,
      );
    if (!allowed.some((a) => a.origin === origin))
      throw fail(
        `${where} may go to ${allowed.map((a) => a.origin).join(', ')} only (${setting}), not to ${origin}, ` +
          `the origin of the spec's url`,
      );
  };
  let secret: string;
  let where: string;
  if (auth.secretEnv !== undefined) {
    where = `environment variable ${auth.secretEnv}`;
    checkAllowed(where, secretEnvsSetting, (a) => a.secret === auth.secretEnv);
    secret = env[auth.secretEnv] ?? '';
    if (secret === '') throw fail(`${where} is not set on this worker (it holds the ${auth.header} secret)`);
  } else if (auth.secretFile !== undefined) {
    const file = auth.secretFile;
    where = `secret file ${file}`;
    checkAllowed(where, secretFilesSetting, (a) => fileAllowed(file, a.secret));
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
