// What generates a rollout shard's chunks (rollout.ts's generateShard keeps everything else:
// resuming from stored chunks, heartbeats, storing each chunk, interruptions): native
// moe_generate ranks on the policy checkpoint, or an OpenAI-compatible server
// (engines/rollout-server.ts) sent each chunk's prompts as completions. Both write
// `outDir/chunk-<k>.jsonl` in the rollout record format (docs/formats.md) and report each chunk
// when it is whole, in order from `startChunk`.
import { createHash } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/activity';
import { acquireCheckpoint } from './checkpoints.js';
import { parseManifest } from './checkpoints/manifest.js';
import { manifestName } from './layout.js';
import { EngineError } from './engines/errors.js';
import { needsRescoring, startRescorer } from './engines/rescore.js';
import type { Rescorer } from './engines/rescore.js';
import type { Completion, RolloutEngine } from './engines/types.js';
import { nativeToolPath } from './native.js';
import { runGenerateRanks } from './rollout-ranks.js';
import type { ShardPlan } from './rollout.js';
import type { ShardEnvironments } from './agents/environments.js';
import { ChunkJournal } from './agents/journal.js';
import { describeEpisodes, episodeStats } from './agents/episode-stats.js';
import { ShardEpisodes, type EpisodeSample } from './agents/shard-episodes.js';
import type { HfTokenizer } from './models/tokenizer.js';
import { BadInputError } from './rewards/errors.js';
import type { ObjectStore } from './store/types.js';
import type { CheckpointRef, EpisodeStats, RolloutHeartbeat } from './types.js';
import type { ActivityDeps } from './deps.js';
import { agentEnvironment } from '../workflows/spec-agent.js';

export interface ChunkRun {
  /** moe_generate's prompt flags from the plan (a dataset shard's: its --prompts file). */
  prompts: string[];
  /** A dataset task's model tokenizer (null for a built-in task). */
  tokenizer: HfTokenizer | null;
  /** An agentic campaign's tools (null without `agent`). */
  environments: ShardEnvironments | null;
  outDir: string;
  startChunk: number;
  /** The activity's attempt: names what this attempt journals. */
  attempt: number;
  /** Rank slots the shard holds on this worker while it generates. */
  worldSize: number;
  /** Aborted by a shutdown or a cancel: the generator returns early, the caller reports it. */
  signal: AbortSignal;
  /** Within the chunk being generated: steps done of all, new tokens so far. */
  onProgress(inChunk: NonNullable<RolloutHeartbeat['inChunk']>): void;
  /** Chunk `k` is whole in outDir/chunk-<k>.jsonl; `episodes`: what its episodes did. */
  onChunk(k: number, done: { newTokens: number; seconds: number; episodes?: EpisodeStats }): Promise<void>;
}

export type ChunkGenerator = (deps: ActivityDeps, plan: ShardPlan, run: ChunkRun) => Promise<void>;

