// Replays recorded campaign histories (test/histories/*.json) through the current workflow
// code. A change that would break running campaigns on deploy fails here. Histories are never
// rewritten: a change of behaviour goes behind patched() so the old histories still replay, and
// new paths are recorded as new files with MOERL_RECORD_HISTORIES=1 (docs/development.md).
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { DeterminismViolationError } from '@temporalio/workflow';
import { bundleWorkflowCode, Worker } from '@temporalio/worker';
import { workflowBundle } from '../support/campaign-harness.js';

const historiesDir = fileURLToPath(new URL('../../../test/histories/', import.meta.url));
const histories = readdirSync(historiesDir)
  .filter((f) => f.endsWith('.json'))
  .map((f) => ({
    workflowId: f.replace(/\.json$/, ''),
    history: JSON.parse(readFileSync(historiesDir + f, 'utf8')),
  }));

/** The workflow input as history JSON holds it: base64 payload data. */
type StartedJSON = { input?: { payloads?: { data?: string }[] } };

describe('replay of recorded campaign histories', () => {
  test('there are recorded histories to replay', () => {
    assert.ok(histories.length >= 3, `found ${histories.length}`);
  });

  test('the histories cover stage failure, retries, continue-as-new carrying a rollout, cancellation', () => {
    type Event = { eventType?: string; activityTaskStartedEventAttributes?: { attempt?: number } };
    const has = (what: string, found: (events: Event[]) => boolean) =>
      assert.ok(
        histories.some(({ history }) => found(history.events as Event[])),
        `no recorded history has ${what}`,
      );
    const type = (t: string) => (events: Event[]) => events.some((e) => e.eventType === `EVENT_TYPE_${t}`);
    has('a stage that failed for good', type('ACTIVITY_TASK_FAILED'));
    has('a retried activity', (events) =>
      events.some((e) => (e.activityTaskStartedEventAttributes?.attempt ?? 1) > 1),
    );
    has('a continue-as-new', type('WORKFLOW_EXECUTION_CONTINUED_AS_NEW'));
    has('a run starting with a carried rollout', (events) => {
      const started = (events[0] as { workflowExecutionStartedEventAttributes?: StartedJSON })
        .workflowExecutionStartedEventAttributes;
      const input = started?.input?.payloads?.[0]?.data;
      return input !== undefined && JSON.parse(Buffer.from(input, 'base64').toString()).state?.carriedRollout;
    });
    has('a cancellation', type('WORKFLOW_EXECUTION_CANCELED'));
  });

  test('the current workflow code replays every recorded history', async () => {
    const bundle = await workflowBundle();
    for (const { workflowId, history } of histories) {
      await assert.doesNotReject(
        Worker.runReplayHistory({ workflowBundle: bundle }, history, workflowId),
        workflowId,
      );
    }
  });

  test('a non-deterministic change is caught', async () => {
    const noop = () => undefined;
    const altered = await bundleWorkflowCode({
      workflowsPath: fileURLToPath(new URL('../fixtures/altered-campaign.js', import.meta.url)),
      logger: { log: noop, trace: noop, debug: noop, info: noop, warn: noop, error: noop },
    });
    for (const { workflowId, history } of histories) {
      await assert.rejects(
        Worker.runReplayHistory({ workflowBundle: altered }, history, workflowId),
        DeterminismViolationError,
        workflowId,
      );
    }
  });
});
