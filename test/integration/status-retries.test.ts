// `moerl status` while a lost rollout worker's shards are retried: the server is at attempt 2,
// the workflow has counted nothing yet (it learns an attempt when the activity returns), and the
// retries line must say so anyway, as `moerl report` does from the history; once the shards
// finish the workflow's own count takes over with the same number.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { retriesNow, statusText } from '../../cli/commands/status.js';
import { readCampaignRecords } from '../../cli/history.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, waitFor } from '../support/campaign-harness.js';
import { chaosSpec, startChaosStack, type ChaosStack } from '../support/chaos.js';
import { nativeTools } from '../support/native-tools.js';

const tools = nativeTools(['moe_train', 'moe_generate']);

let stack: ChaosStack;
let dir: string;
/** The worker outage under way: it restarts the worker, so it must end before the stack stops. */
let down: Promise<string> | undefined;

describe(
  'status retries while the server retries a lost worker’s shards',
  { skip: tools.skip, timeout: 150_000 },
  () => {
    before(async () => {
      dir = mkdtempSync(join(tmpdir(), 'moerl-status-retries-'));
      stack = await startChaosStack(dir);
    });
    after(async () => {
      await stack?.stop();
      rmSync(dir, { recursive: true, force: true });
    });

    test('retries counts the pending attempts, and the same number once they finish', async () => {
      const spec = { ...chaosSpec('status-retries', dir), iterations: 1 };
      const handle = await startCampaign(stack.client, spec, stack.taskQueues);
      const describeNow = () => stack.client.workflow.getHandle(handle.workflowId).describe();
      const shards = (d: Awaited<ReturnType<typeof describeNow>>) =>
        (d.raw.pendingActivities ?? []).filter((p) => p.activityType?.name === 'rolloutShard');
      // temporal.api.enums.v1.PendingActivityState: 2 is STARTED (a worker has the shard).
      await waitFor(
        'a rollout shard running',
        async () => (shards(await describeNow()).some((p) => p.state === 2) ? true : undefined),
        90_000,
        100,
      );
      // Down long enough for the heartbeat timeout (2 s) to put the shards at attempt 2 first.
      down = stack.inject(
        { atMs: 0, target: 'rollout', signal: 'SIGKILL', downMs: 8_000 },
        handle.workflowId,
      );
      const { description, state } = await waitFor(
        'a shard at attempt 2',
        async () => {
          const d = await describeNow();
          if (!shards(d).some((p) => (p.attempt ?? 1) >= 2)) return undefined;
          return { description: d, state: await handle.query<CampaignState>('status') };
        },
        30_000,
        200,
      );
      const retried = shards(description).reduce((n, p) => n + Math.max(0, (p.attempt ?? 1) - 1), 0);
      assert.equal(state.retries.rollout, 0, 'the workflow has counted no finished retry yet');
      const text = statusText(state, description);
      assert.match(text, new RegExp(`^retries\\s+(.*, )?rollout ${retried}(,|$)`, 'm'), text);
      const records = await readCampaignRecords(stack.client, handle.workflowId);
      const reported = records.activities.reduce((n, a) => n + a.attempts - 1, 0);
      assert.ok(reported >= retried, `history and report see the retries too (${reported})`);

      await down;
      await handle.result();
      const done = await handle.query<CampaignState>('status');
      const final = await describeNow();
      assert.ok(done.retries.rollout >= retried, JSON.stringify(done.retries));
      assert.deepEqual(retriesNow(done, final), done.retries, 'nothing pending once completed');
    });
  },
);
