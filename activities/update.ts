// Training activities: the policy update of an iteration (GRPO) and the campaign's first
// policy (init + SFT warm start, or a forked checkpoint). Both run native moe_train on every
// rank through the Launcher and stage the resulting checkpoint in the store; the checkpoint
// activity commits it.
import { createHash } from 'node:crypto';
import { mkdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ApplicationFailure, Context } from '@temporalio/activity';
import { fetchCheckpoint, stageCheckpoint } from './checkpoints.js';
import * as keys from './layout.js';
import { nativeToolPath, runTool, toolFailure } from './native.js';
import type { ActivityDeps } from './deps.js';
import type { JobStatus } from './launch/types.js';
import type { ObjectStore } from './store/types.js';
import { badInputErrorType } from './types.js';
import type { CampaignSpec } from '../workflows/spec.js';
import type { PrepareInput, PrepareOutput, UpdateInput, UpdateOutput } from './types.js';

const heartbeatEveryMs = 2000;
const logUploadEveryBeats = 5;

/**
 * The job name of this activity: the same on every retry of the same scheduled activity, so a
 * retry adopts a job that is still running; a stage re-run after `resume` gets a new one.
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
    .slice(0, 40);
  return `${base}-${kind}${iteration}-${group}`;
}

function providerFor(spec: CampaignSpec) {
  return spec.launcher.kind === 'kubernetes' && spec.launcher.efaPerRank > 0 ? 'efa' : 'shm';
}

/** Runs moe_train on every rank, heartbeating the job's state; uploads rank logs; maps failure. */
async function runTrainJob(
  deps: ActivityDeps,
  store: ObjectStore,
  job: {
    name: string;
    campaignId: string;
    iteration: number;
    spec: CampaignSpec;
    args: string[];
    what: string;
  },
): Promise<void> {
  const ctx = Context.current();
  const launched = await deps.launcherFor(job.spec.launcher).launch({
    name: job.name,
    worldSize: job.spec.epWorldSize,
    command: [nativeToolPath('moe_train', deps.binDir), ...job.args],
    env: { OPENBLAS_NUM_THREADS: '1' },
    provider: providerFor(job.spec),
  });
  // Rank logs go to the store while the job runs (a long update can be followed from there) and
  // once more, whole, when it ends.
  const uploadLogs = async () => {
    for (let rank = 0; rank < job.spec.epWorldSize; rank++) {
      const log = await launched.readLog(rank).catch(() => null);
      if (log) await store.put(keys.rankLogKey(job.campaignId, job.iteration, ctx.info.attempt, rank), log);
    }
  };
  let uploading: Promise<void> | null = null;
  let beats = 0;
  const beat = () => {
    const s = launched.status();
    ctx.heartbeat({
      job: s.name,
      state: s.state,
      adopted: launched.adopted,
      ranks: s.ranks.map((r) => r.state),
    });
    if (++beats % logUploadEveryBeats === 0 && uploading === null)
      uploading = uploadLogs()
        .catch(() => undefined)
        .finally(() => (uploading = null));
  };
  beat();
  const timer = setInterval(beat, heartbeatEveryMs);
  const cancel = () => void launched.kill();
  ctx.cancellationSignal.addEventListener('abort', cancel, { once: true });
  let status: JobStatus;
  try {
    status = await launched.wait();
  } finally {
    clearInterval(timer);
    ctx.cancellationSignal.removeEventListener('abort', cancel);
  }
  await uploading;
  await uploadLogs();
  if (ctx.cancellationSignal.aborted) throw ctx.cancellationSignal.reason ?? new Error('cancelled');
  if (status.state !== 'succeeded') {
    const f = status.failure;
    const how = f
      ? f.exitCode === null
        ? `was killed by ${f.signal}`
        : `exited with code ${f.exitCode}`
      : 'failed';
    const tail = f?.logTail ? `: ${f.logTail.split('\n').slice(-4).join(' | ')}` : '';
    const message = `${job.what}: rank ${f?.rank ?? '?'} of ${job.spec.epWorldSize} ${how}${tail} (job ${job.name}, logs under ${keys.campaignPrefix(job.campaignId)}/logs/)`;
    throw f?.exitCode === 2
      ? ApplicationFailure.create({ type: badInputErrorType, nonRetryable: true, message })
      : ApplicationFailure.create({ type: 'TrainerRankFailed', message });
  }
}

/** Scalar metrics of the last optimizer step, plus the whole per-step log in the store. */
async function collectMetrics(store: ObjectStore, file: string, campaignId: string, iteration: number) {
  const text = await readFile(file, 'utf8').catch(() => '');
  const steps = text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  await store.put(keys.metricsKey(campaignId, iteration), JSON.stringify({ iteration, steps }), {
    contentType: 'application/json',
  });
  const last = steps.at(-1) ?? {};
  return Object.fromEntries(Object.entries(last).filter(([, v]) => typeof v === 'number')) as Record<
    string,
    number
  >;
}

