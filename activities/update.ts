// Training activities: the policy update of an iteration (GRPO) and the campaign's first policy
// (init + SFT warm start, or a forked checkpoint). Training runs as a job of the rank program on
// every EP rank through the Launcher; each rank fetches its own inputs from the store and stages
// its own outputs there, so these activities only describe the job, submit it, follow it and
// collect what rank 0 reports. The checkpoint activity commits the staged checkpoint.
import { createHash } from 'node:crypto';
import { isAbsolute, resolve } from 'node:path';
import { ApplicationFailure, Context } from '@temporalio/activity';
import {
  committedCheckpoint,
  huggingFaceFiles,
  stageCopiedCheckpoint,
  stagedCheckpointFromManifest,
} from './checkpoints.js';
import { heartbeatUntilStopped } from './heartbeat.js';
import { hfModelLocation } from './models/source.js';
import * as keys from './layout.js';
import type { ActivityDeps } from './deps.js';
import type { FabricProvider, JobStatus, RankJob, TrainJob } from './launch/types.js';
import { StoreNotFoundError } from './store/errors.js';
import type { ObjectStore } from './store/types.js';
import { badInputErrorType } from './types.js';
import { sftWarmStart, type CampaignSpec } from '../workflows/spec.js';
import { algorithmFlags } from '../workflows/spec-algorithm.js';
import { trainerEngine } from '../workflows/spec-engine.js';
import { isHfModel } from '../workflows/spec-model.js';
import type { HfModelSpec } from '../workflows/spec-model.js';
import type {
  CheckpointRef,
  PrepareInput,
  PrepareOutput,
  StagedCheckpoint,
  StoreLocation,
  TrainJobTimes,
  UpdateInput,
  UpdateOutput,
} from './types.js';

const logUploadEveryMs = 10_000;

/**
 * The job name of this activity: the same on every retry of the same scheduled activity, so a
 * retry on any worker adopts the job; a stage re-run after `resume` gets a new one. At most 52
 * characters, so `<name>-<rank>` is a valid pod hostname (63) for thousands of ranks.
 */
function jobName(campaignId: string, kind: string, iteration: number): string {
  const info = Context.current().info;
  const group = createHash('sha256')
    .update(`${info.workflowExecution?.workflowId}/${info.workflowExecution?.runId}/${info.activityId}`)
    .digest('hex')
    .slice(0, 8);
  const base = campaignId
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, '-')
    .replace(/^-+/, '')
    .slice(0, 32)
    .replace(/-+$/, '');
  return `${base || 'c'}-${kind}${iteration}-${group}`;
}

/** Ranks on one machine use shared memory; pods talk over the network (EFA when they have it). */
function providerFor(spec: CampaignSpec): FabricProvider {
  if (spec.launcher.kind === 'local') return 'shm';
  return spec.launcher.efaPerRank > 0 ? 'efa' : 'tcp';
}

/** Ranks resolve nothing against the worker's working directory. */
function absoluteStore(location: StoreLocation): StoreLocation {
  return location.kind === 'fs' && !isAbsolute(location.path)
    ? { ...location, path: resolve(location.path) }
    : location;
}

interface TrainJobRequest {
  name: string;
  campaignId: string;
  iteration: number;
  spec: CampaignSpec;
  job: RankJob;
  what: string;
}

/**
 * Submits (or adopts) the job, heartbeats its state for as long as it runs, keeps its rank logs
 * in the store, and maps its failure. A worker that shuts down leaves the job running: the
 * retry, on another worker, adopts it. A job waiting for its cluster queue heartbeats `queued`
 * with its wait so far, for as long as it waits; the result says its wait and run time apart.
 */
