// Item 4 of the long-campaign correctness work: a reward model that answers 2xx with a malformed
// body must pause the campaign with the reason, not be retried forever. A real campaign (the
// shipped activities, native rollouts on 2 EP ranks, the dev server) scores with a node:http
// server on 127.0.0.1; once the server is fixed, `resume` finishes the campaign.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { createActivities } from '../../activities/index.js';
import { workerActivityDeps } from '../../activities/deps.js';
import { rewardModelProtocolErrorType } from '../../activities/rewards/errors.js';
import { resumeSignal } from '../../workflows/messages.js';
import { startCampaign, tinyRealSpec, waitForState, withWorkers } from '../support/campaign-harness.js';
import { nativeTools } from '../support/native-tools.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

const { skip } = nativeTools(['moe_train', 'moe_generate']);

describe('a reward model that breaks the protocol', { skip }, () => {
  let t: TestEnvironment;
  let dir: string;
  let server: Server;
  let url: string;
  let malformed = true;
  let requests = 0;

  before(async () => {
    t = await startTestEnvironment();
    dir = mkdtempSync(join(tmpdir(), 'moerl-reward-pause-'));
    server = createServer((req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        requests++;
        res.writeHead(200, { 'content-type': 'application/json' });
        if (malformed) return res.end('<html>\u001b[2Jmaintenance</html>');
        const samples = (JSON.parse(body) as { samples: unknown[] }).samples;
        res.end(JSON.stringify({ rewards: samples.map(() => 1) }));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/score`;
  });
  after(async () => {
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await t?.teardown();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('item 4: a 2xx with a malformed body pauses the campaign with the reason, not retried forever', async () => {
    const deps = workerActivityDeps(new AbortController().signal, {
      ...process.env,
      MOERL_CACHE_DIR: join(dir, 'cache'),
    });
    const spec = tinyRealSpec('reward-protocol', dir, { reward: { kind: 'http', url, maxRetries: 3 } });
    await withWorkers(t.nativeConnection, t.namespace, createActivities(deps), async (queues) => {
      const handle = await startCampaign(t.client, spec, queues);
      const paused = await waitForState(
        handle,
        'the campaign to pause',
        (s) => s.status === 'paused',
        120_000,
      );
      const f = paused.lastFailure;
      assert.ok(f, 'the failure is recorded');
      assert.equal(f.stage, 'reward');
      assert.equal(f.iteration, 1);
      assert.equal(f.type, rewardModelProtocolErrorType);
      assert.equal(f.nonRetryable, true);
      assert.match(f.message, /^reward model http:\/\/127\.0\.0\.1:\d+\/score: batch 1 of \d+: /);
      assert.match(f.message, /response is not JSON: <html> \[2Jmaintenance<\/html> \(1 attempt; /);
      assert.equal(paused.pauseReason, `reward of iteration 1 failed: ${f.message}`);
      assert.equal(paused.retries.reward, 1, 'one failed try of the stage, no activity retries');
      // Paused means paused: neither the client nor Temporal asks the server again meanwhile.
      const asked = requests;
      assert.equal(asked, 1);
      await new Promise((r) => setTimeout(r, 2500));
      assert.equal(requests, asked, 'no retry while paused');

      malformed = false;
      await handle.signal(resumeSignal, {});
      const result = await handle.result();
      assert.equal(result.committedIteration, 1);
      const done = await waitForState(handle, 'completed', (s) => s.status === 'completed');
      assert.equal(done.recentIterations[0]?.meanReward, 1, 'rewards come from the fixed server');
    });
  });
});
