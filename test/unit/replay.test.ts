// Replays recorded campaign histories (test/histories/*.json) through the current workflow
// code. A change that would break running campaigns on deploy fails here. Refresh the
// histories with MOERL_RECORD_HISTORIES=1 when a change is meant to be incompatible (and
// version it with patched() instead if campaigns may be running).
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

describe('replay of recorded campaign histories', () => {
  test('there are recorded histories to replay', () => {
    assert.ok(histories.length >= 3, `found ${histories.length}`);
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
