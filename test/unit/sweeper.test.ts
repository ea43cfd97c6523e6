// The control worker's sweep of trainer Jobs: its settings, and which campaigns count as ended
// (the Temporal answers are fakes; the sweep itself runs against a real API server in
// test/k8s/orphans.test.ts).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { campaignEndedFrom, sweepSettingsFromEnv } from '../../workers/sweeper.js';

describe('trainer Job sweep', () => {
  test('off without namespaces; every 300 s by default; a bad interval names the setting', () => {
    assert.deepEqual(sweepSettingsFromEnv({}), { namespaces: [], intervalMs: 300_000 });
    assert.deepEqual(
      sweepSettingsFromEnv({
        MOERL_SWEEP_NAMESPACES: 'moerl, trainers,',
        MOERL_SWEEP_INTERVAL_SECONDS: '60',
      }),
      { namespaces: ['moerl', 'trainers'], intervalMs: 60_000 },
    );
    for (const bad of ['0', '1.5', 'soon'])
      assert.throws(
        () => sweepSettingsFromEnv({ MOERL_SWEEP_INTERVAL_SECONDS: bad }),
        new RegExp(`MOERL_SWEEP_INTERVAL_SECONDS must be whole seconds from 1 to 86400, got "${bad}"`),
      );
  });

  test('a campaign has ended when its workflow is closed or unknown; other errors propagate', async () => {
    const answers: Record<string, () => Promise<{ workflowExecutionInfo?: { status?: number } }>> = {
      running: () => Promise.resolve({ workflowExecutionInfo: { status: 1 } }),
      completed: () => Promise.resolve({ workflowExecutionInfo: { status: 2 } }),
      cancelled: () => Promise.resolve({ workflowExecutionInfo: { status: 4 } }),
      gone: () => Promise.reject(Object.assign(new Error('not found'), { code: 5 })),
      down: () => Promise.reject(Object.assign(new Error('unavailable'), { code: 14 })),
    };
    const ended = campaignEndedFrom((id) => answers[id]!());
    assert.equal(await ended('running'), false);
    assert.equal(await ended('completed'), true);
    assert.equal(await ended('cancelled'), true);
    assert.equal(await ended('gone'), true);
    await assert.rejects(ended('down'), /unavailable/);
  });
});
