// `moerl watch` against campaigns started with `moerl start` on the real dev server, run by the
// real campaign workflow with recording test activities: in a pseudo-terminal (tmux) it draws
// the live line and exits 0 when the campaign completes; with --json it streams one object per
// change, shows a pause with its reason and a retried shard's attempt, and keeps watching;
// a cancelled campaign exits 3 and an unknown id is a one-line error.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, it } from 'node:test';
import { main } from '../../cli/main.js';
import type { ProgressSnapshot } from '../../cli/progress.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import { waitFor, withWorkers } from '../support/campaign-harness.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

const run = promisify(execFile);
const bin = join(repoRoot(), 'bin', 'moerl.js');
const retried = 'injected spot reclaim';

describe('moerl watch on the dev server', { timeout: 90_000 }, () => {
  let t: TestEnvironment;
  let dir: string;
  const prefix = `watch-${randomUUID().slice(0, 8)}-`;
  const name = `watch-${randomUUID().slice(0, 6)}`;
  const queues = { control: `${prefix}control`, rollout: `${prefix}rollout`, train: `${prefix}train` };
  // Shard 1 of iteration 2 of the JSON test's campaign fails twice: its retries wait 1 s, then 2 s.
  const recording = createRecordingTestActivities({
    delayMs: { rolloutShard: 150, computeRewards: 50, updatePolicy: 300, commitCheckpoint: 50 },
    failWhen: (c) =>
      c.campaignId.endsWith('-json') &&
      c.activity === 'rolloutShard' &&
      c.iteration === 2 &&
      c.shard === 1 &&
      c.attempt <= 2
        ? new Error(retried)
        : undefined,
  });

  async function cli(args: string[], signal?: AbortSignal) {
    let stdout = '';
    let stderr = '';
    const code = await main([...args, '--address', t.address, '--namespace', t.namespace], {
      stdout: { write: (s: string) => (stdout += s) },
      stderr: { write: (s: string) => (stderr += s) },
      env: { MOERL_TASK_QUEUE_PREFIX: prefix },
      ...(signal ? { signal } : {}),
    });
    return { code, stdout, stderr };
  }

  /** Starts a campaign of `iterations` with `moerl start`. */
  async function start(id: string, iterations: number): Promise<void> {
    const spec = join(dir, `${id}.yaml`);
    writeFileSync(
      spec,
      [
        `name: ${name}`,
        'task: { builtin: add }',
        'model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 }',
        `iterations: ${iterations}`,
        'promptsPerIteration: 4',
        'groupSize: 2',
        'rolloutShards: 2',
        'chunkSize: 2',
        'epWorldSize: 2',
        'seed: 5',
        'orchestration: { continueAsNewEvery: 3, rolloutHeartbeatSeconds: 5, updateHeartbeatSeconds: 5 }',
      ].join('\n'),
    );
    const r = await cli(['start', spec, '--id', id]);
    assert.equal(r.code, 0, r.stderr);
  }

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-watch-test-'));
    t = await startTestEnvironment();
  });

  after(async () => {
    await t?.teardown();
    rmSync(dir, { recursive: true, force: true });
  });

  it('in a terminal (tmux): the live line while it runs, exit 0 when the campaign completes', () =>
    withWorkers(
      t.nativeConnection,
      t.namespace,
      recording.activities,
      async () => {
        const id = `${name}-tty`;
        await start(id, 6);
        // A tmux server of our own (its own socket), so nothing else's sessions are touched.
        // The pane stays after the command exits (remain-on-exit), so its last screen can be read.
        const config = join(dir, 'tmux.conf');
        writeFileSync(config, 'set -g remain-on-exit on\n');
        const tmux = (...args: string[]) =>
          run('tmux', ['-L', `moerl-${id}`, '-f', config, ...args], { cwd: dir });
        const exitFile = join(dir, 'exit-code');
        const command = [
          process.execPath,
          bin,
          'watch',
          id,
          '--interval',
          '0.2',
          '--address',
          t.address,
          '--namespace',
          t.namespace,
        ].join(' ');
        await tmux(
          'new-session',
          '-d',
          '-s',
          'watch',
          '-x',
          '200',
          '-y',
          '40',
          `${command}; echo $? > ${exitFile}`,
        );
        try {
          const screen = async () => (await tmux('capture-pane', '-p', '-t', 'watch')).stdout;
          // The live line: bar, committed of 6, a stage in flight, reward and tok/s, then an ETA.
          const live = await waitFor(
            'the live line with an ETA',
            async () => {
              const s = await screen();
              return /\[[#.]{24}\] \d\/6 {2}(rollout|reward|update|checkpoint) \d.* {2}reward 0\.\d{3} {2}2000 tok\/s {2}ETA /.test(
                s,
              )
                ? s
                : undefined;
            },
            60_000,
            100,
          );
          assert.doesNotMatch(live, /campaign .* completed/, 'seen while the campaign runs');
          const code = await waitFor(
            'watch to exit',
            async () => (existsSync(exitFile) ? readFileSync(exitFile, 'utf8').trim() : undefined),
            60_000,
          );
          const final = await screen();
          assert.equal(code, '0', final);
          assert.match(final, /^\[#{24}\] iteration {3}6\/6 {2}reward 0\.400 {2}rollout 2000 tok\/s/m);
          assert.match(
            final,
            new RegExp(
              `^campaign ${id} completed \\(6 iterations committed, mean reward 0\\.400 at iteration 6\\)$`,
              'm',
            ),
          );
        } finally {
          await tmux('kill-server').catch(() => undefined);
        }
      },
      queues,
    ));

  it('--json: one object per change; a pause with its reason and a retried attempt; watching goes on', () =>
    withWorkers(
      t.nativeConnection,
      t.namespace,
      recording.activities,
      async () => {
        const id = `${name}-json`;
        await start(id, 4);
        const watching = cli(['watch', id, '--json', '--interval', '0.1']);
        await waitFor('iteration 2 rolling out', async () => {
          const r = await cli(['status', id, '--json']);
          const s = JSON.parse(r.stdout).state as { committedIteration: number };
          return s.committedIteration >= 1 ? true : undefined;
        });
        assert.equal((await cli(['pause', id, '--reason', 'look at rollouts'])).code, 0);
        await waitFor('paused', async () =>
          JSON.parse((await cli(['status', id, '--json'])).stdout).state.status === 'paused'
            ? true
            : undefined,
        );
        await new Promise((r) => setTimeout(r, 500)); // watch sees the pause and goes on
        assert.equal((await cli(['resume', id])).code, 0);
        const r = await watching;
        assert.equal(r.code, 0, r.stderr);
        const snapshots = r.stdout
          .trimEnd()
          .split('\n')
          .map((l) => JSON.parse(l) as ProgressSnapshot);
        assert.ok(snapshots.length >= 4, `${snapshots.length} changes`);
        for (let i = 1; i < snapshots.length; i++)
          assert.notDeepEqual(snapshots[i], snapshots[i - 1], 'each object is a change');
        assert.ok(
          snapshots.some(
            (s) => s.status === 'paused' && s.pauseReason === 'look at rollouts' && s.inFlight.length === 0,
          ),
          'the pause and its reason',
        );
        const attempt = snapshots
          .flatMap((s) => s.inFlight)
          .find((f) => f.stage === 'rollout' && f.attempt >= 2);
        assert.ok(attempt, 'the retried shard: attempt 2 or 3');
        assert.equal(attempt.iteration, 2);
        assert.match(attempt.lastFailure ?? '', new RegExp(retried));
        assert.ok(snapshots.some((s) => s.etaSeconds !== null && s.etaSeconds > 0));
        const last = snapshots.at(-1)!;
        assert.equal(last.execution, 'completed');
        assert.equal(last.status, 'completed');
        assert.equal(last.committedIteration, 4);
        assert.equal(last.totalIterations, 4);
      },
      queues,
    ));

  it('a cancelled campaign exits 3; an unknown id is a one-line error, exit 1', () =>
    withWorkers(
      t.nativeConnection,
      t.namespace,
      recording.activities,
      async () => {
        const id = `${name}-cancel`;
        await start(id, 50);
        const watching = cli(['watch', id, '--interval', '0.2']);
        await waitFor('a committed iteration', async () =>
          JSON.parse((await cli(['status', id, '--json'])).stdout).state.committedIteration >= 1
            ? true
            : undefined,
        );
        // The client's cancel, not `moerl cancel`: its --wait-seconds timer (60 s) is not cleared
        // when the campaign stops, and would keep this test process alive a minute longer.
        await t.client.workflow.getHandle(id).cancel();
        const r = await watching;
        assert.equal(r.code, 3, r.stderr);
        assert.match(r.stdout, new RegExp(`^campaign ${id} cancelled: .* \\(\\d+ iterations committed`, 'm'));

        const missing = await cli(['watch', `${name}-nope`]);
        assert.equal(missing.code, 1);
        assert.equal(missing.stdout, '');
        assert.equal(missing.stderr, `moerl: campaign "${name}-nope" not found in namespace "default"\n`);
        const bad = await cli(['watch', id, '--interval', '0']);
        assert.equal(bad.code, 2);
        assert.match(bad.stderr, /--interval: got "0"/);
      },
      queues,
    ));
});
