// Reward functions chosen per row by `data_source`: a map from data source to a choice (a
// built-in verifier or the user's own function), with a default. One call scores one sample in
// verl's terms, score(dataSource, solutionStr, groundTruth, extraInfo); a batch call also counts
// failures by reason and names every function that failed on all of its samples, so the reward
// activity can pause the campaign with the first error.
import { BadInputError } from './errors.js';
import {
  choiceLetter,
  compileRegex,
  formatBonus,
  jsonSchemaScore,
  lastMatch,
  mathAnswer,
  matchScore,
  schemaValidator,
  truthLetter,
  type FormatReward,
} from './builtin.js';
import { ProcessPool, type FailureReason } from './process-pool.js';
import {
  defaultSandboxLimits,
  pythonDir,
  resolveRewardPython,
  sandboxCommand,
  type SandboxLimits,
} from './sandbox.js';
import {
  userFunctionName,
  userFunctionPool,
  type SandboxOptions,
  type UserFunctionSpec,
} from './user-function.js';

/** One way to score a data source; every kind may add a `format` reward. */
export type RewardChoice = (
  | { kind: 'math' }
  | { kind: 'environment' }
  | { kind: 'match'; normalise?: boolean }
  | { kind: 'choice'; letters?: string }
  | { kind: 'regex'; pattern: string; flags?: string; normalise?: boolean }
  | { kind: 'json-schema'; schema?: unknown }
  | UserFunctionSpec
) & { format?: FormatReward };

export interface RewardFunctionsSpec {
  /** Used for a data source that `bySource` does not name. */
  default?: RewardChoice;
  bySource?: Record<string, RewardChoice>;
}

export interface RewardFunctionsOptions {
  /** Limits and processes of users' functions. */
  sandbox?: SandboxOptions;
  /** Limits and processes of the math verifier's math-verify pool. */
  math?: Partial<SandboxLimits> & { processes?: number; python?: string };
}

export interface SampleFailure {
  reason: FailureReason;
  message: string;
}

/** A sample's score; a failed sample scores 0 and says why. */
export interface SampleScore {
  score: number;
  failure?: SampleFailure;
}

export interface Sample {
  dataSource: string;
  solutionStr: string;
  groundTruth: unknown;
  extraInfo?: unknown;
  /** An episode's environment reward (agents/episode.ts EpisodeRecord.environment_reward). */
  environmentReward?: number;
}

export interface BatchScores {
  /** One per sample, in order; a failed sample scores 0 and names its failure. */
  results: SampleScore[];
  failures: {
    count: number;
    byReason: Partial<Record<FailureReason, number>>;
    /** The batch's first failed sample. */
    first?: SampleFailure & { index: number; dataSource: string; function: string };
  };
  /** Functions that failed on every sample of the batch they scored: the campaign cannot go on. */
  allFailing: (SampleFailure & { function: string; samples: number })[];
  /** Samples scored and failed per function, with its first failure: batches add up by function. */
  byFunction: FunctionTally[];
}

export interface FunctionTally {
  function: string;
  samples: number;
  failed: number;
  first?: SampleFailure;
}

interface Scorer {
  name: string;
  score(sample: Sample): Promise<SampleScore> | SampleScore;
}

const letters = 'ABCDEFGHIJ';

/** The built-in math verifier's pool: math-verify's parse + verify in long-lived Python processes. */
export function mathVerifyPool(options: RewardFunctionsOptions['math'] = {}): ProcessPool {
  const limits = { ...defaultSandboxLimits, ...options };
  const program = options.python ?? resolveRewardPython();
  const args = ['-I', '-B', `${pythonDir}reward_runner.py`, '--file', `${pythonDir}math_score.py`];
  return new ProcessPool({
    name: 'math',
    size: options.processes ?? 2,
    timeoutMs: limits.timeoutMs,
    cpuSeconds: limits.cpuSeconds,
    maxOutputBytes: limits.maxOutputBytes,
    // moerl's own code on untrusted text: limits, but no need of namespaces.
    spawn: () => sandboxCommand({ program, args, limits, isolation: 'none' }),
  });
}

function poolScorer(name: string, pool: ProcessPool, answerOf?: (text: string) => string | null): Scorer {
  return {
    name,
    async score(sample) {
      const solution = answerOf ? answerOf(sample.solutionStr) : sample.solutionStr;
      // A completion without an answer is wrong, not a failure of the function.
      if (solution === null) return { score: 0 };
      const groundTruth =
        answerOf && typeof sample.groundTruth === 'string'
          ? (answerOf(sample.groundTruth) ?? sample.groundTruth)
          : sample.groundTruth;
      const result = await pool.call({
        data_source: sample.dataSource,
        solution_str: solution,
        ground_truth: groundTruth ?? null,
        extra_info: sample.extraInfo ?? null,
      });
      return result.ok
        ? { score: result.value as number }
        : { score: 0, failure: { reason: result.reason, message: result.message } };
    },
  };
}

/** The reward functions of a spec; close() ends their processes. */
export class RewardFunctions {
  private readonly scorers = new Map<string, Scorer>();
  private readonly fallback: Scorer | undefined;
  private readonly pools: ProcessPool[] = [];
  private readonly userPools = new Map<string, ProcessPool>();
  private mathPool: ProcessPool | undefined;

