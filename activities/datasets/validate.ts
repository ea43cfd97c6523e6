// Checks a dataset before a campaign starts: every row's fields, each problem named by its row
// and field, all problems at once (the first `maxProblems`, then "and N more"), in one
// streamed pass that also yields the dataset's identity (sha256, size, rows). Memory stays
// bounded by one JSONL line or one Parquet row group, whatever the file's size, and a file past
// the dataset limits (limits.ts) is one problem, found before its rows are decoded.
import type { DatasetFormat } from '../../workflows/spec-dataset.js';
import { DatasetError, DatasetProblem, ProblemList, defaultMaxProblems } from './errors.js';
import { defaultMaxLineBytes, jsonlLines, parseJsonlLine } from './jsonl.js';
import { datasetLimitsFromEnv, overLimit, type DatasetLimits } from './limits.js';
import { openParquet, readParquetGroup, rowGroupCount } from './parquet.js';
import {
  toDatasetRow,
  topLevelColumns,
  type ChatMessage,
  type DatasetColumns,
  type DatasetRow,
} from './rows.js';
import {
  byteStream,
  describeInput,
  hashingStream,
  localCopy,
  type DatasetIdentity,
  type DatasetInput,
} from './source.js';

/** Which data sources have a reward function: the reward section's map, and whether it has a default. */
export interface RewardMapping {
  /** data_source values the map names. */
  mapped: readonly string[];
  hasDefault: boolean;
  /** The spec field of the map, named in the problem (e.g. "rewards.bySource"). */
  field: string;
}

/** A prompt's length in tokens against the room the model has for it. */
export interface PromptLimit {
  /** Tokens of a prompt as the policy sees it (the tokenizer and chat template of the model). */
  countTokens: (prompt: ChatMessage[]) => number | Promise<number>;
  maxTokens: number;
  /** Where the limit comes from, for the message (e.g. "model.contextLength 4096 − maxNewTokens 1024"). */
  why: string;
}

export interface ValidateOptions {
  format: DatasetFormat;
  columns: DatasetColumns;
  /** Where a store object is copied for reading Parquet (see localCopy). */
  cacheDir: string;
  rewards?: RewardMapping;
  promptLimit?: PromptLimit;
  /** Every row needs its reference completion here (task.dataset.responseKey: an SFT warm start). */
  responseKey?: string;
  maxProblems?: number;
  maxLineBytes?: number;
  /** What the file may cost (default: this worker's, datasetLimitsFromEnv). */
  limits?: DatasetLimits;
}

/** How a row is named in problems: its index, and for JSONL the line an editor shows. */
function rowName(format: DatasetFormat, row: number): string {
  return format === 'jsonl' ? `row ${row} (line ${row + 1})` : `row ${row}`;
}

// Rows listed per data_source without a reward, in the problem; the rest are counted.
const rowsNamedPerSource = 3;
// Distinct data sources without a reward tracked; past this many the file is surely mis-mapped.
const maxUnmappedSources = 1000;

class RowChecks {
  readonly problems: ProblemList;
  rows = 0;
  private readonly unmapped = new Map<string, { rows: number[]; count: number }>();

  constructor(private readonly opts: ValidateOptions) {
    this.problems = new ProblemList(opts.maxProblems ?? defaultMaxProblems);
  }

  async record(row: number, record: unknown): Promise<void> {
    const got = toDatasetRow(record, row, this.opts.columns, this.opts.responseKey);
    if (got.problems) {
      for (const p of got.problems) this.problems.add(`${rowName(this.opts.format, row)}: ${p}`);
      return;
    }
    await this.checkRow(got.row);
  }

  bad(row: number, problem: string): void {
    this.problems.add(`${rowName(this.opts.format, row)}: ${problem}`);
  }

  private async checkRow(r: DatasetRow): Promise<void> {
    const { rewards, promptLimit } = this.opts;
    if (rewards && !rewards.hasDefault && !rewards.mapped.includes(r.dataSource)) {
      let seen = this.unmapped.get(r.dataSource);
      if (!seen && this.unmapped.size < maxUnmappedSources)
        this.unmapped.set(r.dataSource, (seen = { rows: [], count: 0 }));
      if (seen) {
        if (seen.rows.length < rowsNamedPerSource) seen.rows.push(r.row);
        seen.count++;
      }
    }
    if (promptLimit) {
      const tokens = await promptLimit.countTokens(r.prompt);
      if (tokens > promptLimit.maxTokens)
        this.bad(
          r.row,
          `${this.opts.columns.promptKey}: ${tokens} tokens, over the ${promptLimit.maxTokens} the model has room for (${promptLimit.why})`,
        );
    }
  }

