// Where the rank program finds the PyTorch trainer (engines/pytorch, docs/engines.md): the Python
// interpreter is the operator's choice, MOERL_PYTORCH_PYTHON on the train worker (local ranks
// inherit it) or in the trainer image (pods), never the spec's; without it, the environment
// scripts/pyref.sh makes in the tools cache, whose pins are the engine's.
import { createHash } from 'node:crypto';
import { accessSync, constants, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const pytorchPythonEnv = 'MOERL_PYTORCH_PYTHON';

/** This checkout's engines/pytorch (an installed package needs no path). */
const engineDir = fileURLToPath(new URL('../../../engines/pytorch/', import.meta.url));

/** scripts/python-env.sh's folder for scripts/pyref/requirements.txt, or why there is none. */
function pyrefPython(env: NodeJS.ProcessEnv): { python: string } | { missing: string } {
  const requirements = fileURLToPath(new URL('../../../scripts/pyref/requirements.txt', import.meta.url));
  let digest: string;
  try {
    digest = createHash('sha256').update(readFileSync(requirements)).digest('hex').slice(0, 12);
  } catch {
    return { missing: `no ${requirements}` };
  }
  const tools =
    env.MOERL_TOOLS_DIR ??
    join(env.XDG_CACHE_HOME ?? join(env.HOME ?? homedir(), '.cache'), 'moerl', 'tools');
  return { python: join(tools, `pyref-${digest}`, 'bin', 'python') };
}

/** The trainer as a command: `python -m moerl_pytorch ARGS` with the environment it needs. */
export function pytorchTrainer(env: NodeJS.ProcessEnv): { python: string; env: Record<string, string> } {
  const found = env[pytorchPythonEnv] ? { python: env[pytorchPythonEnv] } : pyrefPython(env);
  const python = 'python' in found ? found.python : '';
  try {
    accessSync(python, constants.X_OK);
  } catch {
    throw new Error(
      `no Python for the PyTorch trainer at ${python || '(none)'}${'missing' in found ? ` (${found.missing})` : ''}: set ${pytorchPythonEnv} on the train worker (or in the trainer image) to an interpreter with engines/pytorch/requirements.txt installed, or run scripts/pyref.sh`,
    );
  }
  return {
    python,
    env: {
      PYTHONPATH: env.PYTHONPATH ? `${engineDir}:${env.PYTHONPATH}` : engineDir,
      // The trainer reads only the directories it is given; it must never reach for a model hub.
      HF_HUB_OFFLINE: '1',
      // One thread per rank unless the operator says otherwise, as the native ranks' OpenBLAS.
      OMP_NUM_THREADS: env.OMP_NUM_THREADS ?? '1',
    },
  };
}
