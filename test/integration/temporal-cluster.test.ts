// The cluster tier: campaigns on a production-shaped Temporal cluster (separate frontend, two
// history hosts, matching and worker services on PostgreSQL, SQL visibility), and one seeded
// trial per fault kind while a campaign runs — a history host SIGKILLed (its shards move to the
// other), matching restarted, PostgreSQL restarted (fast shutdown) and stalled with SIGSTOP for
// 20 s, the frontend SIGKILLed. Each trial must find work in flight when it strikes and end with
// the fault-free run's checkpoint, file by file. The full matrix is bench/temporal_cluster.ts.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openStore } from '../../activities/store/index.js';
import { campaignStatusKey } from '../../workflows/search-attributes.js';
import {
  chaosSpec,
  checkpointDigests,
  clusterTemporal,
  runTrial,
  startChaosStack,
  type ChaosStack,
  type TrialOutcome,
} from '../support/chaos.js';
import { clusterFaultKinds, clusterFaultTrial } from '../support/cluster-faults.js';
import { nativeTools } from '../support/native-tools.js';
import { startTemporalCluster, type TemporalCluster } from '../support/temporal-cluster.js';

const tools = nativeTools(['moe_train', 'moe_generate']);
const seed = Number(process.env.MOERL_CLUSTER_SEED ?? 3);

let dir: string;
let cluster: TemporalCluster;
let stack: ChaosStack;
let reference: TrialOutcome;
let want: Record<string, string>;

describe(
  'a Temporal cluster of separate services on PostgreSQL',
  { skip: tools.skip, timeout: 900_000 },
  () => {
    before(async () => {
      dir = mkdtempSync(join(tmpdir(), 'moerl-cluster-'));
      cluster = await startTemporalCluster(join(dir, 'temporal'));
      stack = await startChaosStack(join(dir, 'stack'), {}, clusterTemporal(cluster));
    });
    after(async () => {
      await stack?.stop();
      rmSync(dir, { recursive: true, force: true });
    });

    test('a campaign completes on it, with the shards split between the two history hosts', async () => {
      const owners = new Set((await cluster.shardOwners()).values());
      assert.deepEqual(
        [...owners].sort(),
        Object.values(cluster.historyHosts).sort(),
        'both history hosts own shards',
      );
      reference = await runTrial(stack, chaosSpec('cluster-reference', dir), [], 240_000);
      assert.equal(reference.state.committedIteration, 4, 'the campaign commits all 4 iterations');
      want = await checkpointDigests(openStore(chaosSpec('x', dir).store), reference.campaignId, 4);
      // SQL visibility serves moerl's search attributes.
      const listed = [];
      for await (const w of cluster.client.workflow.list({
        query: `WorkflowId = "${reference.campaignId}" AND ${campaignStatusKey.name} = "completed"`,
      }))
        listed.push(w.workflowId);
      assert.ok(listed.length >= 1, 'the completed campaign is listed by its search attributes');
      console.log(
        `cluster reference: ${reference.wallMs} ms, runs ${reference.runs}, lost ${JSON.stringify(reference.lost)}`,
      );
    });

    for (const kind of clusterFaultKinds)
      test(`${kind}: the campaign ends with the fault-free checkpoint`, async (t) => {
        if (!reference) return t.skip('the fault-free campaign did not complete');
        const trial = await clusterFaultTrial(stack, kind, seed, reference, dir);
        console.log(`cluster fault ${kind} (seed ${seed}): ${trial.summary}`);
        assert.deepEqual(stack.unexpectedExits, [], 'no worker exited unless told to');
        assert.ok(
          trial.fault.inFlight.length > 0,
          `work was in flight when ${kind} struck: ${trial.summary}`,
        );
        assert.equal(trial.outcome.state.committedIteration, 4);
        assert.deepEqual(
          await checkpointDigests(openStore(chaosSpec('x', dir).store), trial.outcome.campaignId, 4),
          want,
          `${kind}: the final checkpoint's files equal the fault-free run's`,
        );
        if (kind === 'history SIGKILL') {
          assert.ok(
            trial.servedWhileDown > 0,
            `the surviving history host served the campaign: ${trial.summary}`,
          );
        }
      });
  },
);
