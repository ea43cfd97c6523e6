// Runs the Temporal CLI dev server (`temporal server start-dev`) as a child process for
// `moerl dev` and the integration tests: loopback only, the campaign search attributes
// registered, optional SQLite persistence, and no server outliving the process that started it.
import { spawn, type ChildProcess } from 'node:child_process';
import {
  accessSync,
  closeSync,
  constants,
  mkdtempSync,
  openSync,
  readSync,
  fstatSync,
  rmSync,
} from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { Connection } from '@temporalio/client';
import type { SearchAttributeType } from '@temporalio/common';
import { campaignSearchAttributes } from '../workflows/search-attributes.js';
import { resolveTool } from './temporal-tools.js';

export interface DevServerOptions {
  /** SQLite file that keeps workflows across restarts; in-memory when absent. */
  dbFile?: string;
  /** Namespace created at start (besides "default"); default "default". */
  namespace?: string;
  /** Frontend gRPC port; a free one when absent. */
  port?: number;
  /** Web UI port; a free one when absent. */
  uiPort?: number;
  /** Server stdout and stderr are appended here; a temporary file (removed by stop) when absent. */
  logFile?: string;
  /** The temporal binary; resolved by scripts/tools.sh when absent. */
  temporalPath?: string;
  /** How long to wait for the frontend to answer; default 60 s. */
  startTimeoutMs?: number;
}

export interface DevServer {
  /** Frontend address, `127.0.0.1:<port>`. */
  address: string;
  uiUrl: string;
  namespace: string;
  pid: number;
  logFile: string;
  /** SIGTERM, then SIGKILL if the server has not exited after `graceMs` (default 10 s). */
  stop(graceMs?: number): Promise<void>;
}

/** The dev server did not come up; the message ends with the tail of its log. */
export class DevServerError extends Error {
  override readonly name = 'DevServerError';
  constructor(
    message: string,
    /** The server's log says a port it wanted was taken (a retry on other ports may succeed). */
    readonly addressInUse = false,
  ) {
    super(message);
  }
}

const LOOPBACK = '127.0.0.1';
const PORT_ATTEMPTS = 3;

// The CLI's names for the search attribute types it can register.
const cliTypeName: Record<SearchAttributeType, string> = {
  TEXT: 'Text',
  KEYWORD: 'Keyword',
  INT: 'Int',
  DOUBLE: 'Double',
  BOOL: 'Bool',
  DATETIME: 'Datetime',
  KEYWORD_LIST: 'KeywordList',
};

export async function startDevServer(opts: DevServerOptions = {}): Promise<DevServer> {
  const temporal = opts.temporalPath ?? (await resolveTool('temporal'));
  const ownLogDir = opts.logFile ? undefined : mkdtempSync(join(tmpdir(), 'moerl-dev-server-'));
  const logFile = opts.logFile ?? join(ownLogDir as string, 'temporal.log');
  try {
    // A free port found by binding port 0 can be taken by someone else before the server
    // binds it; when we picked the ports ourselves, such a start is retried on new ones.
    for (let attempt = 1; ; attempt++) {
      const port = opts.port ?? (await freePort());
      const uiPort = opts.uiPort ?? (await freePort());
      try {
        return await startOnce(temporal, { ...opts, port, uiPort, logFile }, ownLogDir);
      } catch (err) {
        const pickedPorts = opts.port === undefined || opts.uiPort === undefined;
        const portTaken = err instanceof DevServerError && err.addressInUse;
        if (!(pickedPorts && portTaken && attempt < PORT_ATTEMPTS)) throw err;
      }
    }
  } catch (err) {
    if (ownLogDir) rmSync(ownLogDir, { recursive: true, force: true });
    throw err;
  }
}

type StartSettings = DevServerOptions & { port: number; uiPort: number; logFile: string };

async function startOnce(
  temporal: string,
  s: StartSettings,
  ownLogDir: string | undefined,
): Promise<DevServer> {
  const namespace = s.namespace ?? 'default';
  const args = ['server', 'start-dev', '--ip', LOOPBACK, '--port', String(s.port)];
  args.push('--ui-port', String(s.uiPort), '--log-level', 'warn');
  if (namespace !== 'default') args.push('--namespace', namespace);
  if (s.dbFile) args.push('--db-filename', s.dbFile);
  for (const key of campaignSearchAttributes)
    args.push('--search-attribute', `${key.name}=${cliTypeName[key.type]}`);

  const logFd = openSync(s.logFile, 'a');
  const logStart = fstatSync(logFd).size;
  let child: ChildProcess;
  try {
    child = spawnTiedToParent(temporal, args, logFd);
  } finally {
    closeSync(logFd);
  }
  const exited = new Promise<string>((resolve) =>
    child.once('exit', (code, signal) => resolve(signal ? `signal ${signal}` : `code ${code}`)),
  );
  child.once('error', () => undefined); // a spawn failure also ends in 'exit' or is caught below
  if (child.pid === undefined) {
    throw new DevServerError(`cannot start ${temporal}: the process did not spawn`);
  }
  liveServers.add(child);
  exited.then(() => liveServers.delete(child));

  const address = `${LOOPBACK}:${s.port}`;
  const stop = async (graceMs = 10_000): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(timer);
    }
    if (ownLogDir) rmSync(ownLogDir, { recursive: true, force: true });
  };

  try {
    await waitUntilServing(address, namespace, exited, s.startTimeoutMs ?? 60_000);
  } catch (err) {
    await stop(2_000).catch(() => undefined);
    const reason = err instanceof Error ? err.message : String(err);
    // A Go panic puts its cause first and a long stack after it: the cause is quoted on its own.
    const panic = logLines(s.logFile, logStart).find((line) => line.startsWith('panic: '));
    throw new DevServerError(
      `${reason}; command: ${temporal} ${args.join(' ')}\n${panic ? `${panic}\n` : ''}${logTail(s.logFile, logStart)}`,
      /address already in use/i.test(panic ?? logTail(s.logFile, logStart)),
    );
  }
  return {
    address,
    uiUrl: `http://${LOOPBACK}:${s.uiPort}`,
    namespace,
    pid: child.pid,
    logFile: s.logFile,
    stop,
  };
}

