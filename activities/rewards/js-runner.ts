// One sandboxed worker process of a JavaScript reward function pool: the counterpart of
// python/reward_runner.py, with the same protocol (requests as JSON lines on stdin, answers as
// JSON lines on file descriptor 3). The module's export is called as
// compute_score(data_source, solution_str, ground_truth, extra_info) and may return a number,
// a boolean, an object with `score`, or a promise of one.
//
//   node js-runner.js MODULE_PATH [EXPORT_NAME]
import { writeSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';

type ScoreFunction = (
  dataSource: string,
  solutionStr: string,
  groundTruth: unknown,
  extraInfo: unknown,
) => unknown;

function answer(message: object): void {
  writeSync(3, `${JSON.stringify(message)}\n`);
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const where = /\((.*):(\d+):\d+\)/.exec(err.stack?.split('\n')[1] ?? '');
    return `${err.name}: ${err.message}${where ? ` (${where[1]?.split('/').pop()}:${where[2]})` : ''}`;
  }
  return `threw ${String(err)}`;
}

function asScore(result: unknown): number {
  let value = result;
  if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
    if (!('score' in value)) throw new TypeError(`returned an object without 'score'`);
    value = (value as { score: unknown }).score;
  }
  if (typeof value === 'boolean') return value ? 1 : 0;
  if (typeof value === 'number' && Number.isFinite(value)) return value;
  throw new TypeError(`returned ${typeof value} ${JSON.stringify(value)?.slice(0, 80)}, not a finite number`);
}

async function main(): Promise<void> {
  const [modulePath, exportName = 'compute_score'] = process.argv.slice(2);
  let score: ScoreFunction;
  try {
    const module = (await import(pathToFileURL(modulePath ?? '').href)) as Record<string, unknown>;
    const found = module[exportName] ?? (module.default as Record<string, unknown> | undefined)?.[exportName];
    if (typeof found !== 'function') throw new TypeError(`${modulePath} exports no function ${exportName}`);
    score = found as ScoreFunction;
  } catch (err) {
    answer({ error: `could not load the function: ${describe(err)}`, kind: 'start' });
    process.exit(1);
  }
  answer({ ready: true });
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    const request = JSON.parse(line) as Record<string, unknown>;
    let result: unknown;
    try {
      result = await score(
        request.data_source as string,
        request.solution_str as string,
        request.ground_truth,
        request.extra_info,
      );
    } catch (err) {
      answer({
        error: describe(err),
        kind:
          err instanceof RangeError && /memory|allocation failed/i.test(err.message) ? 'memory' : 'exception',
      });
      continue;
    }
    try {
      answer({ value: asScore(result) });
    } catch (err) {
      answer({ error: (err as Error).message, kind: 'bad-result' });
    }
  }
}

await main();
