// The OpenAI-compatible server a rollout worker's shards sample from when a campaign's spec says
// `engine.rollout: openai` (docs/engines.md, "Where the rollout server comes from"). Which server
// is the operator's choice, read from the worker's environment, never the spec's:
//   MOERL_ROLLOUT_ENGINE_URL set: a server already running beside the worker (vLLM, SGLang in the
//     rollout pod). New weights reach it as a Hugging Face folder written under
//     MOERL_ROLLOUT_ENGINE_WEIGHTS_DIR (a volume both see) and `POST /update_weights_from_disk
//     {"model_path"}` (SGLang's endpoint; a vLLM server with the same endpoint).
//   otherwise: a llama-server this worker starts and supervises (llamacpp-server.ts), from
//     MOERL_LLAMACPP_DIR or the tools cache, on the policy converted to GGUF F32 with llama.cpp's
//     converter once per checkpoint (kept in the worker's cache by manifest sha).
// One server per worker process: shards of one checkpoint share it; a shard of another checkpoint
// waits until they are done, then the server is given the new weights.
import { mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { exportCheckpoint } from '../models/export.js';
import type { ObjectStore } from '../store/types.js';
import type { CheckpointRef } from '../types.js';
import { EngineError } from './errors.js';
import { convertToGguf, findLlamaCpp, llamaCppMissingReason } from './llamacpp.js';
import { startLlamaCppServer } from './llamacpp-server.js';
import type { LlamaCppServer } from './llamacpp-server.js';
import { openAiEngine, waitReady } from './openai.js';
import { pytorchTrainer } from './pytorch.js';
import type { RolloutEngine } from './types.js';

export const rolloutEngineUrlEnv = 'MOERL_ROLLOUT_ENGINE_URL';
export const rolloutEngineWeightsDirEnv = 'MOERL_ROLLOUT_ENGINE_WEIGHTS_DIR';
export const rolloutEngineModelEnv = 'MOERL_ROLLOUT_ENGINE_MODEL';

/** A policy to serve: a committed checkpoint of a campaign that started from a Hugging Face model. */
export interface ServedPolicy {
  store: ObjectStore;
  policy: CheckpointRef;
}

export interface RolloutServerHost {
  /** Where the server is, for messages. */
  describe(): string;
  /**
   * Runs `use` with an engine that serves `p`: the weights are put behind the server first unless
   * it serves them already. Shards of other checkpoints wait until every `use` of this one ends.
   */
  withPolicy<T>(p: ServedPolicy, signal: AbortSignal, use: (engine: RolloutEngine) => Promise<T>): Promise<T>;
  /** Stops a server this host started. */
  close(): Promise<void>;
}

/** Per-request limit: a chunk's completion on a CPU server may take minutes. */
const requestTimeoutMs = 600_000;
/** Retries of a request that may pass: enough to span a supervised restart of the server. */
const requestRetries = 8;

interface Backend {
  describe(): string;
  /** Puts the policy behind the server; resolves once it serves it. */
  load(p: ServedPolicy, hfDir: (out: string) => Promise<void>, signal: AbortSignal): Promise<void>;
  engine(): RolloutEngine;
  close(): Promise<void>;
}

/** The host for a worker whose environment is `env`; `cacheDir` keeps the converted policies. */
export function rolloutServerHost(
  env: NodeJS.ProcessEnv,
  cacheDir: string,
  binDir: string,
): RolloutServerHost {
  const backend = env[rolloutEngineUrlEnv] ? externalServer(env) : llamaCppServer(env, cacheDir);
  let serving: string | null = null;
  let users = 0;
  let loading: Promise<void> | null = null;
  const idle: (() => void)[] = [];

  /** Exports the checkpoint as a Hugging Face folder at `out` (the campaign's model files beside it). */
  const hfDir = (p: ServedPolicy, signal: AbortSignal) => async (out: string) => {
    const exported = await exportCheckpoint({
      store: p.store,
      campaignId: p.policy.campaignId,
      iteration: p.policy.iteration,
      target: { kind: 'dir', path: out },
      replace: true,
      workDir: cacheDir,
      binDir,
      signal,
    });
    if (exported.checkpoint.manifestSha256 !== p.policy.manifestSha256)
      throw new Error(
        `checkpoint ${p.policy.key} in ${p.store.describe()} has manifest sha256 ${exported.checkpoint.manifestSha256}, not the ${p.policy.manifestSha256} the rollout was given`,
      );
  };

  async function acquire(p: ServedPolicy, signal: AbortSignal): Promise<void> {
    const sha = p.policy.manifestSha256;
    for (;;) {
      signal.throwIfAborted();
      if (loading) {
        await loading.catch(() => {});
        continue;
      }
      if (serving === sha) {
        users++;
        return;
      }
      if (users > 0) {
        await new Promise<void>((resolve) => idle.push(resolve));
        continue;
      }
      serving = null;
      loading = backend.load(p, hfDir(p, signal), signal);
      try {
        await loading;
        serving = sha;
      } finally {
        loading = null;
      }
    }
  }

  function release(): void {
    users--;
    if (users === 0) for (const wake of idle.splice(0)) wake();
  }

  return {
    describe: () => backend.describe(),
    async withPolicy(p, signal, use) {
      await acquire(p, signal);
      try {
        return await use(backend.engine());
      } finally {
        release();
      }
    },
    close: () => backend.close(),
  };
}

/** A server the operator runs beside the worker, given new weights by update_weights_from_disk. */
function externalServer(env: NodeJS.ProcessEnv): Backend {
  const url = env[rolloutEngineUrlEnv] ?? '';
  const weightsDir = env[rolloutEngineWeightsDirEnv];
  const model = env[rolloutEngineModelEnv];
  const engine = openAiEngine({
    baseUrl: url,
    timeoutMs: requestTimeoutMs,
    maxRetries: requestRetries,
    ...(model ? { model } : {}),
  });
  const update = new URL('update_weights_from_disk', url.endsWith('/') ? url : `${url}/`);
  return {
    describe: () => `the rollout server at ${engine.endpoint} (${rolloutEngineUrlEnv})`,
    engine: () => engine,
    async load(p, hfDir, signal) {
      if (!weightsDir)
        throw new EngineError(
          `${rolloutEngineUrlEnv} is set but ${rolloutEngineWeightsDirEnv} is not: the rollout worker writes each policy as a Hugging Face folder there for the server at ${url} to load (a volume both mount)`,
          'rejected',
        );
      const out = join(weightsDir, `${p.policy.campaignId}-${p.policy.manifestSha256.slice(0, 16)}`);
      if (!(await isDir(out))) await hfDir(out);
      await waitReady(engine, requestTimeoutMs, signal);
      const response = await fetch(update, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model_path: out }),
        signal,
      });
      const text = await response.text();
      let ok = false;
      try {
        ok = response.ok && (JSON.parse(text) as { success?: unknown }).success !== false;
      } catch {
        ok = false;
      }
      if (!ok)
        throw new EngineError(
          `rollout server ${update.origin}${update.pathname} did not load ${out}: HTTP ${response.status} ${text.slice(0, 300)}`,
          response.status >= 500 ? 'unavailable' : 'protocol',
        );
      // Older policies' folders are no longer served.
      for (const name of await readdir(weightsDir).catch(() => []))
        if (name.startsWith(`${p.policy.campaignId}-`) && join(weightsDir, name) !== out)
          await rm(join(weightsDir, name), { recursive: true, force: true });
    },
    close: async () => {},
  };
}

