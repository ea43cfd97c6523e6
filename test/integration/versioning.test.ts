// Deploying new worker code mid-campaign with Temporal Worker Versioning, on the real dev server
// with recording test activities: a campaign runs on build A; workers of build B (a patched()
// change in the workflow, a changed reward activity) start; B is made current with the Temporal
// CLI command docs/operations.md names; the campaign finishes on B with no failed workflow task;
// the server reports A drained, and A's workers stop.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { Context, sleep } from '@temporalio/activity';
import { Worker, bundleWorkflowCode } from '@temporalio/worker';
import type { WorkflowBundle } from '@temporalio/worker';
import { campaignBuild, listEntry } from '../../cli/commands/list.js';
import { statusText } from '../../cli/commands/status.js';
import { resolveTool } from '../../cli/temporal-tools.js';
import type { CampaignActivities } from '../../activities/types.js';
import { runWorkers } from '../../workers/worker.js';
import type { CampaignState, TaskQueues } from '../../workflows/types.js';
import { buildBActivities, buildBMeanReward } from '../fixtures/build-b-activities.js';
import { buildBPatch } from '../fixtures/build-b-campaign.js';
import {
  startCampaign,
  testSpec,
  uniqueTaskQueues,
  waitFor,
  workflowBundle,
} from '../support/campaign-harness.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

/** temporal.api.enums.v1.VersionDrainageStatus.VERSION_DRAINAGE_STATUS_DRAINED */
const drained = 2;
const deploymentName = 'moerl-test';
const heldIteration = 2;
const run = promisify(execFile);
const never = new Promise<never>(() => undefined);

let t: TestEnvironment;
before(async () => {
  // The server decides that a version no longer current is drained after a grace period and
  // re-checks on an interval (minutes by default); seconds here.
  t = await startTestEnvironment({
    dynamicConfig: {
      'matching.wv.VersionDrainageStatusVisibilityGracePeriod': '1s',
      'matching.wv.VersionDrainageStatusRefreshInterval': '1s',
    },
  });
});
after(async () => {
  await t?.teardown();
});

/** Workers of one build on `queues`, all roles, until `stop()`. */
function startBuild(
  buildId: string,
  activities: CampaignActivities,
  bundle: WorkflowBundle,
  queues: TaskQueues,
) {
  const abort = new AbortController();
  const running = runWorkers({
    roles: ['all'],
    connection: t.nativeConnection,
    namespace: t.namespace,
    taskQueues: queues,
    activities,
    workflowBundle: bundle,
    shutdownGraceMs: 1000,
    signal: abort.signal,
    deployment: { deploymentName, buildId },
  });
  return {
    running,
    stop: async () => {
      abort.abort();
      await running;
    },
  };
}

const describeVersion = (buildId: string) =>
  t.connection.workflowService.describeWorkerDeploymentVersion({
    namespace: t.namespace,
    deploymentVersion: { deploymentName, buildId },
  });