async function runTrainJob(
  deps: ActivityDeps,
  store: ObjectStore,
  req: TrainJobRequest,
): Promise<TrainJobTimes> {
  const ctx = Context.current();
  let launched: TrainJob | null = null;
  const stopBeats = heartbeatUntilStopped(() => {
    if (!launched) return { job: req.name, state: 'submitting' };
    const s = launched.status();
    return {
      job: s.name,
      state: s.state,
      adopted: launched.adopted,
      ranks: s.ranks.map((r) => r.state),
      ...(s.restarts ? { restarts: s.restarts } : {}),
      ...times(s),
    };
  });
  // A cancel may come while the job is being launched (a Job created, or a failed one deleted
  // first, during an API outage: minutes): the launch is told to give up, and a job it returns
  // all the same is killed at once.
  const cancelled = ctx.cancellationSignal;
  const interrupted = new AbortController();
  let killing: Promise<void> | null = null;
  const kill = (job: TrainJob) =>
    (killing ??= job
      .kill()
      .catch(() => undefined)
      .finally(() => interrupted.abort()));
  const onCancel = () => void (launched && kill(launched));
  const onShutdown = () => interrupted.abort();
  cancelled.addEventListener('abort', onCancel, { once: true });
  deps.shutdown.addEventListener('abort', onShutdown, { once: true });
  try {
    const launching = deps.launcherFor(req.spec.launcher).launch(
      {
        name: req.name,
        worldSize: req.spec.epWorldSize,
        job: req.job,
        env: {},
        provider: providerFor(req.spec),
        owner: { campaignId: req.campaignId, iteration: req.iteration, attempt: ctx.info.attempt },
        maxRunSeconds: maxRunSeconds(req.spec),
      },
      cancelled,
    );
    const job = await launching.catch((err: unknown) => {
      throw cancelled.aborted ? (cancelled.reason ?? new Error('cancelled')) : err;
    });
    launched = job;
    if (cancelled.aborted) void kill(job);
    const uploadLogs = async () => {
      for (let rank = 0; rank < req.spec.epWorldSize; rank++) {
        const log = await job.readLog(rank).catch(() => null);
        if (log) await store.put(keys.rankLogKey(req.campaignId, req.iteration, ctx.info.attempt, rank), log);
      }
    };
    // Rank logs go to the store while the job runs (a long update can be followed there) and
    // once more, whole, when it ends.
    let uploading: Promise<void> | null = null;
    const tick = setInterval(() => {
      if (uploading === null)
        uploading = uploadLogs()
          .catch(() => undefined)
          .finally(() => (uploading = null));
    }, logUploadEveryMs);
    let status: JobStatus | null;
    try {
      status = await Promise.race([
        job.wait(),
        new Promise<null>((resolve) => {
          if (interrupted.signal.aborted || deps.shutdown.aborted) resolve(null);
          interrupted.signal.addEventListener('abort', () => resolve(null));
        }),
      ]);
    } finally {
      clearInterval(tick);
    }
    await uploading;
    await uploadLogs().catch(() => undefined);
    if (cancelled.aborted) {
      await killing;
      await job.cleanUp();
      throw cancelled.reason ?? new Error('cancelled');
    }
    if (status === null)
      throw ApplicationFailure.create({
        type: 'WorkerShuttingDown',
        message: `${req.what}: the worker is shutting down; job ${req.name} keeps running and the retry adopts it`,
      });
    if (status.state !== 'succeeded') {
      await job.cleanUp();
      throw jobFailure(req, status);
    }
    await job.cleanUp();
    return times(status);
  } finally {
    cancelled.removeEventListener('abort', onCancel);
    deps.shutdown.removeEventListener('abort', onShutdown);
    stopBeats();
  }
}

/** Every attempt of a training activity at its longest (all of them may adopt the one job). */
function maxRunSeconds(spec: CampaignSpec): number {
  const o = spec.orchestration;
  return o.stageTimeoutMinutes * 60 * o.updateMaxAttempts;
}

function times(status: JobStatus): TrainJobTimes {
  return {
    ...(status.restarts ? { gangRestarts: status.restarts } : {}),
    ...(status.queueWaitSeconds !== undefined ? { queueWaitSeconds: status.queueWaitSeconds } : {}),
    ...(status.runSeconds !== undefined ? { runSeconds: status.runSeconds } : {}),
  };
}

function jobFailure(req: TrainJobRequest, status: JobStatus): ApplicationFailure {
  const f = status.failure;
  const how = !f
    ? 'failed'
    : f.exitCode !== null
      ? `exited with code ${f.exitCode}`
      : f.signal
        ? `was killed by ${f.signal}`
        : 'failed';
  const who =
    f?.rank === null || f?.rank === undefined ? 'the job' : `rank ${f.rank} of ${req.spec.epWorldSize}`;
  const tail = f?.logTail ? `: ${f.logTail.split('\n').slice(-4).join(' | ')}` : '';
  const message = `${req.what}: ${who} ${how}${tail} (job ${req.name}, logs under ${keys.campaignPrefix(req.campaignId)}/logs/)`;
  return f?.permanent
    ? ApplicationFailure.create({ type: badInputErrorType, nonRetryable: true, message })
    : ApplicationFailure.create({ type: 'TrainerRankFailed', message });
}