/** A llama-server of this worker on the policy as GGUF, converted once per checkpoint. */
function llamaCppServer(env: NodeJS.ProcessEnv, cacheDir: string): Backend {
  const ggufDir = join(cacheDir, 'gguf');
  const int = (name: string, fallback: number) => {
    const value = env[name] === undefined ? fallback : Number(env[name]);
    if (!Number.isSafeInteger(value) || value < 1)
      throw new EngineError(`${name}=${JSON.stringify(env[name])} is not an integer >= 1`, 'rejected');
    return value;
  };
  let server: LlamaCppServer | null = null;
  const log = (line: string) => console.log(`rollout: ${line}`);
  return {
    describe: () => (server ? `this worker's llama-server at ${server.url}` : "this worker's llama-server"),
    engine() {
      if (!server) throw new Error('llama-server is not started');
      return server.engine({ timeoutMs: requestTimeoutMs, maxRetries: requestRetries });
    },
    async load(p, hfDir, signal) {
      const found = await findLlamaCpp(env);
      if ('missing' in found)
        throw new EngineError(
          `${llamaCppMissingReason} on this rollout worker (bash scripts/llamacpp.sh, or MOERL_LLAMACPP_DIR): ${found.missing}`,
          'unavailable',
        );
      const gguf = join(ggufDir, `${p.policy.manifestSha256}.gguf`);
      if (!(await isFile(gguf))) {
        await mkdir(ggufDir, { recursive: true });
        const work = join(ggufDir, `${p.policy.manifestSha256}.partial`);
        await rm(work, { recursive: true, force: true });
        try {
          const started = Date.now();
          await hfDir(join(work, 'hf'));
          const exported = Date.now();
          await convertToGguf({
            llamaCppDir: found.dir,
            python: pytorchTrainer(env).python,
            hfDir: join(work, 'hf'),
            out: join(work, 'model.gguf'),
            ...(env.MOERL_LLAMACPP_PRE_TOKENIZER ? { preTokenizer: env.MOERL_LLAMACPP_PRE_TOKENIZER } : {}),
            signal,
          });
          await rename(join(work, 'model.gguf'), gguf);
          log(
            `checkpoint ${p.policy.key} as GGUF: export ${(exported - started) / 1000} s, conversion ${(Date.now() - exported) / 1000} s`,
          );
        } finally {
          await rm(work, { recursive: true, force: true });
        }
      }
      if (server) await server.loadWeights(gguf);
      else
        server = await startLlamaCppServer({
          llamaCppDir: found.dir,
          model: gguf,
          parallel: int('MOERL_LLAMACPP_PARALLEL', 4),
          contextPerSlot: int('MOERL_LLAMACPP_CONTEXT', 4096),
          threads: int('MOERL_LLAMACPP_THREADS', 1),
          onEvent: log,
        });
      // The GGUF of the checkpoint before is kept (a validation of it may still come), older ones not.
      const kept = new Set([gguf]);
      const files = await readdir(ggufDir).catch(() => []);
      const dated = await Promise.all(
        files
          .filter((f) => f.endsWith('.gguf'))
          .map(async (f) => ({ path: join(ggufDir, f), mtime: (await stat(join(ggufDir, f))).mtimeMs })),
      );
      dated.sort((a, b) => b.mtime - a.mtime);
      for (const f of dated.filter((d) => !kept.has(d.path)).slice(1)) await rm(f.path, { force: true });
    },
    async close() {
      await server?.stop();
      server = null;
    },
  };
}

async function isFile(path: string): Promise<boolean> {
  return (await stat(path).catch(() => null))?.isFile() === true;
}

async function isDir(path: string): Promise<boolean> {
  return (await stat(path).catch(() => null))?.isDirectory() === true;
}