  /** The problems of data sources without a reward function, one per source. */
  finish(): void {
    const rewards = this.opts.rewards;
    if (!rewards) return;
    for (const [source, seen] of this.unmapped) {
      const named = seen.rows.map((row) => rowName(this.opts.format, row)).join(', ');
      const more = seen.count > seen.rows.length ? ` and ${seen.count - seen.rows.length} more` : '';
      this.problems.add(
        `${this.opts.columns.dataSourceKey} "${source}" (${named}${more}) has no reward function: ${rewards.field} names ${rewards.mapped.length === 0 ? 'none' : rewards.mapped.map((m) => `"${m}"`).join(', ')} and has no default`,
      );
    }
  }
}

/**
 * Validates a dataset and returns its identity; throws DatasetError with every problem found
 * (including "the file has no rows"). A file that cannot be read at all (missing, no access)
 * throws the store's or the file system's own error.
 */
export async function validateDataset(input: DatasetInput, opts: ValidateOptions): Promise<DatasetIdentity> {
  const checks = new RowChecks(opts);
  const identity =
    opts.format === 'jsonl'
      ? await validateJsonl(input, opts, checks)
      : await validateParquet(input, opts, checks);
  if (identity.rows === 0 && checks.problems.count === 0) checks.problems.add('the file has no rows');
  checks.finish();
  if (checks.problems.count > 0) throw new DatasetError(describeInput(input), checks.problems.list());
  return identity;
}

async function validateJsonl(
  input: DatasetInput,
  opts: ValidateOptions,
  checks: RowChecks,
): Promise<DatasetIdentity> {
  const maxLineBytes = opts.maxLineBytes ?? defaultMaxLineBytes;
  const limits = opts.limits ?? datasetLimitsFromEnv();
  const hasher = hashingStream();
  const stream = byteStream(input);
  const bytes = stream.pipe(hasher);
  let rows = 0;
  for await (const line of jsonlLines(bytes, maxLineBytes)) {
    if (line.row === limits.maxRows) {
      stream.destroy();
      checks.problems.add(
        `more than ${limits.maxRows} rows (line ${line.row + 1} is past them), more than a dataset may have: ${overLimit(limits, 'maxRows')}; or split the file`,
      );
      return { ...hasher.digest(), rows };
    }
    rows++;
    const parsed = parseJsonlLine(line, maxLineBytes);
    if ('problem' in parsed) checks.bad(line.row, parsed.problem);
    else await checks.record(line.row, parsed.record);
  }
  return { ...hasher.digest(), rows };
}

async function validateParquet(
  input: DatasetInput,
  opts: ValidateOptions,
  checks: RowChecks,
): Promise<DatasetIdentity> {
  const local = await localCopy(input, opts.cacheDir);
  const identity = { sha256: local.sha256, bytes: local.bytes };
  if (local.bytes === 0) return { ...identity, rows: 0 };
  let pq;
  try {
    pq = await openParquet(local.path, opts.limits ?? datasetLimitsFromEnv());
  } catch (err) {
    checks.problems.add(
      err instanceof DatasetProblem ? err.message : `not a Parquet file: ${(err as Error).message}`,
    );
    return { ...identity, rows: 0 };
  }
  // A required column the file lacks is one problem, not one per row.
  const { promptKey, dataSourceKey } = opts.columns;
  const requiredKeys = {
    promptKey,
    dataSourceKey,
    ...(opts.responseKey ? { responseKey: opts.responseKey } : {}),
  };
  const column = (path: string) => path.split('.')[0] as string;
  const wanted = [...topLevelColumns(opts.columns), ...(opts.responseKey ? [column(opts.responseKey)] : [])];
  const absent = Object.entries(requiredKeys).filter(([, path]) => !pq.columns.includes(column(path)));
  if (absent.length > 0) {
    checks.problems.add(
      `no column ${absent.map(([, path]) => `"${column(path)}"`).join(' or ')} (the file's columns: ${pq.columns.join(', ')}); map the names with task.dataset.${absent.map(([key]) => key).join(' / ')}`,
    );
    return { ...identity, rows: pq.rows };
  }
  const columns = wanted.filter((c) => pq.columns.includes(c));
  for (let g = 0; g < rowGroupCount(pq); g++) {
    let rows;
    try {
      rows = await readParquetGroup(pq, g, columns);
    } catch (err) {
      if (!(err instanceof DatasetProblem)) throw err;
      checks.problems.add(err.message);
      break;
    }
    const start = pq.groupStarts[g] as number;
    for (const [i, got] of rows.entries())
      if ('problem' in got) checks.bad(start + i, got.problem);
      else await checks.record(start + i, got.record);
  }
  return { ...identity, rows: pq.rows };
}
