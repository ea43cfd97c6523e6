// The tests' OpenEnv servers: an environment of test/fixtures/openenv served by openenv's
// create_app under uvicorn, with the interpreter of scripts/openenv.sh, in a process group of its
// own on a loopback port. Tests skip (a failure with CI=true, as for the Python reference) where
// the set-up has not made the environment.
import { join } from 'node:path';
import { freePort } from '../../cli/dev-server.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import { spawnGroup, waitUntilReady, type GroupProcess } from './process-group.js';
import { pythonReferenceSkipReason, resolvePythonEnvironment } from './python-reference.js';

const found = resolvePythonEnvironment('openenv', 'MOERL_OPENENV_PYTHON');

/** For describe(..., { skip }): false when the OpenEnv environment is there. */
export const openEnvSkip =
  'missing' in found
    ? `${pythonReferenceSkipReason} (bash scripts/openenv.sh): ${found.missing}`
    : (false as const);

export interface OpenEnvServer {
  url: string;
  port: number;
  process: GroupProcess;
}

/** Serves `module:app` of test/fixtures/openenv on `port` (default: a free one) until stopped. */
export async function startOpenEnvServer(
  app: string,
  logFile: string,
  port?: number,
): Promise<OpenEnvServer> {
  if (!('python' in found)) throw new Error(String(openEnvSkip));
  const at = port ?? (await freePort());
  const dir = join(repoRoot(), 'test', 'fixtures', 'openenv');
  const args = ['-m', 'uvicorn', app, '--app-dir', dir, '--host', '127.0.0.1', '--port', String(at)];
  const proc = spawnGroup('openenv', found.python, args, logFile);
  const url = `http://127.0.0.1:${at}`;
  // Importing openenv takes seconds; a loaded machine more.
  await waitUntilReady(
    proc,
    Date.now() + 120_000,
    async () => {
      const ok = await fetch(`${url}/health`).then(
        (r) => r.ok,
        () => false,
      );
      return ok || 'not answering /health yet';
    },
    (message) => new Error(message),
  );
  return { url, port: at, process: proc };
}
