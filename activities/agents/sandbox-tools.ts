// The sandboxed tools environment of agentic rollouts: Python tool functions run in the reward
// sandbox (activities/rewards/sandbox.ts: a bubblewrap jail with no network, rlimits, a cgroup
// per process) in a pool of long-lived processes (activities/rewards/process-pool.ts), each a
// python/tool_runner.py that forks a fresh child per call, so no call (and no episode) sees what
// an earlier one did. Tool code is the model's or a campaign author's, so it runs under the same
// limits and refusal rules as a user's reward function.
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { rewardSandboxFromEnv } from '../reward.js';
import { ProcessPool, type FailureReason } from '../rewards/process-pool.js';
import {
  pythonDir,
  interpreterPaths,
  requireSandbox,
  resolveRewardPython,
  sandboxCommand,
  sandboxLimits,
  type Isolation,
  type SandboxLimits,
} from '../rewards/sandbox.js';
import type { ToolRunner } from './episode.js';
import type { ToolSchema } from './tool-calls.js';

/** Folder of the Python files beside this module's source (activities/agents/python). */
export const toolsPythonDir = fileURLToPath(new URL('../../../activities/agents/python/', import.meta.url));

/** The shipped tools' file: calculator and python (a code interpreter cell). */
export const builtinToolsFile = `${toolsPythonDir}builtin_tools.py`;

/** The shipped tools as a chat template and ToolCallParser take them. */
export const builtinToolSchemas: readonly ToolSchema[] = Object.freeze([
  {
    type: 'function',
    function: {
      name: 'calculator',
      description:
        'Evaluates an arithmetic expression exactly as Python does: integers and decimals, ' +
        '+ - * / // % ** and parentheses (no names or functions). Returns the value.',
      parameters: {
        type: 'object',
        properties: {
          expression: { type: 'string', description: 'The expression, e.g. "(17 + 4) * 3 ** 2 / 7"' },
        },
        required: ['expression'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'python',
      description:
        'Runs Python 3 code like a notebook cell, in a fresh interpreter without network access; ' +
        'nothing (variables, files, imports) is kept between calls. Returns what the code printed ' +
        'and the value of its last line if that is an expression.',
      parameters: {
        type: 'object',
        properties: { code: { type: 'string', description: 'The Python code to run' } },
        required: ['code'],
        additionalProperties: false,
      },
    },
  },
] satisfies ToolSchema[]);

export interface SandboxToolsOptions extends Partial<SandboxLimits> {
  /**
   * A Python file of tool functions and the schemas of those the model is given (each schema's
   * name is a function of the file); default: the builtin tools.
   */
  tools?: { file: string; tools: readonly ToolSchema[] };
  /** Worker processes at most (default 2); one call at a time each. */
  processes?: number;
  /** The Python interpreter (default: resolveRewardPython()). */
  python?: string;
  /**
   * "namespaces" (the default) refuses to start where the jail cannot be made; "none" runs
   * without it, on purpose (sandbox.ts for what still holds). Default: MOERL_REWARD_ISOLATION.
   */
  isolation?: Isolation;
  /** Characters of a result the model is shown; the rest is cut, saying so (default 16000). */
  maxResultChars?: number;
  /** Where MOERL_REWARD_ISOLATION is read (default process.env). */
  env?: NodeJS.ProcessEnv;
}

export interface SandboxToolRunner extends ToolRunner {
  /** A sandboxed tool answers text alone. */
  call(name: string, args: Record<string, unknown>, signal: AbortSignal, key?: string): Promise<string>;
  /** The schemas of the tools it runs: what the chat template and the parser are given. */
  readonly tools: readonly ToolSchema[];
  /** Processes started so far, replacements of dead or killed ones included. */
  readonly processesStarted: number;
  /** Kills every process; calls after fail. */
  close(): void;
}

/** A tool call that failed in the sandbox, with the pool's reason (process-pool.ts). */
export class SandboxToolError extends Error {
  override name = 'SandboxToolError';
  constructor(
    message: string,
    readonly reason: FailureReason,
  ) {
    super(message);
  }
}

/**
 * The ToolRunner of a pool of sandboxed tool_runner.py processes. A call resolves with the
 * tool's text and rejects with a SandboxToolError (the tool raised, broke a limit, or died). An
 * aborted signal stops the wait at once; the call itself goes on in its process until it ends
 * or meets the pool's time limit (`timeoutMs`), so keep that near the episode's toolCallMs.
 */
export function sandboxToolRunner(options: SandboxToolsOptions = {}): SandboxToolRunner {
  const file = resolve(options.tools?.file ?? builtinToolsFile);
  const tools = options.tools?.tools ?? builtinToolSchemas;
  const name = `tools:${file}`;
  const isolation = options.isolation ?? rewardSandboxFromEnv(options.env).isolation ?? 'namespaces';
  if (isolation === 'namespaces') requireSandbox(name, 'tool');
  const limits = sandboxLimits(options);
  const maxResultChars = options.maxResultChars ?? 16_000;
  const python = options.python ?? resolveRewardPython();
  // -I: no user site-packages, no PYTHON* variables, no script folder on sys.path; -B: no .pyc
  // files written beside the tools' code.
  const args = [
    '-I',
    '-B',
    `${toolsPythonDir}tool_runner.py`,
    '--file',
    file,
    '--max-result-chars',
    String(maxResultChars),
    ...tools.flatMap((t) => ['--tool', t.function.name]),
  ];
  // The runner's folder and the reward runner's, whose pipes module it shares.
  const readOnly = [dirname(file), toolsPythonDir, pythonDir, ...interpreterPaths(python)];
  const pool = new ProcessPool({
    name,
    size: options.processes ?? 2,
    timeoutMs: limits.timeoutMs,
    cpuSeconds: limits.cpuSeconds,
    maxOutputBytes: limits.maxOutputBytes,
    // A result's JSON line: a character is at most 12 when escaped (a surrogate pair's \uXXXX
    // twice), and the error messages and framing fit in the rest.
    maxAnswerBytes: 12 * maxResultChars + 64 * 1024,
    spawn: () => sandboxCommand({ program: python, args, limits, isolation, readOnly }),
  });

  return {
    tools,
    get processesStarted() {
      return pool.started;
    },
    close: () => pool.close(),
    // A call runs in a fresh fork in a jail without network: nothing it does outlives it.
    idempotent: () => true,
    call(toolName, toolArgs, signal) {
      if (signal.aborted) return Promise.reject(signal.reason as Error);
      return new Promise<string>((resolveCall, rejectCall) => {
        const onAbort = () => rejectCall(signal.reason as Error);
        signal.addEventListener('abort', onAbort, { once: true });
        void pool.call({ name: toolName, arguments: toolArgs }).then((result) => {
          signal.removeEventListener('abort', onAbort);
          if (!result.ok) rejectCall(new SandboxToolError(result.message, result.reason));
          else if (typeof result.value === 'string') resolveCall(result.value);
          else rejectCall(new SandboxToolError(`${name}: answered a result that is not text`, 'bad-result'));
        });
      });
    },
  };
}
