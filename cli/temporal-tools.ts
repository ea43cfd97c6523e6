// Resolves the external server binaries (Temporal CLI and server, versitygw) from TypeScript.
// scripts/tools.sh is the one source of truth for where a binary comes from (override
// variable, PATH, tools cache, build from pinned Go modules); this module only runs it.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, isAbsolute, join } from 'node:path';
import { fileURLToPath } from 'node:url';

// temporal-server, its SQL tool and its schemas (a folder): the tests' Temporal cluster.
export type ToolName =
  'temporal' | 'versitygw' | 'temporal-server' | 'temporal-sql-tool' | 'temporal-server-schema';

/** Raised when a tool cannot be resolved; `message` is one line, `details` the script's output. */
export class ToolResolutionError extends Error {
  override readonly name = 'ToolResolutionError';
  constructor(
    readonly tool: ToolName,
    message: string,
    readonly details: string,
  ) {
    super(message);
  }
}

export interface ResolveToolOptions {
  /** Environment for the resolution (override variables, PATH, cache dir); default process.env. */
  env?: NodeJS.ProcessEnv;
  /** Forward the script's step lines ("tools.sh: building …") to this process's stderr. */
  showProgress?: boolean;
}

/**
 * The repository root: the nearest folder above this module holding scripts/tools.sh. Works
 * both for the compiled module (dist/cli/) and for the source run directly (cli/).
 */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(new URL(import.meta.url)));
  for (;;) {
    if (existsSync(join(dir, 'scripts', 'tools.sh')) && existsSync(join(dir, 'package.json'))) return dir;
    const parent = dirname(dir);
    if (parent === dir)
      throw new Error('cannot find the moerl repository root (scripts/tools.sh) above ' + dir);
    dir = parent;
  }
}

const resolved = new Map<string, Promise<string>>();

/**
 * Absolute path of a usable `name` binary; builds it into the tools cache on first use.
 * Results are remembered per process for the default environment.
 */
export function resolveTool(name: ToolName, opts: ResolveToolOptions = {}): Promise<string> {
  if (opts.env) return runToolsScript(name, opts);
  let pending = resolved.get(name);
  if (!pending) {
    pending = runToolsScript(name, opts);
    resolved.set(name, pending);
    pending.catch(() => resolved.delete(name));
  }
  return pending;
}

function runToolsScript(name: ToolName, opts: ResolveToolOptions): Promise<string> {
  const script = join(repoRoot(), 'scripts', 'tools.sh');
  return new Promise((resolvePath, reject) => {
    const child = spawn('bash', [script, name], {
      env: opts.env ?? process.env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
      if (opts.showProgress) {
        for (const line of chunk.split('\n'))
          if (line.startsWith('tools.sh:')) process.stderr.write(line + '\n');
      }
    });
    child.on('error', (err) =>
      reject(new ToolResolutionError(name, `cannot run scripts/tools.sh for ${name}: ${err.message}`, '')),
    );
    child.on('close', (code) => {
      const path = stdout.trim();
      if (code === 0 && isAbsolute(path)) return resolvePath(path);
      reject(new ToolResolutionError(name, summarize(name, stderr, code), stderr));
    });
  });
}

// The script's own message (lines after "tools.sh: "), folded into one line.
function summarize(name: ToolName, stderr: string, code: number | null): string {
  const lines = stderr.split('\n');
  let start = lines.length - 1;
  while (start >= 0 && !lines[start]?.startsWith('tools.sh: ')) start--;
  const message =
    start >= 0
      ? lines
          .slice(start)
          .map((line) => line.replace(/^tools\.sh: /, '').trim())
          .filter(Boolean)
          .join(' ')
      : `scripts/tools.sh exited with ${code ?? 'a signal'}`;
  return `cannot resolve ${name}: ${message}`;
}
