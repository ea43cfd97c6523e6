// The PyTorch trainer rank (engines/pytorch) for tests: run by the interpreter of the Python
// reference environment (scripts/pyref.sh pins the torch and transformers the engine pins, and a
// test of the engine checks that the pins agree), found as the reference tests find it and never
// installed from a test: with the environment missing, `skip` says why.
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../../cli/temporal-tools.js';
import { pythonReference } from './python-reference.js';

export interface EngineRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** What engines/pytorch/tests/compare.py prints. */
export interface ModelComparison {
  tensors: number;
  missing: string[];
  max_rel_l2: number;
  worst: string;
  max_update_rel_l2?: number;
  worst_update?: string;
  changed?: number;
}

export function pytorchEngine() {
  const pyref = pythonReference();
  const engineDir = join(repoRoot(), 'engines', 'pytorch');
  // With the environment complete (skip false), pyref.sh only prints its interpreter's path.
  const python = pyref.skip
    ? ''
    : execFileSync('bash', [join(repoRoot(), 'scripts', 'pyref.sh')], { encoding: 'utf8' }).trim();

  function run(args: string[], env: Record<string, string> = {}): Promise<EngineRun> {
    return new Promise((resolve, reject) => {
      const child = spawn(python, args, {
        cwd: engineDir,
        env: {
          ...process.env,
          PYTHONPATH: engineDir,
          HF_HUB_OFFLINE: '1',
          TOKENIZERS_PARALLELISM: 'false',
          OMP_NUM_THREADS: '1', // small and polite to the rest of the machine
          ...env,
        },
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      child.on('error', reject);
      child.on('exit', (code) => resolve({ code, stdout, stderr }));
    });
  }

  return {
    /** For describe(..., { skip }). */
    skip: pyref.skip,
    /** The reference scripts of test/reference (hf_models.py makes the tiny models). */
    pyref,
    /** `python -m moerl_pytorch args` as one process (one rank unless env says otherwise). */
    train: (args: string[], env: Record<string, string> = {}) => run(['-m', 'moerl_pytorch', ...args], env),
    /**
     * The same on `ranks` local processes under the rank contract, as the local launcher starts
     * them (rank 0 serves the store on a port the kernel picks and publishes it); every rank's run.
     */
    async trainOnRanks(args: string[], ranks: number): Promise<EngineRun[]> {
      const dir = mkdtempSync(join(tmpdir(), 'moerl-pytorch-ranks-'));
      try {
        return await Promise.all(
          Array.from({ length: ranks }, (_, rank) =>
            run(['-m', 'moerl_pytorch', ...args], {
              MOERL_RANK: String(rank),
              MOERL_WORLD_SIZE: String(ranks),
              MOERL_COORDINATOR: '127.0.0.1:0',
              MOERL_COORDINATOR_PORT_FILE: join(dir, 'store.port'),
              MOERL_STARTUP_TIMEOUT_S: '120',
            }),
          ),
        );
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    /**
     * tests/grad.py: per line of `cases` ({out, flags}), the gradients of one step's loss on
     * `batch`, saved as a model in `out`; one {loss} per case, in order.
     */
    async gradients(dir: string, batch: string, cases: string): Promise<{ loss: number }[]> {
      const r = await run([join('tests', 'grad.py'), dir, batch, cases]);
      if (r.code !== 0) throw new Error(`grad.py exited ${r.code}: ${r.stderr}`);
      return r.stdout
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { loss: number });
    },
    /** The engine's own unit tests (engines/pytorch/tests). */
    unitTests: () => run(['-m', 'unittest', 'discover', '-s', 'tests']),
    /** Two HF directories tensor by tensor, and their updates from `before` when given. */
    async compare(a: string, b: string, before?: string): Promise<ModelComparison> {
      const r = await run([join('tests', 'compare.py'), a, b, ...(before ? ['--before', before] : [])]);
      if (r.code !== 0) throw new Error(`compare.py ${a} ${b} exited ${r.code}: ${r.stderr}`);
      return JSON.parse(r.stdout) as ModelComparison;
    },
  };
}