// Polls the frontend until it describes the namespace (so the server is fully up, not just
// listening), failing early when the process exits.
async function waitUntilServing(
  address: string,
  namespace: string,
  exited: Promise<string>,
  timeoutMs: number,
): Promise<void> {
  let exitReason: string | undefined;
  void exited.then((reason) => (exitReason = reason));
  const deadline = Date.now() + timeoutMs;
  let lastError = 'no answer yet';
  while (Date.now() < deadline) {
    if (exitReason) throw new Error(`temporal dev server exited with ${exitReason} before it was ready`);
    let connection: Connection | undefined;
    try {
      connection = await Connection.connect({ address, connectTimeout: 2_000 });
      await connection.workflowService.describeNamespace({ namespace });
      return;
    } catch (err) {
      lastError = err instanceof Error ? err.message : String(err);
    } finally {
      await connection?.close().catch(() => undefined);
    }
    await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 200))]);
  }
  throw new Error(
    `temporal dev server at ${address} not ready after ${timeoutMs} ms (last error: ${lastError})`,
  );
}

// Servers still running when this process exits are terminated with it. On Linux, setpriv's
// parent-death signal also covers a parent killed by a signal, where no 'exit' event fires.
const liveServers = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of liveServers) child.kill('SIGTERM');
});

function spawnTiedToParent(command: string, args: string[], logFd: number): ChildProcess {
  const setpriv = process.platform === 'linux' ? findOnPath('setpriv') : undefined;
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'TERM', command, ...args]] : [command, args];
  return spawn(file, argv, { stdio: ['ignore', logFd, logFd] });
}

/** An executable `name` in a PATH directory, or undefined. */
export function findOnPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not in this PATH entry
    }
  }
  return undefined;
}

/**
 * A TCP port on the loopback interface that was free a moment ago. It is held back from other
 * port-0 binds for a while: a connection to it is closed from the listening side first, which
 * leaves that side in TIME_WAIT, and the kernel hands out no port in TIME_WAIT for port 0 while
 * an explicit bind (SO_REUSEADDR, as servers set it) still succeeds. Without this the next
 * port-0 bind anywhere (the dev server's own internal services among them) may get it.
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer((socket) => socket.end());
    server.once('error', reject);
    server.listen(0, LOOPBACK, () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      if (!port) {
        server.close(() => reject(new Error('no port assigned')));
        return;
      }
      const client = connect(port, LOOPBACK);
      client.once('error', (err) => server.close(() => reject(err)));
      client.once('end', () => client.end());
      client.once('close', () => server.close(() => resolve(port)));
    });
  });
}

/** The last lines a server wrote to its log since byte `from` (for start-up failure messages). */
export function logTail(logFile: string, from: number, maxBytes = 4096): string {
  try {
    const fd = openSync(logFile, 'r');
    try {
      const size = fstatSync(fd).size;
      const start = Math.max(from, size - maxBytes);
      const buffer = Buffer.alloc(size - start);
      readSync(fd, buffer, 0, buffer.length, start);
      const text = buffer.toString('utf8').trimEnd();
      return text ? `--- ${logFile} (tail) ---\n${text}` : `(${logFile} is empty)`;
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    return `(cannot read ${logFile}: ${err instanceof Error ? err.message : String(err)})`;
  }
}

/** The lines of the first `maxBytes` a server wrote to its log from byte `from` ([] if unreadable). */
function logLines(logFile: string, from: number, maxBytes = 65_536): string[] {
  try {
    const fd = openSync(logFile, 'r');
    try {
      const buffer = Buffer.alloc(Math.max(0, Math.min(maxBytes, fstatSync(fd).size - from)));
      const n = readSync(fd, buffer, 0, buffer.length, from);
      return buffer.subarray(0, n).toString('utf8').split('\n');
    } finally {
      closeSync(fd);
    }
  } catch {
    return [];
  }
}
