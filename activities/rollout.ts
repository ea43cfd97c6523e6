// The rollout activities: one shard of an iteration's prompts (or of a checkpoint's validation
// set), sampled from the policy checkpoint by the spec's rollout engine (rollout-generators.ts:
// native moe_generate or an OpenAI-compatible server), stored chunk by chunk under
// deterministic keys. A retry (after a Spot reclaim, a crash, a deploy) resumes from the chunks
// already in the store — each one checked, not trusted — so at most the chunk that was in flight
// is generated again.
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ApplicationFailure, Context } from '@temporalio/activity';
import { heartbeatUntilStopped } from './heartbeat.js';
import * as keys from './layout.js';
import { campaignTokenizer } from './models/source.js';
import type { HfTokenizer } from './models/tokenizer.js';
import { answerTokens, type EpisodeRecord } from './agents/episode.js';
import { datasetInput, iterationRows, promptLines, validationRows } from './prompts.js';
import { ShardEnvironments } from './agents/environments.js';
import { addEpisodeStats, emptyEpisodeStats } from './agents/episode-stats.js';
import { BadInputError } from './rewards/errors.js';
import { parseRolloutLine, type ParseOptions } from './rewards/rollout-record.js';
import { rolloutRanksEnv } from './rollout-capacity.js';
import { nativeChunks, openAiChunks } from './rollout-generators.js';
import type { ActivityDeps } from './deps.js';
import type { ObjectStore } from './store/types.js';
import { iterationPromptsOf } from './types.js';
import type {
  CheckpointRef,
  RolloutHeartbeat,
  RolloutShardInput,
  RolloutShardOutput,
  ValidationShardInput,
} from './types.js';
import type { CampaignSpec } from '../workflows/spec.js';
import { rolloutEngine } from '../workflows/spec-engine.js';

/**
 * What one shard generates and where it keeps it: a training iteration's prompts or a checkpoint's
 * validation prompts. Everything else — resuming from stored chunks, heartbeats, rank slots,
 * interruptions — is one code path for both (generateShard).
 */
export interface ShardPlan {
  campaignId: string;
  spec: CampaignSpec;
  /** "rollout of iteration 3 shard 1": how messages name the shard. */
  what: string;
  /** moe_generate's --iteration, which every record carries (a validation: the checkpoint's). */
  iteration: number;
  shard: number;
  policy: CheckpointRef;
  /** Global id of the shard's first prompt; its prompts' ids are consecutive. */
  firstPromptId: number;
  promptCount: number;
  samples: number;
  sampling: { temperature: number; topP: number; maxNewTokens: number };
  chunkKey(chunk: number): string;
  /** Writes the prompts file of a dataset shard into `dir` and returns moe_generate's prompt flags. */
  prompts(
    dir: string,
    tokenizer: HfTokenizer | null,
    environments: ShardEnvironments | null,
  ): Promise<string[]>;
  /** Labels the shard's temporary folder (unique per campaign and attempt). */
  label: string;
}

/** Global id of the shard's first prompt: iterations take consecutive blocks of prompts. */
export function firstPromptId(input: RolloutShardInput): number {
  return iterationPromptsOf(input).first + input.promptStart;
}

/** A stored chunk is whole when it has every sample of its prompts, each line valid. */
async function storedChunkIsWhole(
  store: ObjectStore,
  plan: ShardPlan,
  chunk: number,
  parse: ParseOptions,
): Promise<boolean> {
  const key = plan.chunkKey(chunk);
  if ((await store.head(key)) === null) return false;
  const { chunkSize } = plan.spec;
  const first = plan.firstPromptId + chunk * chunkSize;
  const prompts = Math.min(chunkSize, plan.promptCount - chunk * chunkSize);
  const lines = (await store.get(key)).toString('utf8').split('\n').filter(Boolean);
  if (lines.length !== prompts * plan.samples) return false;
  try {
    return lines.every((line, i) => {
      const r = parseRolloutLine(line, { source: key, line: i + 1 }, parse);
      return r.prompt_id >= first && r.prompt_id < first + prompts && r.iteration === plan.iteration;
    });
  } catch {
    return false;
  }
}