/** The shard's chunks from moe_generate ranks on the checkpoint (fetched into the worker's cache). */
export const nativeChunks: ChunkGenerator = async (deps, plan, run) => {
  const store = deps.openStore(plan.spec.store);
  const policy = await acquireCheckpoint(store, plan.policy, deps.checkpoints, {
    signal: run.signal,
  }).catch((err: unknown) => {
    if (!run.signal.aborted) throw err;
    return null;
  });
  if (policy === null) return;
  let releaseRanks: (() => void) | null = null;
  try {
    // The shard's ranks take their CPUs of the worker; a shard waits (beating) while other
    // shards hold them, and is released from the wait by the same shutdown or cancellation.
    releaseRanks = await deps.rolloutRanks.acquire(run.worldSize, run.signal);
    if (releaseRanks === null) return;
    // prettier-ignore
    await runGenerateRanks(
      nativeToolPath('moe_generate', deps.binDir),
      [
        '--checkpoint', policy.dir,
        ...run.prompts,
        '--out-dir', run.outDir,
        '--seed', String(plan.spec.seed),
        '--iteration', String(plan.iteration),
        '--num-prompts', String(plan.promptCount),
        '--samples', String(plan.samples),
        '--chunk-size', String(plan.spec.chunkSize),
        '--start-chunk', String(run.startChunk),
        '--temperature', String(plan.sampling.temperature),
        '--top-p', String(plan.sampling.topP),
        '--max-new-tokens', String(plan.sampling.maxNewTokens),
        // No chunk is started before the last is in the store: a lost worker loses only the
        // chunk in flight, not every chunk generated ahead of slow uploads.
        '--wait-stored',
      ],
      {
        worldSize: run.worldSize,
        what: `moe_generate (${plan.what})`,
        // One thread per rank, as each holds one CPU slot (why not more: rollout-capacity.ts).
        env: { OPENBLAS_NUM_THREADS: '1' },
        signal: run.signal,
        onRecord: async (rec) => {
          if (typeof rec.chunk !== 'number') return;
          const n = (f: string) => Number(rec[f] ?? 0);
          if (rec.progress === true)
            run.onProgress({ chunk: rec.chunk, step: n('step'), steps: n('steps'), tokens: n('tokens') });
          else if (rec.done === true) {
            await run.onChunk(rec.chunk, { newTokens: n('new_tokens'), seconds: n('seconds') });
            return 'stored'; // --wait-stored: the ranks go on to the next chunk
          }
        },
      },
    );
  } finally {
    releaseRanks?.();
    policy.release();
  }
};

/**
 * A sample's seed for the server: the same for the same campaign seed, iteration, prompt and
 * sample, so a chunk done again asks for the same samples. 31 bits: llama.cpp reads an int32.
 */
export function completionSeed(seed: number, iteration: number, promptId: number, sample: number): number {
  const digest = createHash('sha256')
    .update(JSON.stringify([seed, iteration, promptId, sample]))
    .digest();
  return digest.readUInt32BE(0) & 0x7fffffff;
}

/** A dataset prompt line (prompts.ts promptLine): the id, the rendered token ids, the row's source. */
interface PromptLine {
  prompt_id: number;
  prompt: string;
  prompt_tokens: number[];
  data_source: string;
}

/** A sample as the server gave it: one completion, or an episode (agents/shard-episodes.ts). */
type Sampled = Completion & { loss_mask?: number[]; episode?: EpisodeSample['episode'] };

/** The policy's context: its checkpoint's max_seq_len (an episode's prompt and completion fit it). */
async function policyContextLength(store: ObjectStore, policy: CheckpointRef): Promise<number> {
  const key = `${policy.key}/${manifestName}`;
  const manifest = parseManifest((await store.get(key)).toString('utf8'), key);
  const length = (manifest.config as { max_seq_len?: unknown } | undefined)?.max_seq_len;
  if (!Number.isSafeInteger(length) || (length as number) < 2)
    throw new BadInputError(
      `${key}: config.max_seq_len must be an integer of at least 2, got ${String(length)}`,
    );
  return length as number;
}

/**
 * The shard's chunks from the worker's OpenAI-compatible server: each chunk's prompts x samples
 * sent at once as completions (the server batches them), each with its own seed, the sampled
 * tokens' log-probs asked for; the records written once the whole chunk has answered. A server
 * that breaks the contract (not JSON, no log-probs) fails the shard for good, naming the server
 * and what is wrong; one that is down is waited for (the supervisor restarts a llama-server that
 * died) and the chunk's unanswered requests retried. At a temperature other than 1 the server's
 * log-probs (temperature 1) are rescored at the sampling temperature by the native core on the
 * worker's cached copy of the policy (engines/rescore.ts) before the chunk is written: the
 * records' `logprobs` are those, `engine_logprobs` the server's. A rescoring cut off is done
 * again with its chunk.
 */