/** What rank 0 reported: the checkpoint's manifest, and the per-step metrics (stored whole). */
async function collectJobOutputs(
  store: ObjectStore,
  req: { campaignId: string; iteration: number; prefix: string },
): Promise<{ staged: StagedCheckpoint; metrics: Record<string, number> }> {
  const manifestKey = `${req.prefix}/out/${keys.manifestName}`;
  const text = await store.get(manifestKey).catch((err: unknown) => {
    if (!(err instanceof StoreNotFoundError)) throw err;
    throw ApplicationFailure.create({
      type: 'TrainerOutputMissing',
      message: `the training job succeeded but rank 0 staged no ${manifestKey}`,
    });
  });
  const staged = stagedCheckpointFromManifest(req.campaignId, req.iteration, text.toString('utf8'));
  const metricsText = await store
    .get(`${req.prefix}/metrics/metrics.jsonl`)
    .then((b) => b.toString('utf8'))
    .catch(() => '');
  const steps = metricsText
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  await store.put(
    keys.metricsKey(req.campaignId, req.iteration),
    JSON.stringify({ iteration: req.iteration, steps }),
    {
      contentType: 'application/json',
    },
  );
  const last = steps.at(-1) ?? {};
  // The mismatch figures are the first step's: the one step trained at the weights the rollouts
  // were sampled with (later steps' trainer log-probs include the policy's own drift).
  const first = steps[0] ?? {};
  const figures = { ...last, mismatch_kl: first.mismatch_kl, tis_clip_frac: first.tis_clip_frac };
  const metrics = Object.fromEntries(
    Object.entries(figures).filter(([, v]) => typeof v === 'number'),
  ) as Record<string, number>;
  return { staged, metrics };
}

/** Outputs every training job stages: checkpoint files under the checkpoint's key; the manifest
 * (the commit writes the real one) and the metrics where the activity reads them. */
function trainOutputs(campaignId: string, iteration: number, prefix: string): RankJob['outputs'] {
  return [
    { dir: 'out', prefix: keys.checkpointKey(campaignId, iteration), exclude: [keys.manifestName] },
    { dir: 'out', prefix: `${prefix}/out`, only: [keys.manifestName] },
    { dir: 'metrics', prefix: `${prefix}/metrics` },
  ];
}

/** moe_train init --from-hf's flags for the spec's model: the same for every import of a campaign. */
const importArgs = (m: HfModelSpec) =>
  m.contextLength === undefined ? [] : ['--max-seq-len', String(m.contextLength)];

/**
 * A PyTorch trainer's job: the Hugging Face directory `{work}/<dir>` joins checkpoint `iteration`
 * beside the moerl checkpoint imported from it (docs/engines.md, "Checkpoints of the PyTorch
 * trainer"), so native rollouts, exports and forks read it as any other.
 */
function huggingFaceCheckpoint(
  spec: CampaignSpec,
  campaignId: string,
  iteration: number,
  dir: string,
  prefix: string,
) {
  if (!isHfModel(spec.model)) throw new Error('the PyTorch trainer trains a Hugging Face model only');
  return {
    hfCheckpoint: { dir, initArgs: importArgs(spec.model) },
    outputs: [
      ...trainOutputs(campaignId, iteration, prefix),
      { dir, prefix: keys.checkpointKey(campaignId, iteration), rank: 0 },
    ],
  };
}

/**
 * The staged form of checkpoint `iteration` when it is already committed: a redo of a training
 * activity whose commit landed but whose answer did not must not overwrite a committed
 * checkpoint's files; committing it again is a no-op.
 */
async function alreadyCommitted(store: ObjectStore, campaignId: string, iteration: number) {
  const done = await committedCheckpoint(store, campaignId, iteration);
  return done && stagedCheckpointFromManifest(campaignId, iteration, JSON.stringify(done.manifest));
}

/** The PyTorch trainer continues only from a checkpoint that holds its Hugging Face directory. */
async function checkHuggingFacePart(store: ObjectStore, ref: CheckpointRef): Promise<void> {
  const found = await committedCheckpoint(store, ref.campaignId, ref.iteration);
  if (found && !huggingFaceFiles(found.manifest, ref.key))
    throw ApplicationFailure.create({
      type: badInputErrorType,
      nonRetryable: true,
      message: `checkpoint ${ref.key} holds no Hugging Face directory (the native trainer wrote it): a campaign with engine.trainer pytorch forks only from checkpoints of the PyTorch trainer`,
    });
}

