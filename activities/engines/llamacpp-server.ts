// A supervisor of llama.cpp's llama-server on one GGUF file: starts it on 127.0.0.1, waits until
// /health says it is ready, restarts it when it dies (a bounded number of times), and loads new
// weights by restarting it on another GGUF file, since llama-server has no endpoint that swaps
// weights. Clients talk to it through openai.ts; their retries cover a restart's gap.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { freePort } from '../../cli/dev-server.js';
import { EngineError } from './errors.js';
import { openAiEngine, waitReady } from './openai.js';
import type { RolloutEngine, WeightsLoader } from './types.js';

export interface LlamaCppServerOptions {
  /** The llama.cpp folder (findLlamaCpp in llamacpp.ts): bin/llama-server. */
  llamaCppDir: string;
  /** The GGUF file to serve first. */
  model: string;
  /** Default: a free port, kept across restarts so clients keep their URL. */
  port?: number;
  /** Sequences decoded together (--parallel): one slot each. Default 1. */
  parallel?: number;
  /** Tokens of KV cache per slot (prompt + completion); --ctx-size is parallel times this. Default 4096. */
  contextPerSlot?: number;
  /** CPU threads for decoding and prompt batches. Default 1. */
  threads?: number;
  /** More llama-server flags, after the supervisor's own. */
  extraArgs?: readonly string[];
  /** Limit for one start, until /health answers 200. Default 120 s. */
  readyTimeoutMs?: number;
  /** Restarts after unexpected exits before the supervisor gives up. Default 5. */
  maxRestarts?: number;
  /** Each line the supervisor logs (starts, exits, restarts). */
  onEvent?: (line: string) => void;
}

/**
 * The flags that make llama-server a rollout engine. Its sampler defaults truncate the
 * distribution (top-k 40, min-p 0.05); RL samples from the policy itself, so only a request's
 * temperature and top_p act. The KV cache stays F32 (llama.cpp's default is F16) and flash
 * attention off (its CPU kernel rounds through F16: log-probs moved by up to 5e-3 on the tests'
 * model, against 1e-6 without it): the policy's own precision, what moerl's trainer computes.
 */
export const rolloutArgs = [
  ...['--top-k', '0', '--min-p', '0', '--top-p', '1', '--typical', '1'],
  ...['--repeat-penalty', '1', '--presence-penalty', '0', '--frequency-penalty', '0'],
  ...['--cache-type-k', 'f32', '--cache-type-v', 'f32', '--flash-attn', 'off'],
];

export interface LlamaCppServer extends WeightsLoader {
  /** Base URL, e.g. http://127.0.0.1:41234. */
  readonly url: string;
  /** The GGUF file being served. */
  readonly model: string;
  /** The running server's pid (undefined while stopped). */
  readonly pid: number | undefined;
  /** Restarts after unexpected exits so far. */
  readonly restarts: number;
  /** An OpenAI-compatible client of this server. */
  engine(options?: { timeoutMs?: number; maxRetries?: number }): RolloutEngine;
  /** Resolves once the server is ready (again, after a restart). */
  ready(signal?: AbortSignal): Promise<void>;
  /** Stops the server (SIGTERM, SIGKILL after 10 s); no restart follows. */
  stop(): Promise<void>;
}

const tailLines = 20;

