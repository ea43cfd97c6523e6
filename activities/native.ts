// Runs the native tools (moe_train, moe_generate) as subprocesses. They print one JSON object
// per stdout line and exit 0 (done), 2 (bad input: retrying cannot help) or other (retryable);
// the exit code becomes the matching Temporal failure with the tail of stderr in its message.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { ApplicationFailure } from '@temporalio/common';
import { badInputErrorType } from './types.js';

export type NativeTool = 'moe_train' | 'moe_generate' | 'moe_reward' | 'moe_hf';

/** native/build/bin of this checkout, unless MOERL_NATIVE_BIN names another directory. */
export function nativeBinDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.MOERL_NATIVE_BIN ?? fileURLToPath(new URL('../../native/build/bin/', import.meta.url));
}

export function nativeToolPath(tool: NativeTool, binDir = nativeBinDir()): string {
  const path = `${binDir.replace(/\/$/, '')}/${tool}`;
  if (!existsSync(path))
    throw ApplicationFailure.create({
      type: 'NativeToolMissing',
      nonRetryable: false,
      message: `native tool ${tool} not found at ${path}: build it with \`bash scripts/setup.sh native\` or set MOERL_NATIVE_BIN`,
    });
  return path;
}

export interface ToolRun {
  /** Exit code, or null when killed by a signal. */
  code: number | null;
  signal: NodeJS.Signals | null;
  stderrTail: string;
}

export interface RunToolOptions {
  env?: NodeJS.ProcessEnv;
  /** The process sees `env` only, not the worker's environment with `env` added. */
  replaceEnv?: boolean;
  /**
   * Called for each stdout line that parses as a JSON object; a string it returns is written to
   * the tool's stdin as a line (an answer: moe_generate --wait-stored waits for one).
   */
  onRecord?: (record: Record<string, unknown>) => void | string | Promise<void | string>;
  /** Aborting kills the process (SIGTERM, then SIGKILL after 2 s). */
  signal?: AbortSignal;
}

const stderrTailBytes = 4096;

/** Spawns a tool and resolves when it exits (any code); see toolFailure for the mapping. */
export function runTool(path: string, args: string[], opts: RunToolOptions = {}): Promise<ToolRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(path, args, {
      env: opts.replaceEnv ? opts.env : { ...process.env, ...opts.env },
      stdio: 'pipe',
    });
    // Stdin carries onRecord's answers (none: closed at once). An answer to a tool that has
    // exited is lost with it; its exit says what happened.
    child.stdin.on('error', () => undefined);
    if (!opts.onRecord) child.stdin.end();
    let stderr = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      stderr = (stderr + d).slice(-stderrTailBytes);
    });
    // Records are handled in order; a slow handler (an upload) back-pressures nothing but itself.
    let records = Promise.resolve();
    let recordError: unknown;
    createInterface({ input: child.stdout }).on('line', (line) => {
      if (!opts.onRecord || !line.startsWith('{')) return;
      let record: Record<string, unknown>;
      try {
        record = JSON.parse(line) as Record<string, unknown>;
      } catch {
        return;
      }
      records = records.then(async () => {
        if (recordError !== undefined) return;
        try {
          const answer = await opts.onRecord!(record);
          if (typeof answer === 'string') child.stdin.write(answer + '\n');
        } catch (err) {
          recordError = err;
          child.kill('SIGTERM');
        }
      });
    });
    let killTimer: NodeJS.Timeout | undefined;
    const abort = () => {
      child.kill('SIGTERM');
      killTimer = setTimeout(() => child.kill('SIGKILL'), 2000);
    };
    opts.signal?.addEventListener('abort', abort, { once: true });
    child.on('error', reject);
    child.on('close', (code, signal) => {
      opts.signal?.removeEventListener('abort', abort);
      clearTimeout(killTimer);
      void records.then(() =>
        recordError !== undefined
          ? reject(recordError)
          : resolve({ code, signal, stderrTail: stderr.trim() }),
      );
    });
  });
}

/** The Temporal failure for a tool that did not exit 0 (exit 2 is bad input: not retried). */
export function toolFailure(what: string, run: ToolRun): ApplicationFailure {
  const how = run.code === null ? `was killed by ${run.signal}` : `exited with code ${run.code}`;
  const tail = run.stderrTail ? `: ${run.stderrTail.split('\n').slice(-5).join(' | ')}` : '';
  return run.code === 2
    ? ApplicationFailure.create({
        type: badInputErrorType,
        nonRetryable: true,
        message: `${what} ${how}${tail}`,
      })
    : ApplicationFailure.create({ type: 'NativeToolFailed', message: `${what} ${how}${tail}` });
}