  constructor(
    spec: RewardFunctionsSpec,
    private readonly options: RewardFunctionsOptions = {},
  ) {
    for (const [source, choice] of Object.entries(spec.bySource ?? {})) {
      this.scorers.set(source, this.scorer(choice, `bySource.${source}`));
    }
    this.fallback = spec.default ? this.scorer(spec.default, 'default') : undefined;
  }

  /** The score of one sample; a sample whose function fails scores 0 with the failure. */
  async score(
    dataSource: string,
    solutionStr: string,
    groundTruth: unknown,
    extraInfo?: unknown,
  ): Promise<SampleScore> {
    return this.scorerFor(dataSource).score({ dataSource, solutionStr, groundTruth, extraInfo });
  }

  /** Scores a batch (concurrently, up to each pool's size) and counts its failures. */
  async scoreBatch(samples: readonly Sample[]): Promise<BatchScores> {
    const scorers = samples.map((s) => this.scorerFor(s.dataSource));
    const results = await Promise.all(samples.map((s, i) => (scorers[i] as Scorer).score(s)));
    const batch: BatchScores = {
      results,
      failures: { count: 0, byReason: {} },
      allFailing: [],
      byFunction: [],
    };
    const perFunction = new Map<string, FunctionTally>();
    results.forEach((result, i) => {
      const name = (scorers[i] as Scorer).name;
      const counts = perFunction.get(name) ?? { function: name, samples: 0, failed: 0 };
      perFunction.set(name, counts);
      counts.samples++;
      if (!result.failure) return;
      counts.failed++;
      counts.first ??= result.failure;
      batch.failures.count++;
      batch.failures.byReason[result.failure.reason] =
        (batch.failures.byReason[result.failure.reason] ?? 0) + 1;
      batch.failures.first ??= {
        ...result.failure,
        index: i,
        dataSource: (samples[i] as Sample).dataSource,
        function: name,
      };
    });
    for (const [name, counts] of perFunction) {
      batch.byFunction.push(counts);
      if (counts.first && counts.failed === counts.samples) {
        batch.allFailing.push({ function: name, samples: counts.samples, ...counts.first });
      }
    }
    return batch;
  }

  close(): void {
    for (const pool of this.pools) pool.close();
  }

  private scorerFor(dataSource: string): Scorer {
    const scorer = this.scorers.get(dataSource) ?? this.fallback;
    if (!scorer) {
      throw new BadInputError(
        `no reward function for data_source ${JSON.stringify(dataSource)}: name it in bySource or set a default`,
      );
    }
    return scorer;
  }

  private scorer(choice: RewardChoice, field: string): Scorer {
    const base = this.baseScorer(choice, field);
    const format = choice.format;
    if (!format) return base;
    if (!Number.isFinite(format.weight))
      throw new BadInputError(`${field}.format.weight must be a finite number`);
    const re = compileRegex(format.pattern, format.flags, `${field}.format.pattern`);
    return {
      name: `${base.name}+format`,
      async score(sample) {
        const result = await base.score(sample);
        // A failed sample scores 0, format or not.
        if (result.failure) return result;
        return { score: result.score + formatBonus(re, format.weight, sample.solutionStr) };
      },
    };
  }

  private baseScorer(choice: RewardChoice, field: string): Scorer {
    switch (choice.kind) {
      case 'math':
        this.mathPool ??= this.own(mathVerifyPool(this.options.math));
        return poolScorer('math', this.mathPool, mathAnswer);
      case 'environment':
        return { name: 'environment', score: (s) => ({ score: s.environmentReward ?? 0 }) };
      case 'match': {
        const normalise = choice.normalise ?? true;
        return {
          name: normalise ? 'match' : 'exact',
          score: (s) => ({ score: matchScore(s.solutionStr, s.groundTruth, normalise) }),
        };
      }
      case 'choice': {
        const set = (choice.letters ?? letters).toUpperCase();
        return {
          name: 'choice',
          score: (s) => {
            const truth = truthLetter(s.groundTruth, set);
            return { score: truth !== null && choiceLetter(s.solutionStr, set) === truth ? 1 : 0 };
          },
        };
      }
      case 'regex': {
        const re = compileRegex(choice.pattern, choice.flags, `${field}.pattern`);
        const normalise = choice.normalise ?? true;
        return {
          name: `regex:${choice.pattern}`,
          score: (s) => ({ score: matchScore(lastMatch(re, s.solutionStr), s.groundTruth, normalise) }),
        };
      }
      case 'json-schema': {
        const fixed =
          choice.schema === undefined ? undefined : schemaValidator(choice.schema, `${field}.schema`);
        return {
          name: 'json-schema',
          score: (s) => {
            if (fixed) return { score: jsonSchemaScore(s.solutionStr, fixed) };
            // Without a schema in the spec, each row's ground truth is its schema.
            try {
              return {
                score: jsonSchemaScore(s.solutionStr, schemaValidator(s.groundTruth, 'ground truth')),
              };
            } catch (err) {
              return { score: 0, failure: { reason: 'exception', message: (err as Error).message } };
            }
          },
        };
      }
      case 'python':
      case 'js': {
        // Data sources that name the same function share its pool.
        const name = userFunctionName(choice);
        let pool = this.userPools.get(name);
        if (!pool)
          this.userPools.set(name, (pool = this.own(userFunctionPool(choice, this.options.sandbox))));
        return poolScorer(name, pool);
      }
    }
  }

  private own(pool: ProcessPool): ProcessPool {
    this.pools.push(pool);
    return pool;
  }
}
