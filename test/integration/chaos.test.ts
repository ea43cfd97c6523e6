// The fault suite's short form: seeded SIGKILL and SIGTERM of the rollout, train and control
// worker processes and SIGKILL of the Temporal server (restarted on its SQLite file), at
// moments drawn from the seed during a campaign with staleness 1 and continue-as-new. Every
// trial must end with a final checkpoint whose files equal the uninterrupted run's (sha256),
// and with the same rollouts and rewards. The long form is bench/chaos.ts.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { freePort, startDevServer } from '../../cli/dev-server.js';
import { openStore } from '../../activities/store/index.js';
import { artifacts, spawnWatchedWorker, waitFor } from '../support/campaign-harness.js';
import {
  chaosSpec,
  checkpointDigests,
  countFaults,
  faultSchedule,
  runTrial,
  startChaosStack,
  type ChaosStack,
} from '../support/chaos.js';
import { nativeTools } from '../support/native-tools.js';

const tools = nativeTools(['moe_train', 'moe_generate']);
// Seeds whose schedules hit every target between them (rollout, train, control, server).
const seeds = (process.env.MOERL_CHAOS_SEEDS ?? '2,12').split(',').map(Number);
const faultsPerTrial = 3;

let stack: ChaosStack;
let dir: string;

describe('chaos: seeded process and server faults', { skip: tools.skip, timeout: 300_000 }, () => {
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-chaos-'));
    stack = await startChaosStack(dir);
  });
  after(async () => {
    await stack?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('every trial ends with the uninterrupted run’s checkpoint, rollouts and rewards', async () => {
    const store = openStore(chaosSpec('x', dir).store);
    const reference = await runTrial(stack, chaosSpec('chaos-reference', dir), [], 120_000);
    const iterations = reference.state.committedIteration;
    assert.equal(iterations, 4, 'the reference commits all 4 iterations');
    const want = await checkpointDigests(store, reference.campaignId, iterations);
    const wantArtifacts = await artifacts(store, reference.campaignId);

    for (const seed of seeds) {
      // Faults land while the campaign runs: within the reference's duration.
      const schedule = faultSchedule(seed, faultsPerTrial, reference.wallMs * 0.9);
      const outcome = await runTrial(stack, chaosSpec(`chaos-seed-${seed}`, dir), schedule, 150_000);
      console.log(
        `chaos seed ${seed}: ${outcome.wallMs} ms (reference ${reference.wallMs} ms), faults ${JSON.stringify(countFaults(outcome.applied))}, runs ${outcome.runs}, lost ${JSON.stringify(outcome.lost)}`,
      );
      assert.deepEqual(stack.unexpectedExits, [], 'no worker exited unless told to');
      assert.equal(outcome.state.committedIteration, iterations);
      assert.deepEqual(
        await checkpointDigests(store, outcome.campaignId, iterations),
        want,
        `seed ${seed}: the final checkpoint's files equal the uninterrupted run's`,
      );
      const got = await artifacts(store, outcome.campaignId);
      assert.equal(got.size, wantArtifacts.size, `seed ${seed}: as many rollout and rewards files`);
      for (const [key, text] of wantArtifacts) assert.equal(got.get(key), text, `seed ${seed}: ${key}`);
    }
  });

  test('a control worker told to stop while it bundles its workflows exits', async () => {
    const server = await startDevServer({});
    const { worker, log, exited } = spawnWatchedWorker('control', {
      TEMPORAL_ADDRESS: server.address,
      MOERL_TASK_QUEUE_PREFIX: 'early-stop-',
    });
    try {
      // Connected, not yet polling: the workflow bundle is being made.
      await waitFor(
        'the worker to connect',
        async () => (/roles control on/.test(log()) ? true : undefined),
        60_000,
      );
      worker.kill('SIGTERM');
      const code = await Promise.race([
        exited,
        new Promise((resolve) => setTimeout(resolve, 45_000, 'still running')),
      ]);
      assert.equal(code, 0, `a clean exit within 45 s of SIGTERM:\n${log().slice(-2000)}`);
    } finally {
      worker.kill('SIGKILL');
      await server.stop();
    }
  });

  test('a worker started while the server is down waits for it instead of exiting', async () => {
    const port = await freePort();
    const { worker, log, exited } = spawnWatchedWorker('rollout', {
      TEMPORAL_ADDRESS: `127.0.0.1:${port}`,
      MOERL_TASK_QUEUE_PREFIX: 'wait-',
    });
    try {
      await waitFor(
        'the worker to find the server unreachable',
        async () => (/unreachable/.test(log()) ? true : undefined),
        60_000,
      );
      assert.equal(worker.exitCode, null, `the worker waits: ${log()}`);
      const server = await startDevServer({ port });
      try {
        await waitFor(
          'the worker to connect',
          async () => (/roles rollout on/.test(log()) ? true : undefined),
          60_000,
        );
      } finally {
        worker.kill('SIGTERM');
        assert.equal(await exited, 0, `a clean exit on SIGTERM: ${log()}`);
        await server.stop();
      }
    } finally {
      worker.kill('SIGKILL');
    }
  });
});