async function freshDir(dir: string): Promise<string> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  return dir;
}

export async function updatePolicy(deps: ActivityDeps, input: UpdateInput): Promise<UpdateOutput> {
  const ctx = Context.current();
  const store = deps.openStore(input.spec.store);
  const name = jobName(input.campaignId, 'u', input.iteration);
  const work = join(deps.cacheDir, 'jobs', name);
  const inputs = await freshDir(join(work, `inputs-${ctx.info.attempt}`));
  const policyDir = await fetchCheckpoint(store, input.policy, deps.cacheDir);
  const local = async (key: string, i: number, kind: string) => {
    const path = join(inputs, `${kind}-${i}.jsonl`);
    await store.getFile(key, path);
    return path;
  };
  const rollouts = await Promise.all(input.rolloutKeys.map((k, i) => local(k, i, 'rollout')));
  const rewards = await Promise.all(input.rewardKeys.map((k, i) => local(k, i, 'rewards')));
  const hp = input.hyperparameters;
  const outDir = join(work, 'out');
  const metricsFile = join(work, 'metrics.jsonl');
  // prettier-ignore
  const args = [
    'grpo',
    '--checkpoint', policyDir,
    '--out', outDir,
    '--rollouts', rollouts.join(','),
    '--rewards', rewards.join(','),
    '--iteration', String(input.iteration),
    '--lr', String(hp.lr),
    '--clip-eps', String(hp.clipEps),
    '--temperature', String(hp.temperature),
    '--entropy-coef', String(hp.entropyCoef),
    '--aux-coef', String(hp.auxLossCoef),
    '--minibatches', String(hp.minibatches),
    '--epochs', String(hp.epochs),
    '--metrics', metricsFile,
  ];
  if (hp.klCoef > 0)
    args.push(
      '--ref-checkpoint',
      await fetchCheckpoint(store, input.reference, deps.cacheDir),
      '--kl-coef',
      String(hp.klCoef),
    );
  await rm(metricsFile, { force: true });
  await runTrainJob(deps, store, {
    name,
    campaignId: input.campaignId,
    iteration: input.iteration,
    spec: input.spec,
    args,
    what: `update of iteration ${input.iteration}`,
  });
  const staged = await stageCheckpoint(store, outDir, input.campaignId, input.iteration);
  const metrics = await collectMetrics(store, metricsFile, input.campaignId, input.iteration);
  await rm(work, { recursive: true, force: true });
  return { staged, metrics, attempt: ctx.info.attempt };
}

export async function preparePolicy(deps: ActivityDeps, input: PrepareInput): Promise<PrepareOutput> {
  const ctx = Context.current();
  const { spec, campaignId } = input;
  const store = deps.openStore(spec.store);
  if (input.source.kind === 'fork') {
    const source = input.source.checkpoint;
    const dir = await fetchCheckpoint(store, source, deps.cacheDir);
    const staged = await stageCheckpoint(store, dir, campaignId, source.iteration);
    return { staged, metrics: {}, attempt: ctx.info.attempt };
  }
  const name = jobName(campaignId, 'p', 0);
  const work = await freshDir(join(deps.cacheDir, 'jobs', name));
  const m = spec.model;
  const initDir = join(work, 'init');
  // prettier-ignore
  const init = await runTool(nativeToolPath('moe_train', deps.binDir), [
    'init',
    '--out', initDir,
    '--seed', String(spec.seed),
    '--dim', String(m.hidden),
    '--layers', String(m.layers),
    '--heads', String(m.heads),
    '--experts', String(m.experts),
    '--top-k', String(m.topK),
    '--expert-dim', String(m.expertHidden ?? m.hidden),
    '--max-seq-len', String(m.contextLength),
  ]);
  if (init.code !== 0) throw toolFailure('moe_train init', init);
  let policyDir = initDir;
  let metrics: Record<string, number> = {};
  if (spec.sftWarmStartSteps > 0) {
    if (!('builtin' in spec.task))
      throw ApplicationFailure.create({
        type: 'NotSupported',
        nonRetryable: true,
        message: 'the SFT warm start needs a builtin task',
      });
    const sftDir = join(work, 'sft');
    const metricsFile = join(work, 'sft-metrics.jsonl');
    await runTrainJob(deps, store, {
      name,
      campaignId,
      iteration: 0,
      spec,
      what: 'SFT warm start',
      // prettier-ignore
      args: [
        'sft',
        '--checkpoint', initDir,
        '--out', sftDir,
        '--task', spec.task.builtin,
        '--steps', String(spec.sftWarmStartSteps),
        '--seed', String(spec.seed),
        '--lr', '3e-3',
        '--warmup-steps', '10',
        '--metrics', metricsFile,
      ],
    });
    metrics = await collectMetrics(store, metricsFile, campaignId, 0);
    policyDir = sftDir;
  }
  const staged = await stageCheckpoint(store, policyDir, campaignId, 0);
  await rm(work, { recursive: true, force: true });
  return { staged, metrics, attempt: ctx.info.attempt };
}