export const openAiChunks: ChunkGenerator = async (deps, plan, run) => {
  const host = deps.rolloutServer;
  if (!host)
    throw ApplicationFailure.create({
      type: 'RolloutEngineMissing',
      nonRetryable: true,
      message: `${plan.what}: the campaign samples with engine.rollout openai, but rollout worker ${deps.workerId} has no rollout server (docs/engines.md, "Where the rollout server comes from")`,
    });
  const i = run.prompts.indexOf('--prompts');
  if (i < 0)
    throw ApplicationFailure.create({
      type: 'BadInput',
      nonRetryable: true,
      message: `${plan.what}: engine.rollout openai samples a dataset's prompts, not a built-in task's`,
    });
  const lines = (await readFile(run.prompts[i + 1]!, 'utf8'))
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as PromptLine);
  const { chunkSize } = plan.spec;
  const chunks = Math.ceil(plan.promptCount / chunkSize);
  const store = deps.openStore(plan.spec.store);
  const { temperature } = plan.sampling;
  const rescore = needsRescoring(temperature);
  // The policy the rescoring reads: the worker's cached checkpoint, as moe_generate's.
  const policy = rescore
    ? await acquireCheckpoint(store, plan.policy, deps.checkpoints, { signal: run.signal }).catch(
        (err: unknown) => {
          if (!run.signal.aborted) throw err;
          return null;
        },
      )
    : null;
  if (rescore && policy === null) return;
  // An agentic campaign samples the rows of its environments' data sources as episodes.
  const agent = plan.spec.agent;
  const contextLength = agent ? await policyContextLength(store, plan.policy) : 0;
  let releaseRanks: (() => void) | null = null;
  let scorer = null as Rescorer | null;
  let episodes = null as ShardEpisodes | null;
  try {
    releaseRanks = await deps.rolloutRanks.acquire(run.worldSize, run.signal);
    if (releaseRanks === null) return;
    await host.withPolicy({ store, policy: plan.policy }, run.signal, async (engine) => {
      if (agent && run.tokenizer && run.environments)
        episodes = new ShardEpisodes(
          {
            agent,
            engine,
            tokenizer: run.tokenizer,
            sampling: { temperature, topP: plan.sampling.topP },
            contextLength,
            maxNewTokens: plan.sampling.maxNewTokens,
          },
          run.environments,
        );
      // One scorer for the shard's chunks: the policy loaded once, one forward pass per chunk.
      if (policy)
        scorer = startRescorer({
          moeHf: nativeToolPath('moe_hf', deps.binDir),
          checkpointDir: policy.dir,
          temperature,
          workDir: run.outDir,
          what: plan.what,
          signal: run.signal,
        });
      for (let k = run.startChunk; k < chunks && !run.signal.aborted; k++) {
        const started = Date.now();
        // A chunk of episodes is journaled turn by turn; one redone reads back what was journaled.
        const journal = episodes ? await ChunkJournal.open(store, plan.chunkKey(k), run.attempt) : null;
        if (journal && journal.stats.replayed + journal.stats.unreadable.length > 0)
          console.log(
            `rollout: ${plan.what} chunk ${k}: ${journal.stats.replayed} journaled entries read back` +
              journal.stats.unreadable.map((u) => `; not read from ${u}`).join(''),
          );
        const prompts = lines.slice(k * chunkSize, (k + 1) * chunkSize);
        const samples = prompts.flatMap((p) => Array.from({ length: plan.samples }, (_, s) => ({ p, s })));
        let done = 0;
        let newTokens = 0;
        // The furthest policy turn any of the chunk's episodes has begun (0: none is an episode).
        let turn = 0;
        const onTurn = (t: number) => {
          if (t + 1 <= turn) return;
          turn = t + 1;
          run.onProgress({ chunk: k, step: done, steps: samples.length, tokens: newTokens, turn });
        };
        const answers = await Promise.all(
          samples.map(async ({ p, s }): Promise<Sampled> => {
            const seed = completionSeed(plan.spec.seed, plan.iteration, p.prompt_id, s);
            const c =
              episodes && journal && agentEnvironment(agent, p.data_source)
                ? await episodes.sample(p.prompt_tokens, p.data_source, seed, run.signal, {
                    journal: journal.episode(p.prompt_id, s),
                    id: `${plan.chunkKey(k)}#${p.prompt_id}/${s}`,
                    onTurn,
                  })
                : await complete(engine, plan, p, seed, run.signal);
            done++;
            newTokens += c.tokens.length;
            run.onProgress({
              chunk: k,
              step: done,
              steps: samples.length,
              tokens: newTokens,
              ...(turn > 0 ? { turn } : {}),
            });
            return c;
          }),
        ).catch((err: unknown) => {
          if (run.signal.aborted) return null;
          throw err;
        });
        if (answers === null) return;
        const generated = Date.now();
        const episodeRecords = answers.flatMap((a) => (a.episode ? [a.episode] : []));
        const stats = episodeRecords.length > 0 ? episodeStats(episodeRecords) : undefined;
        if (stats) console.log(`rollout: ${plan.what} chunk ${k}: ${describeEpisodes(stats)}`);
        let logprobs = answers.map((a) => a.logprobs);
        if (scorer) {
          const what = `${plan.what} chunk ${k}`;
          const rescored = await scorer.score(
            samples.map(({ p }, j) => ({ promptTokens: p.prompt_tokens, tokens: answers[j]!.tokens })),
            what,
          );
          if (rescored === null) return;
          // An environment's ids keep log-prob 0: the policy did not sample them.
          logprobs = rescored.map((lps, j) => {
            const mask = answers[j]!.loss_mask;
            return mask ? lps.map((lp, i) => (mask[i] ? lp : 0)) : lps;
          });
          console.log(
            `rollout: ${what}: ${samples.length} completions, ${newTokens} tokens generated in ${(generated - started) / 1000} s, rescored at temperature ${temperature} in ${(Date.now() - generated) / 1000} s`,
          );
        }
        const records = samples.map(({ p, s }, j) => ({
          prompt_id: p.prompt_id,
          sample_index: s,
          iteration: plan.iteration,
          task: 'dataset',
          prompt: p.prompt,
          prompt_tokens: p.prompt_tokens,
          tokens: answers[j]!.tokens,
          text: '',
          logprobs: logprobs[j]!,
          ...(scorer ? { engine_logprobs: answers[j]!.logprobs } : {}),
          finish_reason: answers[j]!.finishReason,
          ...(answers[j]!.episode ? { loss_mask: answers[j]!.loss_mask, episode: answers[j]!.episode } : {}),
        }));
        await writeFile(
          join(run.outDir, `chunk-${k}.jsonl`),
          records.map((r) => JSON.stringify(r) + '\n').join(''),
        );
        await run.onChunk(k, {
          newTokens,
          seconds: (Date.now() - started) / 1000,
          ...(stats ? { episodes: stats } : {}),
        });
        await journal?.remove();
      }
    });
  } catch (err) {
    if (err instanceof EngineError)
      throw ApplicationFailure.create({
        type: err.type,
        nonRetryable: err.nonRetryable,
        message: `${plan.what} on ${host.describe()}: ${err.message}`,
      });
    throw err;
  } finally {
    await scorer?.close();
    releaseRanks?.();
    policy?.release();
  }
};

async function complete(
  engine: RolloutEngine,
  plan: ShardPlan,
  p: PromptLine,
  seed: number,
  signal: AbortSignal,
): Promise<Completion> {
  return engine.complete(
    {
      promptTokens: p.prompt_tokens,
      maxTokens: plan.sampling.maxNewTokens,
      temperature: plan.sampling.temperature,
      topP: plan.sampling.topP,
      seed,
    },
    signal,
  );
}
