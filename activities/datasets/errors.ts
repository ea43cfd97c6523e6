// Errors of the dataset layer. A bad dataset is bad input (retrying cannot fix it), so the
// errors carry the type the campaign workflow treats as non-retryable, as the reward stage's do.
import { badInputErrorType } from '../types.js';

/** Problems reported at most, by default; the rest are counted ("and N more"). */
export const defaultMaxProblems = 20;

/** A dataset that cannot be used: every problem found, each naming the row and the field. */
export class DatasetError extends Error {
  readonly type: string = badInputErrorType;
  readonly nonRetryable: boolean = true;
  override name = 'DatasetError';

  constructor(
    readonly source: string,
    readonly problems: readonly string[],
  ) {
    super(`dataset ${source} is invalid:\n  - ${problems.join('\n  - ')}`);
  }
}

/** The dataset's bytes are not the ones the campaign started with (its content hash differs). */
export class DatasetChangedError extends Error {
  readonly type: string = badInputErrorType;
  readonly nonRetryable: boolean = true;
  override name = 'DatasetChangedError';

  constructor(
    readonly source: string,
    readonly expectedSha256: string,
    readonly actualSha256: string,
  ) {
    super(
      `dataset ${source} changed under the campaign: its sha256 is ${actualSha256}, the campaign started with ${expectedSha256}; put the original file back, or fork the campaign onto the new one`,
    );
  }
}

/** Collects problems, keeping the first `max` and counting the rest. */
export class ProblemList {
  private readonly kept: string[] = [];
  private dropped = 0;

  constructor(private readonly max = defaultMaxProblems) {}

  add(problem: string): void {
    if (this.kept.length < this.max) this.kept.push(problem);
    else this.dropped++;
  }

  get count(): number {
    return this.kept.length + this.dropped;
  }

  /** The kept problems, plus "and N more problems" when some were dropped. */
  list(): string[] {
    return this.dropped > 0
      ? [...this.kept, `and ${this.dropped} more problem${this.dropped === 1 ? '' : 's'}`]
      : [...this.kept];
  }
}

/**
 * What is wrong with a dataset file, found where its name is not known (a Parquet file's
 * footer, a row group): the caller names the dataset (DatasetError).
 */
export class DatasetProblem extends Error {
  override name = 'DatasetProblem';
}
