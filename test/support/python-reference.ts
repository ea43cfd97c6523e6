// The Python reference environment (scripts/pyref.sh: torch, transformers, tokenizers,
// safetensors) for tests that compare moerl with the Python libraries: found where pyref.sh
// puts it, never installed from a test, with a skip reason when the set-up has not made it.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { accessSync, constants, existsSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { repoRoot } from '../../cli/temporal-tools.js';

/** How a skip for a missing Python reference starts; scripts/test.sh matches these exact words. */
export const pythonReferenceSkipReason = 'python reference not installed';

/**
 * The interpreter scripts/<name>.sh prints (a pinned environment of scripts/python-env.sh), or
 * why there is none (without installing anything); `override` names the variable that chooses one.
 */
export function resolvePythonEnvironment(
  name: string,
  override: string,
): { python: string } | { missing: string } {
  const chosen = process.env[override];
  if (chosen) {
    try {
      accessSync(chosen, constants.X_OK);
      return { python: chosen };
    } catch {
      return { missing: `${override}=${chosen} is not executable` };
    }
  }
  // python-env.sh names the environment by the digest of its requirements and marks it complete last.
  const requirements = join(repoRoot(), 'scripts', name, 'requirements.txt');
  if (!existsSync(requirements)) return { missing: `no ${requirements}` };
  const digest = createHash('sha256').update(readFileSync(requirements)).digest('hex').slice(0, 12);
  const tools =
    process.env.MOERL_TOOLS_DIR ??
    join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'moerl', 'tools');
  const dir = join(tools, `${name}-${digest}`);
  if (!existsSync(join(dir, '.complete'))) return { missing: `no ${dir}` };
  return { python: join(dir, 'bin', 'python') };
}

export function pythonReference() {
  const found = resolvePythonEnvironment('pyref', 'MOERL_PYREF_PYTHON');
  const python = 'python' in found ? found.python : '';
  return {
    /** The interpreter ('' when missing): for tools run with it that are not reference scripts. */
    python,
    /**
     * For describe(..., { skip }): false when the environment is there. scripts/test.sh finds
     * this reason by its first words and, with CI=true, counts the skip as a failure.
     */
    skip:
      'missing' in found
        ? `${pythonReferenceSkipReason} (bash scripts/pyref.sh): ${found.missing}`
        : (false as const),
    /** Runs test/reference/<script> with args and returns what it printed. */
    async run(script: string, args: string[]): Promise<string> {
      const path = join(repoRoot(), 'test', 'reference', script);
      const { stdout } = await promisify(execFile)(python, [path, ...args], {
        maxBuffer: 1 << 28,
        // The reference scripts work offline and must never reach for a model hub.
        env: { ...process.env, HF_HUB_OFFLINE: '1', TOKENIZERS_PARALLELISM: 'false' },
      });
      return stdout;
    },
  };
}