/** Waits until the build polls every queue, then makes it current as an operator would. */
async function makeCurrent(buildId: string, queues: TaskQueues): Promise<void> {
  await waitFor(
    `build ${buildId} polling ${Object.values(queues).join(', ')}`,
    async () => {
      const info = await describeVersion(buildId).catch(() => undefined);
      const polled = new Set(info?.workerDeploymentVersionInfo?.taskQueueInfos?.map((q) => q.name));
      return Object.values(queues).every((q) => polled.has(q)) ? true : undefined;
    },
    30_000,
    500,
  );
  const args = ['worker', 'deployment', 'set-current-version', '--address', t.address];
  args.push('--namespace', t.namespace, '--deployment-name', deploymentName, '--build-id', buildId, '--yes');
  const cli = await resolveTool('temporal');
  // Right after a build first polls, the server may not have created its deployment record
  // yet ("Worker Deployment not found"); an operator would run the command again.
  for (const deadline = Date.now() + 30_000; ;) {
    try {
      await run(cli, args, { timeout: 30_000 });
      return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

describe('worker versioning: new worker code mid-campaign (recording test activities)', () => {
  test(
    'a campaign started on build A finishes on build B; A drains and stops',
    { timeout: 120_000 },
    async () => {
      const bundleB = await bundleWorkflowCode({
        workflowsPath: fileURLToPath(new URL('../fixtures/build-b-campaign.js', import.meta.url)),
        workflowInterceptorModules: [
          fileURLToPath(new URL('../fixtures/build-b-campaign.js', import.meta.url)),
        ],
        logger: { log() {}, trace() {}, debug() {}, info() {}, warn() {}, error() {} },
      });
      const delayMs = { rolloutShard: 100, updatePolicy: 100 };
      const a = createRecordingTestActivities({ delayMs, rewardFor: () => 0.2 });
      const b = createRecordingTestActivities({ delayMs });
      // A's update of iteration 2 is in flight while B is deployed: it runs until B is current.
      let bIsCurrent = false;
      const updateOnA: CampaignActivities['updatePolicy'] = async (input) => {
        while (input.iteration === heldIteration && !bIsCurrent) {
          Context.current().heartbeat();
          await sleep(100);
        }
        return a.activities.updatePolicy(input);
      };
      const queues = uniqueTaskQueues();
      const buildA = startBuild(
        'A',
        { ...a.activities, updatePolicy: updateOnA },
        await workflowBundle(),
        queues,
      );
      let buildB: ReturnType<typeof startBuild> | undefined;
      try {
        await makeCurrent('A', queues);
        const iterations = 5;
        const handle = await startCampaign(t.client, testSpec({ iterations }), queues);
        await waitFor(`update of iteration ${heldIteration} running on build A`, async () => {
          const s = await handle.query<CampaignState>('status');
          return s.activeStages.some((st) => st.stage === 'update' && st.iteration === heldIteration)
            ? true
            : undefined;
        });

        buildB = startBuild('B', buildBActivities(b.activities), bundleB, queues);
        await makeCurrent('B', queues);
        bIsCurrent = true;
        // Everything scheduled from here on goes to B; the update in flight ends on A.
        const inFlight = heldIteration;

        // A workflow task that fails is retried forever: report the first one instead of a timeout.
        let finished = false;
        const failedTask = waitFor(
          'the campaign to finish or a workflow task to fail',
          async () => {
            if (finished) return null;
            const { events: sofar } = await handle.fetchHistory();
            return sofar?.find((e) => e.workflowTaskFailedEventAttributes);
          },
          110_000,
          1000,
        ).then((e) => {
          if (e)
            throw new Error(`workflow task failed: ${JSON.stringify(e.workflowTaskFailedEventAttributes)}`);
        });
        const result = await Promise.race([handle.result(), failedTask.then(() => never)]).finally(() => {
          finished = true;
        });
        await failedTask;
        assert.equal(result.status, 'completed');
        assert.equal(result.committedIteration, iterations);

        const { events } = await handle.fetchHistory();
        const failedTasks = events!.filter((e) => e.workflowTaskFailedEventAttributes);
        assert.deepEqual(failedTasks, [], 'no workflow task failed');
        const builds = events!
          .flatMap((e) => e.workflowTaskCompletedEventAttributes ?? [])
          .map((a) => a.deploymentVersion?.buildId);
        const firstB = builds.indexOf('B');
        assert.ok(firstB > 0 && builds[0] === 'A', `workflow tasks ran on A, then B: ${builds.join(' ')}`);
        assert.ok(
          builds.slice(firstB).every((id) => id === 'B'),
          `no workflow task on A after B took over: ${builds.join(' ')}`,
        );
        const markers = events!.filter((e) => e.markerRecordedEventAttributes);
        const markerData = markers.flatMap((e) =>
          Object.values(e.markerRecordedEventAttributes?.details ?? {}).flatMap((p) =>
            (p.payloads ?? []).map((x) => Buffer.from(x.data ?? []).toString('utf8')),
          ),
        );
        assert.equal(markers.length, 1, 'B recorded its patch marker once');
        assert.ok(
          markerData.some((d) => d.includes(buildBPatch)),
          `the marker is B's patch: ${markerData.join(' ')}`,
        );
        const activityWorkers = events!.flatMap((e) => e.activityTaskStartedEventAttributes?.identity ?? []);
        assert.match(
          activityWorkers.at(-1) ?? '',
          new RegExp(` ${deploymentName}:B$`),
          'the last activity ran on B',
        );

        // A's activities ran the first iterations, B's (with its changed reward) the rest.
        const maxIteration = (calls: { iteration: number }[]) => Math.max(...calls.map((c) => c.iteration));
        assert.equal(maxIteration(a.calls), inFlight, 'A ran nothing scheduled after B became current');
        assert.ok(
          b.calls.some((c) => c.activity === 'commitCheckpoint' && c.iteration === inFlight),
          "the in-flight iteration's commit ran on B",
        );
        const onB = new Set(b.calls.map((c) => c.iteration));
        for (let i = inFlight + 1; i <= iterations; i++) assert.ok(onB.has(i), `iteration ${i} ran on B`);
        const state = await handle.query<CampaignState>('status');
        const rewards = new Map(state.recentIterations.map((r) => [r.iteration, r.meanReward]));
        assert.equal(rewards.get(1), 0.2, "iteration 1's reward came from A's activity");
        assert.equal(rewards.get(iterations), buildBMeanReward, "the last reward came from B's activity");

        // B's workflow change: the memo written under the patch, and the CLI's build column.
        const description = await handle.describe();
        assert.deepEqual((description.memo as { lastCommit?: unknown }).lastCommit, {
          build: 'B',
          iteration: iterations,
        });
        assert.equal(
          campaignBuild(description.raw.workflowExecutionInfo?.versioningInfo),
          `${deploymentName}:B`,
        );
        assert.match(
          statusText(state, description),
          new RegExp(`build +${deploymentName}:B \\(auto-upgrade\\)`),
        );
        const listed = await waitFor('the campaign listed on build B', async () => {
          for await (const info of t.client.workflow.list({ query: `WorkflowId = '${handle.workflowId}'` })) {
            const entry = listEntry(info);
            if (entry.build === `${deploymentName}:B`) return entry;
          }
          return undefined;
        });
        assert.equal(listed.status, 'completed');

        // The mixed history replays on B's code: the patch keeps A's part deterministic.
        await Worker.runReplayHistory({ workflowBundle: bundleB }, { events, workflowId: handle.workflowId });

        const callsOnA = a.calls.length;
        await waitFor(
          'build A drained',
          async () => {
            const info = await describeVersion('A');
            const drainage = info.workerDeploymentVersionInfo?.drainageInfo?.status;
            return drainage === drained ? true : undefined;
          },
          30_000,
          250,
        );
        await buildA.stop();
        assert.equal(a.calls.length, callsOnA, 'A got no task while draining');
      } finally {
        await Promise.allSettled([buildA.stop(), buildB?.stop()]);
      }
    },
  );
});
