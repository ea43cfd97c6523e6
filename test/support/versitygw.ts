// Test harness: a real S3-compatible server, versitygw with its posix backend on a temporary
// folder, bound to 127.0.0.1 on a free port, with root credentials generated for this run
// (handed over in its environment, never on a command line or in a log). One per suite.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  accessSync,
  closeSync,
  constants,
  fstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { CreateBucketCommand, S3Client } from '@aws-sdk/client-s3';
import { freePort, logTail } from '../../cli/dev-server.js';
import { resolveTool } from '../../cli/temporal-tools.js';

export interface Versitygw {
  /** http://127.0.0.1:<port> */
  endpoint: string;
  region: string;
  accessKey: string;
  secretKey: string;
  /** Creates a bucket with a fresh name (or the given one) and returns its name. */
  createBucket(name?: string): Promise<string>;
  /** SIGTERM, then SIGKILL after `graceMs` (default 5 s); removes the data folder. */
  stop(graceMs?: number): Promise<void>;
}

const LOOPBACK = '127.0.0.1';
const PORT_ATTEMPTS = 3;
const region = 'us-east-1';

export async function startVersitygw(opts: { startTimeoutMs?: number } = {}): Promise<Versitygw> {
  const binary = await resolveTool('versitygw');
  const dir = mkdtempSync(join(tmpdir(), 'moerl-versitygw-'));
  try {
    for (let attempt = 1; ; attempt++) {
      try {
        return await startOnce(binary, dir, await freePort(), opts.startTimeoutMs ?? 30_000);
      } catch (err) {
        // A port found free a moment ago may be taken before the server binds it.
        const portTaken = /address already in use/i.test(err instanceof Error ? err.message : '');
        if (!portTaken || attempt >= PORT_ATTEMPTS) throw err;
      }
    }
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

async function startOnce(binary: string, dir: string, port: number, timeoutMs: number): Promise<Versitygw> {
  const dataDir = join(dir, 'data');
  mkdirSync(dataDir, { recursive: true });
  const logFile = join(dir, 'versitygw.log');
  const accessKey = `moerl${randomBytes(6).toString('hex')}`;
  const secretKey = randomBytes(24).toString('base64url');
  const args = ['--port', `${LOOPBACK}:${port}`, '--quiet', '--health', '/health', 'posix', dataDir];
  const env = { ...process.env, ROOT_ACCESS_KEY_ID: accessKey, ROOT_SECRET_ACCESS_KEY: secretKey };

  const logFd = openSync(logFile, 'a');
  const logStart = fstatSync(logFd).size;
  let child: ChildProcess;
  try {
    child = spawnTiedToParent(binary, args, logFd, env);
  } finally {
    closeSync(logFd);
  }
  const exited = new Promise<string>((resolve) =>
    child.once('exit', (code, signal) => resolve(signal ? `signal ${signal}` : `code ${code}`)),
  );
  child.once('error', () => undefined); // a failed spawn also ends in 'exit'
  liveServers.add(child);
  void exited.then(() => liveServers.delete(child));

  const stopProcess = async (graceMs: number): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(timer);
    }
  };
  const endpoint = `http://${LOOPBACK}:${port}`;
  try {
    await waitUntilHealthy(`${endpoint}/health`, exited, timeoutMs);
  } catch (err) {
    await stopProcess(2_000);
    throw new Error(
      `${err instanceof Error ? err.message : String(err)}; command: ${binary} ${args.join(' ')}\n` +
        logTail(logFile, logStart),
    );
  }

  const client = new S3Client({
    region,
    endpoint,
    forcePathStyle: true,
    credentials: { accessKeyId: accessKey, secretAccessKey: secretKey },
  });
  let buckets = 0;
  return {
    endpoint,
    region,
    accessKey,
    secretKey,
    async createBucket(name) {
      const bucket = name ?? `moerl-test-${++buckets}-${randomBytes(3).toString('hex')}`;
      await client.send(new CreateBucketCommand({ Bucket: bucket }));
      return bucket;
    },
    async stop(graceMs = 5_000) {
      client.destroy();
      await stopProcess(graceMs);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

// Polls the health endpoint until it answers 200, failing early when the process exits.
async function waitUntilHealthy(url: string, exited: Promise<string>, timeoutMs: number): Promise<void> {
  let exitReason: string | undefined;
  void exited.then((reason) => (exitReason = reason));
  const deadline = Date.now() + timeoutMs;
  let lastError = 'no answer yet';
  while (Date.now() < deadline) {
    if (exitReason) throw new Error(`versitygw exited with ${exitReason} before it was ready`);
    try {
      const answer = await fetch(url, { signal: AbortSignal.timeout(1_000) });
      if (answer.ok) return;
      lastError = `HTTP ${answer.status}`;
    } catch (err) {
      lastError = err instanceof Error ? err.message : String(err);
    }
    await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 100))]);
  }
  throw new Error(`versitygw at ${url} not ready after ${timeoutMs} ms (last error: ${lastError})`);
}

// Servers still running when this process exits go with it; on Linux, setpriv's parent-death
// signal also covers a test process killed by a signal.
const liveServers = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of liveServers) child.kill('SIGTERM');
});

function spawnTiedToParent(
  command: string,
  args: string[],
  logFd: number,
  env: NodeJS.ProcessEnv,
): ChildProcess {
  const setpriv = process.platform === 'linux' ? findOnPath('setpriv') : undefined;
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'TERM', command, ...args]] : [command, args];
  return spawn(file, argv, { stdio: ['ignore', logFd, logFd], env });
}

function findOnPath(name: string): string | undefined {
  return (process.env.PATH ?? '')
    .split(delimiter)
    .filter(Boolean)
    .map((dir) => join(dir, name))
    .find((candidate) => {
      try {
        accessSync(candidate, constants.X_OK);
        return true;
      } catch {
        return false;
      }
    });
}
