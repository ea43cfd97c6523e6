// The fault suite's long form (test/integration/chaos*.test.ts is the short one): N seeded
// trials of the chaos campaign (staleness 1, continue-as-new every 2) on one stack of separate
// processes, each with F faults drawn from its seed (SIGKILL/SIGTERM of the control, rollout
// and train workers, SIGKILL of the Temporal server, restarted on its SQLite file), then M
// trials on the S3 store (versitygw) through the seeded S3 fault proxy, with process faults
// too. A trial passes when its final checkpoint equals the uninterrupted run's, file by file
// (sha256), with the same rollouts and rewards, and no listing of the bucket showed anything
// partial. Prints one JSON line.
// Usage: node dist/bench/chaos.js [--trials 20] [--faults 4] [--seed 1] [--s3-trials 4] [--s3-rate 0.15]
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { DefaultLogger, Runtime } from '@temporalio/worker';
import { openStore, type ObjectStore } from '../activities/store/index.js';
import { artifacts } from '../test/support/campaign-harness.js';
import { watchBucket } from '../test/support/bucket-watch.js';
import {
  chaosSpec,
  checkpointDigests,
  countFaults,
  faultSchedule,
  runTrial,
  startChaosStack,
  type Fault,
  type LostWork,
} from '../test/support/chaos.js';
import { faultKinds, startFaultProxy, type FaultKind } from '../test/support/s3-fault-proxy.js';
import { startVersitygw } from '../test/support/versitygw.js';
import { awsEnv, directClient, directStore, s3Location } from '../test/support/versitygw-access.js';

const { values } = parseArgs({
  options: {
    trials: { type: 'string', default: '20' },
    faults: { type: 'string', default: '4' },
    seed: { type: 'string', default: '1' },
    's3-trials': { type: 'string', default: '4' },
    's3-rate': { type: 'string', default: '0.15' },
  },
});
const trials = Number(values.trials);
const faultsPerTrial = Number(values.faults);
const firstSeed = Number(values.seed);
const s3Trials = Number(values['s3-trials']);
const s3Rate = Number(values['s3-rate']);
for (const [name, v] of Object.entries({ trials, faultsPerTrial, firstSeed, s3Trials, s3Rate }))
  if (!Number.isFinite(v) || v < 0) throw new Error(`chaos bench: --${name} must be a number ≥ 0`);

Runtime.install({ logger: new DefaultLogger('ERROR'), shutdownSignals: [] });
// Exiting runs the harness's exit handlers, which stop the servers and worker groups it started.
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => process.exit(130));
const dir = mkdtempSync(join(tmpdir(), 'moerl-chaos-bench-'));
const gw = await startVersitygw();
const proxy = await startFaultProxy(gw.endpoint, firstSeed, { rate: 0 });
const stack = await startChaosStack(join(dir, 'stack'), awsEnv(gw));
const s3Client = directClient(gw);

const applied: Fault[] = [];
const lost: LostWork = { activityRetries: 0, workflowTaskTimeouts: 0, workflowTaskFailures: 0 };
const wallMs: number[] = [];
const failures: string[] = [];
let identical = 0;
let listings = 0;
try {
  const fs = openStore(chaosSpec('x', dir).store);
  const reference = await runTrial(stack, chaosSpec('bench-reference', dir), [], 300_000);
  const iterations = reference.state.committedIteration;
  const want = JSON.stringify(await checkpointDigests(fs, reference.campaignId, iterations));
  const wantArtifacts = await artifacts(fs, reference.campaignId);

  const compare = async (store: ObjectStore, campaignId: string): Promise<string | null> => {
    const got = JSON.stringify(await checkpointDigests(store, campaignId, iterations));
    if (got !== want) return `checkpoint differs: ${got} vs ${want}`;
    const gotArtifacts = await artifacts(store, campaignId);
    if (gotArtifacts.size !== wantArtifacts.size)
      return `${gotArtifacts.size} rollout and rewards files, not ${wantArtifacts.size}`;
    for (const [key, text] of wantArtifacts) if (gotArtifacts.get(key) !== text) return `${key} differs`;
    return null;
  };

  for (let i = 0; i < trials + s3Trials; i++) {
    const seed = firstSeed + i;
    const onS3 = i >= trials;
    const bucket = onS3 ? await gw.createBucket() : '';
    const spec = onS3
      ? chaosSpec(`bench-s3-${seed}`, dir, s3Location(gw, bucket, proxy.endpoint))
      : chaosSpec(`bench-${seed}`, dir);
    const schedule = faultSchedule(seed, faultsPerTrial, reference.wallMs * 0.9);
    if (onS3) await proxy.setProfile({ rate: s3Rate });
    const watch = onS3 ? watchBucket(s3Client, bucket) : undefined;
    try {
      const outcome = await runTrial(stack, spec, schedule, 600_000);
      applied.push(...outcome.applied);
      wallMs.push(outcome.wallMs);
      for (const k of Object.keys(lost) as (keyof LostWork)[]) lost[k] += outcome.lost[k];
      const store = onS3 ? directStore(gw, bucket) : fs;
      if (onS3) await proxy.setProfile({ rate: 0 });
      const seen = await watch?.stop();
      listings += seen?.listings ?? 0;
      const problem =
        (seen?.violations.length ? `visible: ${seen.violations.join('; ')}` : null) ??
        (stack.unexpectedExits.length ? `workers exited: ${stack.unexpectedExits.join('; ')}` : null) ??
        (await compare(store, outcome.campaignId));
      if (problem) failures.push(`seed ${seed}${onS3 ? ' (s3)' : ''}: ${problem}`);
      else identical++;
    } catch (err) {
      await watch?.stop().catch(() => undefined);
      failures.push(
        `seed ${seed}${onS3 ? ' (s3)' : ''}: ${err instanceof Error ? err.message.split('\n')[0] : String(err)}`,
      );
    } finally {
      await proxy.setProfile({ rate: 0 });
    }
    console.error(
      `chaos bench: trial ${i + 1}/${trials + s3Trials} seed ${seed}: ${failures.length} failed so far`,
    );
  }
  const proxyStats = await proxy.stats();
  const sorted = [...wallMs].sort((a, b) => a - b);
  console.log(
    JSON.stringify({
      trials: trials + s3Trials,
      s3Trials,
      identical,
      faultsPerTrial,
      processFaults: applied.length,
      processFaultsByKind: countFaults(applied),
      s3Faults: Object.fromEntries(faultKinds.map((k: FaultKind) => [k, proxyStats.faults[k]])),
      s3Requests: proxyStats.requests,
      s3Rate,
      bucketListings: listings,
      lost,
      referenceMs: reference.wallMs,
      trialMs: { median: sorted[Math.floor(sorted.length / 2)] ?? null, max: sorted.at(-1) ?? null },
      failures,
    }),
  );
} finally {
  s3Client.destroy();
  await stack.stop();
  await proxy.stop();
  await gw.stop();
  rmSync(dir, { recursive: true, force: true });
}
