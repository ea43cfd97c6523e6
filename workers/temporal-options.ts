// How every moerl process reaches Temporal: address, namespace, TLS and API key from flags or
// the environment (the same variable names the Temporal CLI uses), and the task queue names.
// The API key is best given by file or environment: a flag's value is visible in `ps`.
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { Client, Connection } from '@temporalio/client';
import type { ConnectionOptions } from '@temporalio/client';
import type { NativeConnection } from '@temporalio/worker';
import type { TaskQueues } from '../workflows/types.js';

export interface TemporalOptions {
  /** host:port of the frontend. */
  address: string;
  namespace: string;
  apiKey?: string;
  tls?: {
    serverNameOverride?: string;
    serverRootCACertificate?: Buffer;
    clientCertPair?: { crt: Buffer; key: Buffer };
  };
}

export interface TemporalFlags {
  address?: string;
  namespace?: string;
  /** Visible to every user of the machine in the process list: callers warn (apiKeyFlagWarning). */
  apiKey?: string;
  /** File holding the API key (one trailing line break ignored). */
  apiKeyFile?: string;
  tlsCert?: string;
  tlsKey?: string;
  tlsCa?: string;
  tlsServerName?: string;
  /** Use TLS with the system roots even without certificates (Temporal Cloud with an API key). */
  tls?: boolean;
}

export const defaultAddress = '127.0.0.1:7233';

/** What a process given `--api-key` prints on stderr. */
export const apiKeyFlagWarning =
  'warning: --api-key shows the key to every user of this machine (ps, /proc); ' +
  'use TEMPORAL_API_KEY, --api-key-file FILE or TEMPORAL_API_KEY_FILE instead';

/** Flags win over the environment; files named by TLS and API key options are read here, once. */
export function temporalOptionsFrom(
  flags: TemporalFlags = {},
  env: NodeJS.ProcessEnv = process.env,
): TemporalOptions {
  const pick = (flag: string | undefined, name: string) => flag ?? (env[name] || undefined);
  const cert = pick(flags.tlsCert, 'TEMPORAL_TLS_CERT');
  const key = pick(flags.tlsKey, 'TEMPORAL_TLS_KEY');
  const ca = pick(flags.tlsCa, 'TEMPORAL_TLS_CA');
  const serverName = pick(flags.tlsServerName, 'TEMPORAL_TLS_SERVER_NAME');
  if ((cert === undefined) !== (key === undefined))
    throw new Error('TLS needs both a client certificate and its key (--tls-cert and --tls-key)');
  const read = (what: string, path: string) => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new Error(`cannot read ${what} ${path}: ${(err as Error).message}`);
    }
  };
  if (flags.apiKey !== undefined && flags.apiKeyFile !== undefined)
    throw new Error('give the API key once: --api-key or --api-key-file, not both');
  const readKey = (path: string) => {
    const text = read('API key file', path)
      .toString('utf8')
      .replace(/\r?\n$/, '');
    // The message never quotes the file: it holds a secret.
    if (text === '' || /[\p{Cc}]/u.test(text))
      throw new Error(`API key file ${path} is empty or holds more than one line`);
    return text;
  };
  // Flags before the environment, a key before a key file; a file is read only when it is used.
  const envKeyFile = env.TEMPORAL_API_KEY_FILE || undefined;
  const apiKey =
    flags.apiKey ??
    (flags.apiKeyFile === undefined ? undefined : readKey(flags.apiKeyFile)) ??
    (env.TEMPORAL_API_KEY || undefined) ??
    (envKeyFile === undefined ? undefined : readKey(envKeyFile));
  const useTls = flags.tls || env.TEMPORAL_TLS === 'true' || cert || ca || serverName || apiKey;
  return {
    address: pick(flags.address, 'TEMPORAL_ADDRESS') ?? defaultAddress,
    namespace: pick(flags.namespace, 'TEMPORAL_NAMESPACE') ?? 'default',
    ...(apiKey ? { apiKey } : {}),
    ...(useTls
      ? {
          tls: {
            ...(serverName ? { serverNameOverride: serverName } : {}),
            ...(ca ? { serverRootCACertificate: certificate('TLS CA certificate', ca, read).pem } : {}),
            ...(cert && key ? { clientCertPair: clientPair(cert, key, read) } : {}),
          },
        }
      : {}),
  };
}

/** A PEM certificate file, parsed: a file that is none fails here, naming it, not in a handshake. */
function certificate(what: string, path: string, read: (what: string, path: string) => Buffer) {
  const pem = read(what, path);
  try {
    return { pem, x509: new X509Certificate(pem) };
  } catch (err) {
    throw new Error(`${what} ${path} is not a PEM certificate: ${(err as Error).message}`);
  }
}

