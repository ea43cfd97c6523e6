// The rollout demand reader (workers/demand.ts) on a fake workflow service: which pending
// activities count and how much, paging, the spec read once per run, and servers that do not
// show an activity's task queue. Against the real server: test/integration/rollout-demand.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { defaultPayloadConverter } from '@temporalio/common';
import { rolloutDemandReader, type DemandService } from '../../workers/demand.js';

const queues = { control: 'p-control', rollout: 'p-rollout', train: 'p-train' };

interface FakeActivity {
  type: string;
  state: number;
  queue?: string;
}

/** A fake service with these runs (id → rolloutEpWorldSize and pending activities). */
function fakeService(runs: Map<string, { ep?: number; pending: FakeActivity[] }>) {
  const calls = { list: [] as string[], describe: 0, history: 0 };
  const ids = [...runs.keys()];
  const service = {
    listWorkflowExecutions: async (req: { query?: string; nextPageToken?: Uint8Array }) => {
      calls.list.push(req.query ?? '');
      // Two pages: the first run alone, then the rest.
      const second = req.nextPageToken !== undefined;
      const page = second ? ids.slice(1) : ids.slice(0, 1);
      return {
        executions: page.map((id) => ({ execution: { workflowId: id, runId: `${id}-run` } })),
        nextPageToken: second ? new Uint8Array() : new Uint8Array([1]),
      };
    },
    describeWorkflowExecution: async (req: { execution?: { workflowId?: string } }) => {
      calls.describe++;
      const run = runs.get(req.execution!.workflowId!)!;
      return {
        pendingActivities: run.pending.map((a) => ({
          activityType: { name: a.type },
          state: a.state,
          activityOptions: a.queue === undefined ? null : { taskQueue: { name: a.queue } },
        })),
      };
    },
    getWorkflowExecutionHistory: async (req: { execution?: { workflowId?: string } }) => {
      calls.history++;
      const ep = runs.get(req.execution!.workflowId!)!.ep;
      const spec = ep === undefined ? {} : { rolloutEpWorldSize: ep };
      return {
        history: {
          events: [
            {
              workflowExecutionStartedEventAttributes: {
                input: { payloads: [defaultPayloadConverter.toPayload({ spec })] },
              },
            },
          ],
        },
      };
    },
  };
  return { service: service as unknown as DemandService, calls };
}

describe('rollout demand reader (fake workflow service)', () => {
  it('counts shards scheduled, started or being cancelled × EP size, other rollout activities once', async () => {
    const { service, calls } = fakeService(
      new Map([
        [
          'a',
          {
            ep: 4,
            pending: [
              { type: 'rolloutShard', state: 1, queue: 'p-rollout' },
              { type: 'rolloutShard', state: 2, queue: 'p-rollout' },
              { type: 'rolloutShard', state: 3, queue: 'p-rollout' },
              { type: 'rolloutShard', state: 4, queue: 'p-rollout' }, // paused: not counted
              { type: 'updatePolicy', state: 2, queue: 'p-train' },
            ],
          },
        ],
        ['b', { ep: 2, pending: [{ type: 'computeRewards', state: 2, queue: 'p-rollout' }] }],
        // Started before the field existed: one rank per shard. A server that does not show
        // task queues: the activity's type says where it runs.
        [
          'c',
          {
            pending: [
              { type: 'rolloutShard', state: 2 },
              { type: 'updatePolicy', state: 2 },
            ],
          },
        ],
      ]),
    );
    const read = rolloutDemandReader(service, 'ns', queues);
    assert.equal(await read(), 3 * 4 + 1 + 1);
    assert.equal(calls.list.length, 2, 'both pages');
    assert.match(calls.list[0]!, /TaskQueue = 'p-control'/, 'this installation only');
    assert.equal(calls.history, 2, 'the spec of the runs with shards');
    assert.equal(await read(), 14);
    assert.equal(calls.history, 2, 'read once per run');
    assert.equal(calls.describe, 6);
  });

  it('a failed call fails the read (the tracker keeps the last value)', async () => {
    const { service } = fakeService(new Map([['a', { pending: [] }]]));
    (service as { describeWorkflowExecution: unknown }).describeWorkflowExecution = async () => {
      throw new Error('unavailable');
    };
    await assert.rejects(rolloutDemandReader(service, 'ns', queues)(), /unavailable/);
  });
});
