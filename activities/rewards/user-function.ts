// A user's own reward function, in verl's signature
// compute_score(data_source, solution_str, ground_truth, extra_info), run in a pool of
// sandboxed processes (sandbox.ts for what the sandbox holds, process-pool.ts for the limits).
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ProcessPool } from './process-pool.js';
import {
  interpreterPaths,
  requireSandbox,
  pythonDir,
  resolveRewardPython,
  sandboxCommand,
  sandboxLimits,
  type Isolation,
  type SandboxLimits,
} from './sandbox.js';

/**
 * Where the function is: a Python `module` ("pkg.rewards:compute_score", found on `path`), a
 * Python `file` with `function` in it, or a JavaScript module `file` exporting `function`.
 * `function` defaults to compute_score.
 */
export type UserFunctionSpec =
  | { kind: 'python'; module: string; path?: string[] }
  | { kind: 'python'; file: string; function?: string }
  | { kind: 'js'; file: string; function?: string };

export interface SandboxOptions extends Partial<SandboxLimits> {
  /** Worker processes at most (default 2). */
  processes?: number;
  /** The Python interpreter (default: resolveRewardPython()). */
  python?: string;
  /**
   * "namespaces" (the default) refuses to start where network, PID and mount namespaces are
   * not available; "none" runs without them (see sandbox.ts for what still holds).
   */
  isolation?: Isolation;
}

/** JavaScript's engine reserves about 1 GiB of address space before any heap: its floor. */
const jsMinimumMemoryBytes = 2 * 1024 ** 3;
const jsRunner = fileURLToPath(new URL('./js-runner.js', import.meta.url));

/** How the function is named in messages and counts, e.g. "python:my_rewards:compute_score". */
export function userFunctionName(spec: UserFunctionSpec): string {
  if (spec.kind === 'python' && 'module' in spec) return `python:${spec.module}`;
  return `${spec.kind}:${spec.file}:${spec.function ?? 'compute_score'}`;
}

/** The sandboxed pool of `spec`; a request is {data_source, solution_str, ground_truth, extra_info}. */
export function userFunctionPool(spec: UserFunctionSpec, options: SandboxOptions = {}): ProcessPool {
  // The process runs in a scratch folder: relative paths are the worker's, made absolute here.
  if ('file' in spec) spec = { ...spec, file: resolve(spec.file) };
  else spec = { ...spec, path: (spec.path ?? []).map((p) => resolve(p)) };
  const limits = sandboxLimits(options);
  const isolation = options.isolation ?? 'namespaces';
  if (isolation === 'namespaces') requireSandbox(`reward function ${userFunctionName(spec)}`, 'reward');
  let program: string;
  let args: string[];
  // What the jail sees: the interpreter, the runner and the function's own folders.
  const readOnly = 'file' in spec ? [dirname(spec.file)] : [...(spec.path ?? [])];
  let memoryBytes = limits.memoryBytes;
  if (spec.kind === 'python') {
    program = options.python ?? resolveRewardPython();
    const runner = [`${pythonDir}reward_runner.py`];
    args =
      'module' in spec
        ? [...runner, '--module', spec.module, ...(spec.path ?? []).flatMap((p) => ['--path', p])]
        : [...runner, '--file', spec.file, '--function', spec.function ?? 'compute_score'];
    // -I: no user site-packages, no PYTHON* variables, no script folder on sys.path; -B: no .pyc
    // files written beside the user's code.
    args.unshift('-I', '-B');
    readOnly.push(...interpreterPaths(program), pythonDir);
  } else {
    memoryBytes = Math.max(memoryBytes, jsMinimumMemoryBytes);
    program = process.execPath;
    const heapMiB = Math.floor((memoryBytes - 1024 ** 3) / 1024 ** 2);
    args = [`--max-old-space-size=${heapMiB}`, jsRunner, spec.file, spec.function ?? 'compute_score'];
    readOnly.push(...interpreterPaths(program), dirname(jsRunner));
  }
  return new ProcessPool({
    name: userFunctionName(spec),
    size: options.processes ?? 2,
    timeoutMs: limits.timeoutMs,
    cpuSeconds: limits.cpuSeconds,
    maxOutputBytes: limits.maxOutputBytes,
    spawn: () => sandboxCommand({ program, args, limits: { ...limits, memoryBytes }, isolation, readOnly }),
  });
}
