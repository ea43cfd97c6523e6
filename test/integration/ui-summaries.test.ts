// What the Temporal UI and CLI show for a campaign, read back from the real dev server: every
// scheduled activity's summary (its user metadata in the history: the UI's timeline bars) and
// the workflow's current details (the `__temporal_workflow_metadata` query that the UI and
// `temporal workflow metadata` read), for a campaign of the real workflow with test activities.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { after, before, describe, it } from 'node:test';
import { defaultPayloadConverter } from '@temporalio/common';
import { resolveTool } from '../../cli/temporal-tools.js';
import { startCampaign, testSpec, waitForState, withWorkers } from '../support/campaign-harness.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

const run = promisify(execFile);

describe('activity summaries and current details on the dev server', { timeout: 90_000 }, () => {
  let t: TestEnvironment;
  before(async () => {
    t = await startTestEnvironment();
  });
  after(async () => {
    await t?.teardown();
  });

  it('each timeline bar says what it is; the current details follow the stages and a pause', async () => {
    const recording = createRecordingTestActivities({
      delayMs: { rolloutShard: 100 },
      holdWhen: (c) => c.activity === 'updatePolicy' && c.iteration === 1,
    });
    await withWorkers(t.nativeConnection, t.namespace, recording.activities, async (queues) => {
      const spec = testSpec({ iterations: 2, rolloutShards: 2, epWorldSize: 2, sftWarmStartSteps: 3 });
      const handle = await startCampaign(t.client, spec, queues);
      const details = async () =>
        (await handle.query<{ currentDetails: string }>('__temporal_workflow_metadata')).currentDetails;

      await recording.started('updatePolicy', 1);
      assert.equal(await details(), 'running — 0/2 iterations committed\niteration 1: update');
      // The Temporal CLI reads the same details.
      const temporal = await resolveTool('temporal');
      const cli = await run(temporal, [
        'workflow',
        'metadata',
        '--workflow-id',
        handle.workflowId,
        '--address',
        t.address,
        '--namespace',
        t.namespace,
      ]);
      assert.match(cli.stdout, /iteration 1: update/);

      await handle.signal('pause', { reason: 'look at rollouts' });
      recording.release('updatePolicy', 1);
      await waitForState(handle, 'paused', (s) => s.status === 'paused');
      // Paused at the boundary before iteration 1's checkpoint commit.
      assert.equal(await details(), 'paused: look at rollouts — 0/2 iterations committed');
      await handle.signal('resume', {});
      await handle.result();
      assert.match(
        await details(),
        /^completed — 2\/2 iterations committed, mean reward 0\.200 \(iteration 2\)$/,
      );

      const summaries: string[] = [];
      for (const e of (await handle.fetchHistory()).events ?? []) {
        if (!e.activityTaskScheduledEventAttributes) continue;
        const payload = e.userMetadata?.summary;
        assert.ok(
          payload,
          `activity ${e.activityTaskScheduledEventAttributes.activityType?.name} has a summary`,
        );
        summaries.push(defaultPayloadConverter.fromPayload<string>(payload));
      }
      const perIteration = (i: number) => [
        `rollout it ${i} shard 0 (of 2)`,
        `rollout it ${i} shard 1 (of 2)`,
        `reward it ${i} (2 shards)`,
        `update it ${i} (2 ranks)`,
        `checkpoint it ${i}`,
      ];
      assert.deepEqual(summaries, [
        'prepare it 0 (init + SFT 3 steps, 2 ranks)',
        'checkpoint it 0',
        ...perIteration(1),
        ...perIteration(2),
      ]);
    });
  });
});