export async function updatePolicy(deps: ActivityDeps, input: UpdateInput): Promise<UpdateOutput> {
  const ctx = Context.current();
  const { campaignId, iteration, spec } = input;
  const store = deps.openStore(spec.store);
  // A redo of an update whose checkpoint is already committed (the commit landed, its answer
  // did not): training again would overwrite a committed checkpoint's files.
  const done = await alreadyCommitted(store, campaignId, iteration);
  if (done) return { staged: done, metrics: {}, attempt: ctx.info.attempt };
  const name = jobName(campaignId, 'u', iteration);
  const prefix = keys.jobPrefix(campaignId, name);
  const shards = [...input.chunksPerShard.entries()];
  await store.put(
    `${prefix}/rollouts.json`,
    JSON.stringify({
      keys: shards.flatMap(([s, n]) =>
        Array.from({ length: n }, (_, k) => keys.rolloutChunkKey(campaignId, iteration, s, k)),
      ),
    }),
  );
  await store.put(
    `${prefix}/rewards.json`,
    JSON.stringify({ keys: shards.map(([s]) => keys.rewardKey(campaignId, iteration, s)) }),
  );
  const hp = input.hyperparameters;
  const useReference = hp.klCoef > 0;
  // The PyTorch trainer reads and writes Hugging Face directories (engine contract v2).
  const pytorch = trainerEngine(spec) === 'pytorch';
  const part = pytorch ? { part: 'huggingFace' as const } : {};
  // The reference is sampled from, never trained: of a native checkpoint, its weights only.
  const referencePart = pytorch ? part : { part: 'weights' as const };
  // prettier-ignore
  const grpo = [
    'grpo',
    '--checkpoint', '{work}/policy',
    '--out', pytorch ? '{work}/hf-out' : '{work}/out',
    '--rollouts-file', '{work}/rollouts.txt',
    '--rewards-file', '{work}/rewards.txt',
    '--iteration', String(iteration),
    '--lr', String(hp.lr),
    ...algorithmFlags(spec, hp),
    // absent in the hyperparameters of campaigns started before it existed: off
    ...(hp.tisClip > 0 ? ['--tis-clip', String(hp.tisClip)] : []),
    '--temperature', String(hp.temperature),
    '--entropy-coef', String(hp.entropyCoef),
    '--aux-coef', String(hp.auxLossCoef),
    '--minibatches', String(hp.minibatches),
    '--epochs', String(hp.epochs),
    '--metrics', '{work}/metrics/metrics.jsonl',
    ...(useReference ? ['--ref-checkpoint', '{work}/reference', '--kl-coef', String(hp.klCoef)] : []),
  ];
  const jobTimes = await runTrainJob(deps, store, {
    name,
    campaignId,
    iteration,
    spec,
    what: `update of iteration ${iteration}`,
    job: {
      store: absoluteStore(spec.store),
      checkpoints: [
        { ref: input.policy, dir: 'policy', ...part },
        ...(useReference ? [{ ref: input.reference, dir: 'reference', ...referencePart }] : []),
      ],
      inputLists: [
        { indexKey: `${prefix}/rollouts.json`, dir: 'rollouts', listFile: 'rollouts.txt' },
        { indexKey: `${prefix}/rewards.json`, dir: 'rewards', listFile: 'rewards.txt' },
      ],
      steps: [grpo],
      outputs: trainOutputs(campaignId, iteration, prefix),
      ...(pytorch
        ? { trainer: 'pytorch', ...huggingFaceCheckpoint(spec, campaignId, iteration, 'hf-out', prefix) }
        : {}),
    },
  });
  const out = await collectJobOutputs(store, { campaignId, iteration, prefix });
  await store.deletePrefix(`${prefix}/`);
  return { ...out, ...jobTimes, attempt: ctx.info.attempt };
}

/** moe_train sft on the policy init made, from `examples` (a built-in task or a file of them). */
// prettier-ignore
const sftStep = (spec: CampaignSpec, examples: string[]) => [
  'sft',
  '--checkpoint', '{work}/init',
  '--out', '{work}/out',
  ...examples,
  '--steps', String(sftWarmStart(spec).steps),
  '--batch-size', String(sftWarmStart(spec).batchSize),
  '--seed', String(spec.seed),
  '--lr', String(sftWarmStart(spec).lr),
  '--warmup-steps', '10',
  '--metrics', '{work}/metrics/metrics.jsonl',
];

