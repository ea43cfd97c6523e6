// Prometheus's own exposition parser and metric linter (test/support/promparse, a small Go
// program on github.com/prometheus/common/expfmt and client_golang's promlint), built once into
// the tools cache under a name derived from its source and pinned modules, so an edit rebuilds it.
// `goHelper` builds the sibling Go helpers (test/support/promql) the same way.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { repoRoot } from '../../cli/temporal-tools.js';

const run = promisify(execFile);

export interface MetricFamily {
  name: string;
  help?: string;
  type: 'COUNTER' | 'GAUGE' | 'HISTOGRAM' | 'SUMMARY' | 'UNTYPED';
  metric: {
    label?: { name: string; value: string }[];
    counter?: { value: number };
    gauge?: { value: number };
    /** protojson writes 64-bit counts as strings. */
    histogram?: {
      sampleCount: string;
      sampleSum: number;
      bucket?: { cumulativeCount: string; upperBound: number | string }[];
    };
  }[];
}

export interface Exposition {
  families: MetricFamily[];
  /** What `promtool check metrics` would report, per metric. */
  problems: { metric: string; text: string }[];
}

const built = new Map<string, Promise<string>>();

/** The binary of the Go program in test/support/<name>, built into the tools cache when missing. */
export function goHelper(name: string): Promise<string> {
  let bin = built.get(name);
  if (!bin) built.set(name, (bin = build(name)));
  return bin;
}

async function build(name: string): Promise<string> {
  const src = join(repoRoot(), 'test', 'support', name);
  const hash = createHash('sha256');
  for (const f of ['go.mod', 'go.sum', 'main.go']) hash.update(readFileSync(join(src, f)));
  const tools =
    process.env.MOERL_TOOLS_DIR ??
    join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'moerl', 'tools');
  const dir = join(tools, `${name}-${hash.digest('hex').slice(0, 12)}`);
  const bin = join(dir, name);
  if (existsSync(bin)) return bin;
  mkdirSync(dir, { recursive: true });
  // Built next to its final name and renamed: a concurrent test never runs a half-written file.
  const partial = `${bin}.${process.pid}.partial`;
  await run('go', ['build', '-p', '2', '-trimpath', '-mod=readonly', '-o', partial, '.'], {
    cwd: src,
    env: { ...process.env, GOFLAGS: '', CGO_ENABLED: '0' },
  }).catch((err: unknown) => {
    throw new Error(
      `building test/support/${name} with go failed: ${(err as { stderr?: string }).stderr ?? String(err)}`,
    );
  });
  renameSync(partial, bin);
  return bin;
}

/** Runs a helper with `input` on stdin and returns its stdout. */
export async function runHelper(name: string, input: string): Promise<string> {
  const bin = await goHelper(name);
  const child = execFile(bin, { maxBuffer: 64 << 20 });
  const out = new Promise<string>((resolve, reject) => {
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', reject);
    child.once('exit', (code) =>
      code === 0 ? resolve(stdout) : reject(new Error(`${name} exited with ${code}: ${stderr.trim()}`)),
    );
  });
  child.stdin!.end(input);
  return out;
}

/** Parses and lints a text exposition with Prometheus's own code. */
export async function parseExposition(text: string): Promise<Exposition> {
  return JSON.parse(await runHelper('promparse', text)) as Exposition;
}