/** moe_generate's flags that make it read a prompts file written at `path` (ids from its lines). */
function promptsFileFlags(path: string, tokenizer: HfTokenizer): string[] {
  // --first-prompt indexes the file's lines; the ids come from the lines.
  // prettier-ignore
  return [
    '--task', 'dataset',
    '--prompts', path,
    '--first-prompt', '0',
    '--eos-ids', tokenizer.eosTokenIds.join(','),
  ];
}

/**
 * The shard's dataset rows as moe_generate's --prompts file (prompt ids global, as the built-in
 * tasks'), rendered with the model's chat template, and the flags that make it read them.
 */
async function writeDatasetPrompts(
  deps: ActivityDeps,
  input: RolloutShardInput,
  tokenizer: HfTokenizer | null,
  environments: ShardEnvironments | null,
  path: string,
): Promise<string[]> {
  if (!input.dataset || !tokenizer)
    throw new BadInputError(
      `rollout of iteration ${input.iteration} shard ${input.shard}: a dataset task's shard needs the dataset's identity and position from the workflow`,
    );
  const rows = await iterationRows(
    input.spec,
    input.dataset,
    input,
    datasetInput(input.spec, 'train', deps.openStore),
    deps.cacheDir,
  );
  await writeFile(path, await promptLines(firstPromptId(input), rows, tokenizer, environments));
  return promptsFileFlags(path, tokenizer);
}

/**
 * Fills each record's text: moe_generate leaves it empty for a model's own tokenizer, whose
 * decoding lives on this side. Special tokens (the stop id) are left out, as verl's reward input.
 * An episode's text is its last policy turn's: the answer a reward function reads.
 */
async function decodeCompletions(file: string, tokenizer: HfTokenizer): Promise<void> {
  const lines = (await readFile(file, 'utf8')).split('\n').filter(Boolean);
  const out = lines.map((line) => {
    const record = JSON.parse(line) as { tokens: number[]; text: string; episode?: EpisodeRecord };
    record.text = tokenizer.decode(answerTokens(record), { skipSpecialTokens: true });
    return JSON.stringify(record);
  });
  await writeFile(file, out.map((l) => l + '\n').join(''));
}

export async function rolloutShard(
  deps: ActivityDeps,
  input: RolloutShardInput,
): Promise<RolloutShardOutput> {
  const { spec, iteration, shard } = input;
  const hp = input.hyperparameters;
  const task = spec.task;
  return generateShard(deps, {
    campaignId: input.campaignId,
    spec,
    what: `rollout of iteration ${iteration} shard ${shard}`,
    iteration,
    shard,
    policy: input.policy,
    firstPromptId: firstPromptId(input),
    promptCount: input.promptCount,
    samples: spec.groupSize,
    sampling: { temperature: hp.temperature, topP: hp.topP, maxNewTokens: hp.maxNewTokens },
    chunkKey: (chunk) => keys.rolloutChunkKey(input.campaignId, iteration, shard, chunk),
    // prettier-ignore
    prompts: (dir, tokenizer, environments) => 'builtin' in task
      ? Promise.resolve(['--task', task.builtin, '--split', 'train', '--first-prompt', String(firstPromptId(input))])
      : writeDatasetPrompts(deps, input, tokenizer, environments, join(dir, 'prompts.jsonl')),
    label: `${iteration}-${shard}`,
  });
}

/**
 * One shard of a checkpoint's validation: rows [promptStart, promptStart + promptCount) of the
 * validation file, their row numbers as prompt ids, sampled with the validation's own settings.
 */
