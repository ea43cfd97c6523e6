// Datasets at a million rows: makes a verl-schema file in Parquet and in JSONL (once, kept in
// --dir), then, each in a fresh process so its peak RSS is its own:
//   - validates it (every row checked, sha256 of the bytes), reporting time and peak RSS;
//   - reads a shard's rows by index (--shard-rows drawn by the sampler from a mid-file
//     position), the way a rollout shard would: Parquet through the worker's row cache (the
//     first read decodes the file into it, the second reads it; the cache starts empty),
//     JSONL by one scan (with and without checking the hash);
//   - builds an in-memory line-offset index of the JSONL file, the alternative to the scan.
// Usage: node dist/bench/datasets.js [--rows 1000000] [--dir /tmp/moerl-bench-datasets]
//          [--shard-rows 256] [--heap-mib N] [--json]
// --heap-mib caps each measuring process's V8 heap (--max-old-space-size): with a cap, peak RSS
// shows the memory a pass needs rather than the headroom V8 takes before it collects.
import { execFileSync } from 'node:child_process';
import { createReadStream, existsSync, mkdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import {
  drawPrompts,
  hashDataset,
  readDatasetRows,
  validateDataset,
  verlColumns,
} from '../activities/datasets/index.js';
import { arithmeticRows, writeJsonl, writeVerlParquet } from '../test/support/dataset-fixtures.js';

const { values } = parseArgs({
  options: {
    rows: { type: 'string', default: '1000000' },
    dir: { type: 'string', default: '/tmp/moerl-bench-datasets' },
    'shard-rows': { type: 'string', default: '256' },
    'heap-mib': { type: 'string' },
    json: { type: 'boolean', default: false },
    child: { type: 'string' },
    format: { type: 'string' },
  },
});
const rows = Number(values.rows);
const dir = values.dir;
const shardRows = Number(values['shard-rows']);
const file = (format: string) => join(dir, `train-${rows}.${format}`);
const rowGroupSize = 100_000;

const peakRssMiB = () => Math.round(process.resourceUsage().maxRSS / 1024);

async function timed<T>(run: () => Promise<T>): Promise<{ seconds: number; value: T }> {
  const start = process.hrtime.bigint();
  const value = await run();
  return { seconds: Number(process.hrtime.bigint() - start) / 1e9, value };
}

/** One measurement in this process; prints one JSON line. */
async function child(kind: string, format: 'parquet' | 'jsonl'): Promise<void> {
  const input = { path: file(format) };
  const base = { format, cacheDir: join(dir, 'cache'), columns: verlColumns };
  const startRss = peakRssMiB();
  let result: Record<string, unknown>;
  if (kind === 'validate') {
    const { seconds, value } = await timed(() => validateDataset(input, base));
    result = { rows: value.rows, bytes: value.bytes, seconds };
  } else if (kind === 'read' || kind === 'read-checked') {
    const { sha256 } = kind === 'read-checked' ? await hashDataset(input) : { sha256: undefined };
    // A shard mid-campaign: epoch 3, a third into it.
    const drawn = drawPrompts(
      { seed: 1, rows },
      { epoch: 3, offset: Math.floor(rows / 3) },
      shardRows,
    ).prompts;
    const { seconds, value } = await timed(() =>
      readDatasetRows(
        input,
        drawn.map((p) => p.row),
        { ...base, ...(sha256 ? { expectedSha256: sha256 } : {}) },
      ),
    );
    result = { rows: value.length, seconds };
  } else if (kind === 'offset-index') {
    const { seconds, value } = await timed(async () => {
      const offsets: number[] = [0];
      let at = 0;
      for await (const chunk of createReadStream(input.path) as AsyncIterable<Buffer>) {
        for (let i = chunk.indexOf(0x0a); i >= 0; i = chunk.indexOf(0x0a, i + 1)) offsets.push(at + i + 1);
        at += chunk.length;
      }
      return Float64Array.from(offsets);
    });
    result = { rows: value.length - 1, indexBytes: value.byteLength, seconds };
  } else throw new Error(`unknown child ${kind}`);
  console.log(JSON.stringify({ kind, format, ...result, startRssMiB: startRss, peakRssMiB: peakRssMiB() }));
}

async function make(): Promise<void> {
  mkdirSync(dir, { recursive: true });
  if (!existsSync(file('jsonl'))) await writeJsonl(file('jsonl'), arithmeticRows(rows));
  if (!existsSync(file('parquet'))) writeVerlParquet(file('parquet'), arithmeticRows(rows), rowGroupSize);
}

if (values.child) await child(values.child, values.format as 'parquet' | 'jsonl');
else {
  const made = await timed(make);
  rmSync(join(dir, 'cache'), { recursive: true, force: true });
  const self = fileURLToPath(import.meta.url);
  const run = (kind: string, format: string) =>
    JSON.parse(
      execFileSync(
        process.execPath,
        [
          ...(values['heap-mib'] ? [`--max-old-space-size=${values['heap-mib']}`] : []),
          self,
          '--child',
          kind,
          '--format',
          format,
          '--rows',
          String(rows),
          '--dir',
          dir,
          '--shard-rows',
          String(shardRows),
        ],
        {
          encoding: 'utf8',
        },
      ).trim(),
    ) as Record<string, unknown>;
  const results: Record<string, unknown>[] = [
    ...(['parquet', 'jsonl'] as const).map((f) => ({
      ...run('validate', f),
      fileMiB: (statSync(file(f)).size / 2 ** 20).toFixed(1),
    })),
    // The first Parquet read decodes the file into the worker's row cache; the next reads it.
    { ...run('read', 'parquet'), kind: 'read (cold)' },
    { ...run('read-checked', 'parquet'), kind: 'read (warm)' },
    run('read', 'jsonl'),
    run('read-checked', 'jsonl'),
    run('offset-index', 'jsonl'),
  ];
  if (values.json) console.log(JSON.stringify({ rows, shardRows, makeSeconds: made.seconds, results }));
  else {
    console.log(
      `${rows} rows (made in ${made.seconds.toFixed(1)} s, or found in ${dir}); a shard reads ${shardRows} rows; V8 heap ${values['heap-mib'] ? `capped at ${values['heap-mib']} MiB` : 'default'}`,
    );
    for (const r of results)
      console.log(
        `${String(r.kind).padEnd(13)} ${String(r.format).padEnd(8)} ${Number(r.seconds).toFixed(2).padStart(7)} s  peak RSS ${String(r.peakRssMiB).padStart(5)} MiB (start ${r.startRssMiB})${r.fileMiB ? `  file ${r.fileMiB} MiB` : ''}`,
      );
  }
}