/** Starts llama-server and resolves once it is ready. */
export async function startLlamaCppServer(options: LlamaCppServerOptions): Promise<LlamaCppServer> {
  const port = options.port ?? (await freePort());
  const url = `http://127.0.0.1:${port}`;
  const parallel = options.parallel ?? 1;
  const threads = String(options.threads ?? 1);
  const readyTimeoutMs = options.readyTimeoutMs ?? 120_000;
  const maxRestarts = options.maxRestarts ?? 5;
  const log = options.onEvent ?? (() => {});
  const health = openAiEngine({ baseUrl: url, timeoutMs: 5000, maxRetries: 0 });

  let model = options.model;
  let child: ChildProcess | undefined;
  let stopping = false;
  let restarts = 0;
  let tail: string[] = [];
  let failure: EngineError | undefined;
  // The current start: resolves when ready, rejects when the server cannot start.
  let started: Promise<void> = Promise.resolve();
  const killOnExit = () => child?.kill('SIGKILL');
  process.once('exit', killOnExit);

  function args(): string[] {
    return [
      ...['--model', model, '--host', '127.0.0.1', '--port', String(port)],
      ...['--parallel', String(parallel), '--ctx-size', String(parallel * (options.contextPerSlot ?? 4096))],
      ...['--threads', threads, '--threads-batch', threads, '--cont-batching'],
      ...rolloutArgs,
      ...(options.extraArgs ?? []),
    ];
  }

  function exitedEarly(code: number | null, signal: NodeJS.Signals | null): EngineError {
    const how = signal ? `killed by ${signal}` : `exit ${code}`;
    return new EngineError(
      `llama-server on ${model} stopped (${how}) before it was ready: ${tail.slice(-3).join(' | ')}`,
      'unavailable',
    );
  }

  function launch(): Promise<void> {
    tail = [];
    const proc = spawn(join(options.llamaCppDir, 'bin', 'llama-server'), args(), {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, OMP_NUM_THREADS: threads },
    });
    child = proc;
    const keep = (chunk: Buffer) => {
      for (const line of chunk.toString('utf8').split('\n'))
        if (line.trim() !== '') tail = [...tail.slice(1 - tailLines), line.trim()];
    };
    proc.stdout?.on('data', keep);
    proc.stderr?.on('data', keep);
    log(`llama-server pid ${proc.pid} starting on ${url} with ${model}`);
    let isReady = false;
    const exited = new Promise<never>((_, reject) => {
      proc.once('error', (err) =>
        reject(new EngineError(`cannot run llama-server: ${err.message}`, 'unavailable')),
      );
      proc.once('exit', (code, signal) => {
        if (child === proc) child = undefined;
        if (!isReady) return reject(exitedEarly(code, signal));
        if (stopping) return;
        log(`llama-server pid ${proc.pid} exited (${signal ?? `exit ${code}`})`);
        if (restarts >= maxRestarts) {
          failure = new EngineError(
            `llama-server on ${model} exited ${restarts + 1} times; gave up after ${maxRestarts} restarts: ` +
              tail.slice(-3).join(' | '),
            'unavailable',
          );
          started = Promise.reject(failure);
          started.catch(() => {});
          return;
        }
        restarts++;
        started = launch();
        started.catch((err: Error) => log(`llama-server restart failed: ${err.message}`));
      });
    });
    exited.catch(() => {});
    const readiness = new AbortController();
    return Promise.race([exited, waitReady(health, readyTimeoutMs, readiness.signal)]).then(
      () => {
        isReady = true;
        log(`llama-server pid ${proc.pid} ready`);
      },
      (err: unknown) => {
        readiness.abort();
        proc.kill('SIGKILL');
        throw err;
      },
    );
  }

  async function stopChild(): Promise<void> {
    const proc = child;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
    await gone;
    clearTimeout(timer);
  }

  started = launch();
  await started.catch(async (err: unknown) => {
    process.removeListener('exit', killOnExit);
    throw err;
  });

  return {
    url,
    get model() {
      return model;
    },
    get pid() {
      return child?.pid;
    },
    get restarts() {
      return restarts;
    },
    engine: (o = {}) =>
      openAiEngine({ baseUrl: url, timeoutMs: o.timeoutMs ?? 600_000, maxRetries: o.maxRetries ?? 8 }),
    async ready(signal) {
      if (failure) throw failure;
      await started;
      // A restart that began after `started` was read.
      if (!(await health.isReady(signal))) await waitReady(health, readyTimeoutMs, signal);
    },
    async loadWeights(path) {
      stopping = true;
      await stopChild();
      model = path;
      stopping = false;
      failure = undefined;
      started = launch();
      await started;
      log(`llama-server serves ${model}`);
    },
    async stop() {
      stopping = true;
      await stopChild();
      process.removeListener('exit', killOnExit);
    },
  };
}