export async function validationShard(
  deps: ActivityDeps,
  input: ValidationShardInput,
): Promise<RolloutShardOutput> {
  const { spec, validation, shard } = input;
  const iteration = input.policy.iteration;
  const what = `validation of checkpoint ${iteration} shard ${shard}`;
  return generateShard(deps, {
    campaignId: input.campaignId,
    spec,
    what,
    iteration,
    shard,
    policy: input.policy,
    firstPromptId: input.promptStart,
    promptCount: input.promptCount,
    samples: validation.samples,
    sampling: {
      temperature: validation.temperature,
      topP: validation.topP,
      maxNewTokens: validation.maxNewTokens ?? spec.hyperparameters.maxNewTokens,
    },
    chunkKey: (chunk) => keys.validationChunkKey(input.campaignId, iteration, shard, chunk),
    prompts: async (dir, tokenizer, environments) => {
      if (!tokenizer) throw new BadInputError(`${what}: validation needs a dataset task`);
      const rows = await validationRows(deps, input, input);
      const path = join(dir, 'prompts.jsonl');
      await writeFile(path, await promptLines(input.promptStart, rows, tokenizer, environments));
      return promptsFileFlags(path, tokenizer);
    },
    label: `v${iteration}-${shard}`,
  });
}

async function generateShard(deps: ActivityDeps, plan: ShardPlan): Promise<RolloutShardOutput> {
  const ctx = Context.current();
  const { spec } = plan;
  const store = deps.openStore(spec.store);
  const total = Math.ceil(plan.promptCount / spec.chunkSize);
  const previous = (ctx.info.heartbeatDetails as Partial<RolloutHeartbeat> | undefined) ?? null;
  // An earlier attempt that ended on this very worker process was not lost with its machine: it
  // failed or timed out while the worker lived. A few of those in a row will not pass by
  // retrying (a chunk too slow for the heartbeat, a tool that keeps crashing): stop and say so.
  const failuresOnLiveWorker =
    previous?.worker === deps.workerId ? (previous.failuresOnLiveWorker ?? 0) + 1 : 0;
  const maxFailures = spec.orchestration.rolloutMaxFailuresOnLiveWorker;
  if (failuresOnLiveWorker >= maxFailures)
    throw ApplicationFailure.create({
      type: 'RolloutFailingOnLiveWorker',
      nonRetryable: true,
      message: `${plan.what} failed ${failuresOnLiveWorker} attempts in a row on worker ${deps.workerId}, which stayed alive (attempt ${ctx.info.attempt}); a heartbeat timeout this often means a chunk takes longer than the worker can report (orchestration.rolloutHeartbeatSeconds ${spec.orchestration.rolloutHeartbeatSeconds} s, chunkSize ${spec.chunkSize}); look at the worker's log, then resume`,
    });

  // Specs of campaigns started before the field existed lack it: one rank, as then. A shard sent
  // to a server holds one slot: the server's threads are its own.
  const worldSize =
    rolloutEngine(spec) === 'openai' ? 1 : ((spec as Partial<CampaignSpec>).rolloutEpWorldSize ?? 1);
  const capacity = deps.rolloutRanks.capacity;
  // Retrying elsewhere may find a larger worker, but a fleet is sized as a whole: say so now
  // rather than let the shard bounce until it lands on one.
  if (worldSize > capacity)
    throw ApplicationFailure.create({
      type: 'RolloutRanksExceedCapacity',
      nonRetryable: true,
      message: `${plan.what} needs rolloutEpWorldSize ${worldSize} moe_generate ranks at once, but rollout worker ${deps.workerId} runs at most ${capacity} (${rolloutRanksEnv} or --rollout-ranks; default the CPUs it may use); give rollout workers at least ${worldSize} CPUs and ${rolloutRanksEnv}=${worldSize} (k8s/README.md, "Sizing rollout pods") or lower rolloutEpWorldSize, then resume`,
    });

  const progress: RolloutHeartbeat = {
    what: plan.what,
    chunks: total,
    chunksStored: 0,
    chunksRedone: previous?.chunksRedone ?? 0,
    worker: deps.workerId,
    failuresOnLiveWorker,
    // Earlier attempts' episodes, as far as their last heartbeat had them.
    ...(previous?.episodes ? { episodes: previous.episodes } : {}),
  };
  let tokens = 0;
  let seconds = 0;
  // From here on every step may outlast the heartbeat timeout (checking thousands of stored
  // chunks, fetching the checkpoint, generating one chunk, uploading it): beat on a timer.
  const stopBeats = heartbeatUntilStopped(() => progress);
  try {
    // A dataset's prompts are chat messages in the model's own template and tokens; a built-in
    // task's are made by moe_generate with its own tokenizer.
    const tokenizer =
      'dataset' in spec.task ? await campaignTokenizer(store, plan.campaignId, deps.cacheDir) : null;
    const parse = tokenizer ? { eosIds: tokenizer.eosTokenIds } : {};
    while (
      progress.chunksStored < total &&
      (await storedChunkIsWhole(store, plan, progress.chunksStored, parse))
    )
      progress.chunksStored++;
    const stored = progress.chunksStored;
    // Work lost by earlier attempts: the generator runs without pause, so an attempt that died
    // before finishing had the first chunk missing from the store in flight (heartbeats are
    // throttled, so their details may lag behind the store); plus any chunk they reported stored
    // that is not (whole) in the store now.
    const startedBefore = new Set<number>();
    if (previous !== null && stored < total) startedBefore.add(stored);
    for (let k = stored; k < (previous?.chunksStored ?? 0); k++) startedBefore.add(k);
    if (stored < total) {
      // A shutdown or a cancel stops the shard from here on, the checkpoint's download (minutes)
      // included: one that came before the listeners is seen as already aborted.
      const stop = new AbortController();
      const onShutdown = () => stop.abort();
      deps.shutdown.addEventListener('abort', onShutdown, { once: true });
      ctx.cancellationSignal.addEventListener('abort', onShutdown, { once: true });
      if (deps.shutdown.aborted || ctx.cancellationSignal.aborted) stop.abort();
      const outDir = join(deps.cacheDir, 'rollouts', `${plan.campaignId}-${plan.label}-${ctx.info.attempt}`);
      // An agentic campaign's tools, opened as its rows need them: its prompts and episodes see one list.
      const environments = spec.agent ? new ShardEnvironments(spec.agent) : null;
      try {
        await rm(outDir, { recursive: true, force: true });
        await mkdir(outDir, { recursive: true });
        const generate = rolloutEngine(spec) === 'openai' ? openAiChunks : nativeChunks;
        await generate(deps, plan, {
          prompts: await plan.prompts(outDir, tokenizer, environments),
          environments,
          attempt: ctx.info.attempt,
          tokenizer,
          outDir,
          startChunk: stored,
          worldSize,
          signal: stop.signal,
          onProgress: (inChunk) => (progress.inChunk = inChunk),
          onChunk: async (k, chunk) => {
            const file = join(outDir, `chunk-${k}.jsonl`);
            if (tokenizer) await decodeCompletions(file, tokenizer);
            await store.putFile(plan.chunkKey(k), file);
            if (startedBefore.has(k)) progress.chunksRedone++;
            tokens += chunk.newTokens;
            seconds += chunk.seconds;
            if (chunk.episodes)
              progress.episodes = addEpisodeStats(progress.episodes ?? emptyEpisodeStats(), chunk.episodes);
            progress.chunksStored = k + 1;
            delete progress.inChunk;
          },
        });
        if (stop.signal.aborted) {
          const why = deps.shutdown.aborted ? 'the worker is shutting down' : 'the activity was cancelled';
          throw ApplicationFailure.create({
            type: 'RolloutInterrupted',
            message: `${plan.what} stopped at chunk ${progress.chunksStored}/${total}: ${why}`,
          });
        }
      } finally {
        deps.shutdown.removeEventListener('abort', onShutdown);
        ctx.cancellationSignal.removeEventListener('abort', onShutdown);
        await environments?.close();
        await rm(outDir, { recursive: true, force: true });
      }
    }
  } finally {
    // The last details go with the attempt's outcome: the next attempt starts from them.
    ctx.heartbeat(progress);
    stopBeats();
  }
  if (progress.chunksStored !== total)
    throw ApplicationFailure.create({
      type: 'RolloutIncomplete',
      message: `${plan.what}'s generator returned after ${progress.chunksStored} of ${total} chunks`,
    });
  const samples = plan.promptCount * plan.samples;
  return {
    shard: plan.shard,
    chunks: total,
    samples,
    tokens,
    tokensPerSecond: seconds > 0 ? tokens / seconds : 0,
    chunksRedone: progress.chunksRedone,
    ...(progress.episodes ? { episodes: progress.episodes } : {}),
    attempt: ctx.info.attempt,
  };
}
