// What a dataset may cost a worker: a dataset is input from anyone who can write a file, and a
// few kilobytes of Parquet can declare millions of rows (a run-length page repeats one value any
// number of times), so the rows of a file, the rows of a row group and a row group's decoded size
// are bounded, each checked before anything is decoded, and a row's nesting is bounded for every
// reader after it (deep nesting overflows the stack of recursive code: JSON.stringify, Python's
// json). The bounds protect the worker, so they are its operator's settings, never the spec's.

/** Levels of arrays and objects in a row, at most (the row object itself is level 1). */
export const maxNestingDepth = 100;

export interface DatasetLimits {
  /** Rows in a dataset file. */
  maxRows: number;
  /** Rows in one Parquet row group (decoded whole). */
  maxRowGroupRows: number;
  /**
   * Decoded bytes of one Parquet row group, counted before decoding from its pages' headers
   * (their uncompressed bytes plus bytesPerDecodedValue a value) and after as the rows' JSON.
   */
  maxRowGroupBytes: number;
}

/**
 * What one decoded value is counted as in a row group's decoded size: about what hyparquet's
 * decoded values take in memory (55 bytes a value for verl's rows, measured).
 */
export const bytesPerDecodedValue = 64;

/** The environment variable of each limit. */
export const datasetLimitEnv: Record<keyof DatasetLimits, string> = {
  maxRows: 'MOERL_DATASET_MAX_ROWS',
  maxRowGroupRows: 'MOERL_DATASET_MAX_ROW_GROUP_ROWS',
  maxRowGroupBytes: 'MOERL_DATASET_MAX_ROW_GROUP_BYTES',
};

/**
 * The defaults: 10 M rows a file; 1,048,576 rows a row group (pyarrow's default row group);
 * 1 GiB decoded a row group (such a group of verl's rows counts about 0.8 GiB, and takes about
 * 600 MB of heap).
 */
export const defaultDatasetLimits: DatasetLimits = {
  maxRows: 10_000_000,
  maxRowGroupRows: 1024 * 1024,
  maxRowGroupBytes: 1024 ** 3,
};

/** The limits this worker's operator set (MOERL_DATASET_MAX_*, whole numbers), else the defaults. */
export function datasetLimitsFromEnv(env: NodeJS.ProcessEnv = process.env): DatasetLimits {
  const limits = { ...defaultDatasetLimits };
  for (const key of Object.keys(datasetLimitEnv) as (keyof DatasetLimits)[]) {
    const name = datasetLimitEnv[key];
    const text = env[name]?.trim();
    if (!text) continue;
    if (!/^[1-9]\d*$/.test(text) || !Number.isSafeInteger(Number(text)))
      throw new Error(`${name}=${JSON.stringify(text)} is not a positive whole number`);
    limits[key] = Number(text);
  }
  return limits;
}

/** The end of a limit's problem: the limit, and how the operator raises it. */
export function overLimit(limits: DatasetLimits, key: keyof DatasetLimits): string {
  return `the limit is ${limits[key]} (${datasetLimitEnv[key]}, the workers' setting: their operator may raise it)`;
}

/**
 * The nesting depth of a JSON-like value, counted without recursion, and stopping as soon as it
 * passes maxNestingDepth (then maxNestingDepth + 1); with it, about the value's size as JSON
 * (its strings' and keys' lengths, binary as base64, 8 a scalar or container: a cheap count,
 * not JSON.stringify).
 */
export function measureValue(value: unknown): { depth: number; bytes: number } {
  let depth = 0;
  let bytes = 0;
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, level] = stack.pop() as [unknown, number];
    if (typeof v === 'string') {
      bytes += v.length + 2;
      continue;
    }
    bytes += ArrayBuffer.isView(v) ? Math.ceil(v.byteLength / 3) * 4 : 8; // binary is base64 in JSON
    if (v === null || typeof v !== 'object' || ArrayBuffer.isView(v) || v instanceof Date) continue;
    if (level > depth) depth = level;
    if (depth > maxNestingDepth) return { depth, bytes };
    for (const [key, child] of Array.isArray(v) ? v.entries() : Object.entries(v)) {
      if (typeof key === 'string') bytes += key.length + 3;
      stack.push([child, level + 1]);
    }
  }
  return { depth, bytes };
}

/** The problem of a row nested too deep, or undefined. */
export function nestingProblem(depth: number): string | undefined {
  return depth > maxNestingDepth
    ? `nested more than ${maxNestingDepth} levels deep (arrays and objects), past the limit of ${maxNestingDepth} for a dataset row`
    : undefined;
}