export async function preparePolicy(deps: ActivityDeps, input: PrepareInput): Promise<PrepareOutput> {
  const ctx = Context.current();
  const { spec, campaignId } = input;
  const store = deps.openStore(spec.store);
  const iteration = input.source.kind === 'fork' ? input.source.checkpoint.iteration : 0;
  const done = await alreadyCommitted(store, campaignId, iteration);
  if (done) return { staged: done, metrics: {}, attempt: ctx.info.attempt };
  if (input.source.kind === 'fork') {
    const source = input.source.checkpoint;
    if (trainerEngine(spec) === 'pytorch') await checkHuggingFacePart(store, source);
    // Copied within the store: the train worker's cache volume is smaller than a checkpoint may be.
    const stop = heartbeatUntilStopped(() => ({ fork: source.key }));
    try {
      const staged = await stageCopiedCheckpoint(store, source, campaignId, source.iteration);
      return { staged, metrics: {}, attempt: ctx.info.attempt };
    } finally {
      stop();
    }
  }
  const name = jobName(campaignId, 'p', 0);
  const prefix = keys.jobPrefix(campaignId, name);
  const m = spec.model;
  let steps: string[][];
  const inputLists: RankJob['inputLists'] = [];
  let hfModel: RankJob['hfModel'];
  let what: string;
  let pytorchJob: Partial<RankJob> = {};
  if (isHfModel(m) && trainerEngine(spec) === 'pytorch') {
    // The PyTorch trainer's first policy is the whole folder, kept in the checkpoint as it is.
    const source = hfModelLocation(m, spec.store);
    hfModel = { store: absoluteStore(source.location), prefix: source.prefix, dir: 'hf', whole: true };
    what = `import of ${m.huggingFace} for the PyTorch trainer`;
    steps = [];
    pytorchJob = huggingFaceCheckpoint(spec, campaignId, 0, 'hf', prefix);
  } else if (isHfModel(m)) {
    // Each rank fetches and imports only its own tensors (workers/rank.ts).
    const source = hfModelLocation(m, spec.store);
    hfModel = { store: absoluteStore(source.location), prefix: source.prefix, dir: 'hf' };
    // The warm start learns the dataset's rows as prepareInputs rendered them (token ids).
    const sft = spec.sftWarmStartSteps > 0;
    what = sft ? `import of ${m.huggingFace} and SFT warm start` : `import of ${m.huggingFace}`;
    steps = [
      ['init', '--from-hf', '{work}/hf', '--out', sft ? '{work}/init' : '{work}/out', ...importArgs(m)],
    ];
    if (sft) {
      await store.put(`${prefix}/sft.json`, JSON.stringify({ keys: [keys.sftExamplesKey(campaignId)] }));
      inputLists.push({ indexKey: `${prefix}/sft.json`, dir: 'sft', listFile: 'sft.txt' });
      steps.push(sftStep(spec, ['--data', '{work}/sft/0.jsonl']));
    }
  } else {
    const sft = spec.sftWarmStartSteps > 0 && 'builtin' in spec.task;
    what = sft ? 'SFT warm start' : 'policy initialisation';
    // prettier-ignore
    const init = [
      'init',
      '--out', sft ? '{work}/init' : '{work}/out',
      '--seed', String(spec.seed),
      '--dim', String(m.hidden),
      '--layers', String(m.layers),
      '--heads', String(m.heads),
      '--experts', String(m.experts),
      '--top-k', String(m.topK),
      '--expert-dim', String(m.expertHidden ?? m.hidden),
      '--max-seq-len', String(m.contextLength),
    ];
    steps = [init, ...(sft && 'builtin' in spec.task ? [sftStep(spec, ['--task', spec.task.builtin])] : [])];
  }
  const jobTimes = await runTrainJob(deps, store, {
    name,
    campaignId,
    iteration: 0,
    spec,
    what,
    job: {
      store: absoluteStore(spec.store),
      checkpoints: [],
      inputLists,
      ...(hfModel ? { hfModel } : {}),
      steps,
      outputs: trainOutputs(campaignId, 0, prefix),
      ...pytorchJob,
    },
  });
  const out = await collectJobOutputs(store, { campaignId, iteration: 0, prefix });
  await store.deletePrefix(`${prefix}/`);
  return { ...out, ...jobTimes, attempt: ctx.info.attempt };
}
