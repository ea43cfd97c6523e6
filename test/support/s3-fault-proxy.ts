// An S3 fault proxy for chaos tests: a small HTTP proxy on 127.0.0.1 between S3 clients and a
// real S3 server (versitygw) that, on a seeded schedule, answers 500/503 without forwarding,
// resets the connection before forwarding, forwards and then drops the answer (the server did
// the work, the client never hears), delays, or cuts an answer's body short. Requests are
// forwarded byte for byte (Host included), so SigV4 signatures stay valid.
//
// Run as its own process: `node s3-fault-proxy.js --upstream http://127.0.0.1:P --seed N
// [--rate 0.1] [--delay-ms 1500] [--part-delay-ms 0]`; it prints one line `{"port":N}` when
// it listens. `GET /__faults` answers the counts so far; `POST /__faults?rate=R&partDelayMs=D`
// changes the profile (neither is forwarded, nor faulted).
import { createServer, request, type IncomingMessage, type ServerResponse } from 'node:http';
import { parseArgs } from 'node:util';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';

export const faultKinds = ['status500', 'status503', 'reset', 'lostResponse', 'delay', 'truncate'] as const;
export type FaultKind = (typeof faultKinds)[number];

export interface ProxyStats {
  requests: number;
  faults: Record<FaultKind, number>;
  /** UploadPart requests forwarded (the multipart test waits for the first). */
  partsForwarded: number;
}

/** A small seeded generator (mulberry32): the same seed gives the same sequence. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Profile {
  rate: number;
  delayMs: number;
  partDelayMs: number;
}

function s3Error(res: ServerResponse, status: number, code: string): void {
  const body = `<?xml version="1.0" encoding="UTF-8"?><Error><Code>${code}</Code><Message>injected by the fault proxy</Message></Error>`;
  res.writeHead(status, { 'content-type': 'application/xml', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

export function serveFaultProxy(upstream: URL, seed: number, profile: Profile) {
  const random = seededRandom(seed);
  const stats: ProxyStats = {
    requests: 0,
    faults: Object.fromEntries(faultKinds.map((k) => [k, 0])) as Record<FaultKind, number>,
    partsForwarded: 0,
  };
  const pick = (): FaultKind | undefined => {
    if (random() >= profile.rate) return undefined;
    return faultKinds[Math.floor(random() * faultKinds.length)];
  };

  const forward = (req: IncomingMessage, res: ServerResponse, fault: FaultKind | undefined) => {
    const out = request(
      {
        host: upstream.hostname,
        port: upstream.port,
        method: req.method,
        path: req.url,
        headers: req.headers,
      },
      (answer) => {
        if (fault === 'lostResponse') {
          answer.resume();
          answer.once('end', () => req.socket.destroy());
          return;
        }
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        if (fault !== 'truncate') {
          answer.pipe(res);
          return;
        }
        // Half the body (at least one byte short), then the connection goes.
        const declared = Number(answer.headers['content-length'] ?? 0);
        let budget = Math.floor(declared / 2);
        answer.on('data', (chunk: Buffer) => {
          if (budget > 0) res.write(chunk.subarray(0, budget));
          budget -= Math.min(budget, chunk.length);
          if (budget === 0) {
            answer.destroy();
            res.socket?.destroy();
          }
        });
        answer.once('end', () => res.socket?.destroy());
      },
    );
    out.once('error', () => req.socket.destroy());
    req.pipe(out);
  };

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://proxy');
    if (url.pathname === '/__faults') {
      if (req.method === 'POST') {
        for (const [name, value] of url.searchParams) {
          const n = Number(value);
          if (!(name in profile) || !Number.isFinite(n) || n < 0)
            return s3Error(res, 400, `BadProfile:${name}`);
          profile[name as keyof Profile] = n;
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ ...stats, profile }));
    }
    stats.requests++;
    const isPart = url.searchParams.has('partNumber') && url.searchParams.has('uploadId');
    const fault = pick();
    if (fault) stats.faults[fault]++;
    switch (fault) {
      case 'status500':
      case 'status503':
        req.resume();
        req.once('end', () =>
          fault === 'status500' ? s3Error(res, 500, 'InternalError') : s3Error(res, 503, 'SlowDown'),
        );
        return;
      case 'reset':
        req.socket.destroy();
        return;
    }
    const wait = (fault === 'delay' ? profile.delayMs : 0) + (isPart ? profile.partDelayMs : 0);
    setTimeout(() => {
      if (isPart) stats.partsForwarded++;
      forward(req, res, fault);
    }, wait);
  });
  server.keepAliveTimeout = 30_000;
  return { server, stats };
}

export interface FaultProxy {
  /** http://127.0.0.1:<port>, the endpoint clients use instead of the server's. */
  endpoint: string;
  stats(): Promise<ProxyStats>;
  setProfile(p: Partial<Profile>): Promise<void>;
  stop(): Promise<void>;
}

/** Starts the proxy as a child process (so it is a process of its own, as it would be on a host). */
export async function startFaultProxy(
  upstream: string,
  seed: number,
  opts: { rate?: number; delayMs?: number; partDelayMs?: number } = {},
): Promise<FaultProxy> {
  const args = [fileURLToPath(import.meta.url), '--upstream', upstream, '--seed', String(seed)];
  args.push('--rate', String(opts.rate ?? 0.1), '--delay-ms', String(opts.delayMs ?? 1500));
  args.push('--part-delay-ms', String(opts.partDelayMs ?? 0));
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  process.once('exit', () => child.kill('SIGTERM'));
  const lines = createInterface({ input: child.stdout });
  const first = await Promise.race([
    new Promise<string>((resolve) => lines.once('line', resolve)),
    exited.then(() => {
      throw new Error(`the S3 fault proxy exited before it listened (command: node ${args.join(' ')})`);
    }),
  ]);
  const endpoint = `http://127.0.0.1:${(JSON.parse(first) as { port: number }).port}`;
  const control = async (method: string, query = '') => {
    const answer = await fetch(`${endpoint}/__faults${query}`, { method });
    if (!answer.ok) throw new Error(`fault proxy ${method} /__faults${query}: HTTP ${answer.status}`);
    return (await answer.json()) as ProxyStats;
  };
  return {
    endpoint,
    stats: () => control('GET'),
    async setProfile(p) {
      const q = new URLSearchParams(Object.entries(p).map(([k, v]): [string, string] => [k, String(v)]));
      await control('POST', `?${q}`);
    },
    async stop() {
      child.kill('SIGTERM');
      await exited;
    },
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      upstream: { type: 'string' },
      seed: { type: 'string', default: '1' },
      rate: { type: 'string', default: '0.1' },
      'delay-ms': { type: 'string', default: '1500' },
      'part-delay-ms': { type: 'string', default: '0' },
    },
  });
  if (!values.upstream) {
    console.error('s3-fault-proxy: --upstream http://host:port is required');
    process.exit(2);
  }
  const profile = {
    rate: Number(values.rate),
    delayMs: Number(values['delay-ms']),
    partDelayMs: Number(values['part-delay-ms']),
  };
  const { server } = serveFaultProxy(new URL(values.upstream), Number(values.seed), profile);
  server.listen(0, '127.0.0.1', () => {
    const address = server.address();
    console.log(JSON.stringify({ port: typeof address === 'object' && address ? address.port : 0 }));
  });
  // Keep-alive connections of the clients would hold a graceful close open.
  process.once('SIGTERM', () => process.exit(0));
}