/**
 * The client certificate and its key, checked as the server would: a certificate out of its
 * validity or a key of another certificate is named here, where the handshake would only fail.
 */
function clientPair(cert: string, key: string, read: (what: string, path: string) => Buffer) {
  const { pem, x509 } = certificate('TLS certificate', cert, read);
  const now = Date.now();
  if (Date.parse(x509.validTo) < now) throw new Error(`TLS certificate ${cert} expired on ${x509.validTo}`);
  if (Date.parse(x509.validFrom) > now)
    throw new Error(`TLS certificate ${cert} is not valid before ${x509.validFrom}`);
  const keyPem = read('TLS key', key);
  let matches: boolean;
  try {
    matches = x509.checkPrivateKey(createPrivateKey(keyPem));
  } catch (err) {
    throw new Error(`TLS key ${key} is not a PEM private key: ${(err as Error).message}`);
  }
  if (!matches) throw new Error(`TLS key ${key} is not the key of certificate ${cert}`);
  return { crt: pem, key: keyPem };
}

function connectionOptions(opts: TemporalOptions): ConnectionOptions & { apiKey?: string } {
  return {
    address: opts.address,
    ...(opts.tls ? { tls: opts.tls } : {}),
    ...(opts.apiKey ? { apiKey: opts.apiKey } : {}),
  };
}

/** A client for starting, signalling and querying campaigns. */
export async function connectClient(
  opts: TemporalOptions,
  connectTimeoutMs = 10_000,
): Promise<{ client: Client; connection: Connection }> {
  const connection = await explainingTls(opts, () =>
    Connection.connect({ ...connectionOptions(opts), connectTimeout: connectTimeoutMs }),
  );
  return { client: new Client({ connection, namespace: opts.namespace }), connection };
}

/** The connection workers poll through. */
export async function connectWorkerConnection(opts: TemporalOptions): Promise<NativeConnection> {
  // Loaded here, not at the top: every CLI command imports this module, and the worker SDK
  // (its native runtime) roughly doubles the start-up time of a command that only needs a client.
  const { NativeConnection } = await import('@temporalio/worker');
  return explainingTls(opts, () => NativeConnection.connect(connectionOptions(opts)));
}

/**
 * Runs `connect`; when it fails over TLS, the SDK says only that it could not connect in time,
 * so the handshake is tried again here to name why (an unknown CA, a refused certificate).
 */
async function explainingTls<T>(opts: TemporalOptions, connect: () => Promise<T>): Promise<T> {
  try {
    return await connect();
  } catch (err) {
    const why = opts.tls ? await tlsHandshakeFailure(opts.address, opts.tls) : undefined;
    if (why)
      throw new Error(`cannot connect to Temporal at ${opts.address}: the TLS handshake failed: ${why}`, {
        cause: err,
      });
    throw err;
  }
}

/** Why a TLS handshake with `address` fails, or undefined when it succeeds (or nothing answers). */
export function tlsHandshakeFailure(
  address: string,
  tls: NonNullable<TemporalOptions['tls']>,
): Promise<string | undefined> {
  const colon = address.lastIndexOf(':');
  const host = address.slice(0, colon).replace(/^\[|\]$/g, '');
  const servername = tls.serverNameOverride ?? (isIP(host) ? undefined : host);
  return new Promise((resolve) => {
    const socket = tlsConnect({
      host,
      port: Number(address.slice(colon + 1)),
      ...(servername ? { servername } : {}),
      ...(tls.serverRootCACertificate ? { ca: tls.serverRootCACertificate } : {}),
      ...(tls.clientCertPair ? { cert: tls.clientCertPair.crt, key: tls.clientCertPair.key } : {}),
      ALPNProtocols: ['h2'],
    });
    const done = (why: string | undefined) => {
      socket.destroy();
      resolve(why);
    };
    socket.once('error', (err: NodeJS.ErrnoException) =>
      done(/ECONNREFUSED|ENOTFOUND|EHOSTUNREACH/.test(err.code ?? '') ? undefined : err.message),
    );
    // Under TLS 1.3 the server's verdict on the client's certificate arrives after the handshake.
    socket.once('secureConnect', () => {
      socket.resume();
      setTimeout(() => done(undefined), 1_000);
    });
    socket.setTimeout(5_000, () => done(undefined));
  });
}

/** Task queue names; a prefix lets several deployments (or test runs) share one namespace. */
export function taskQueuesFrom(env: NodeJS.ProcessEnv = process.env): TaskQueues {
  const prefix = env.MOERL_TASK_QUEUE_PREFIX ?? '';
  return { control: `${prefix}control`, rollout: `${prefix}rollout`, train: `${prefix}train` };
}
