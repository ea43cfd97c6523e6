// The `moerl` CLI against the real Temporal dev server: every command runs through `main` (and
// the `bin/moerl.js` shim as a subprocess) on campaigns executed by the real campaign workflow
// with recording test activities, slowed down so that the campaigns are running while the
// commands act on them.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { bundleWorkflowCode } from '@temporalio/worker';
import type { PrepareInput } from '../../activities/types.js';
import { freePort } from '../../cli/dev-server.js';
import { commands, main } from '../../cli/main.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import { runWorkers, workflowsPath } from '../../workers/worker.js';
import type { CampaignState, HyperparameterChange } from '../../workflows/types.js';
import { createRecordingTestActivities } from '../support/recording-activities.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';
import type { CampaignHistory } from '../../cli/history.js';

const root = repoRoot();
const bin = join(root, 'bin', 'moerl.js');
const spotFailure = 'injected spot reclaim';

interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** One line on stderr starting with "moerl: ", nothing on stdout. */
function assertOneLineError(r: CliResult, code: number, pattern: RegExp): void {
  assert.equal(r.code, code, `exit code; stderr: ${r.stderr}`);
  assert.equal(r.stdout, '');
  assert.match(r.stderr, /^moerl: [^\n]*\n$/, 'a single line');
  assert.match(r.stderr, pattern);
  assert.doesNotMatch(r.stderr, /\bat .*\.js:\d+/, 'no stack trace');
}

const commandNames = commands.map((c) => c.name);
/** Runs `bin/moerl.js` with `args` as a process of its own. */
function cliProcess(...args: string[]): Promise<CliResult> {
  return new Promise<CliResult>((resolve, reject) => {
    const child = spawn(process.execPath, [bin, ...args], { cwd: root });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code: code ?? -1, stdout, stderr }));
  });
}

describe('moerl CLI on the dev server', () => {
  let t: TestEnvironment;
  let dir: string;
  let specFile: string;
  const prefix = `cli-${randomUUID().slice(0, 8)}-`;
  const name = `cli-${randomUUID().slice(0, 6)}`;
  const mainId = `${name}-main`;
  const stopWorkers = new AbortController();
  let workers: Promise<void> | undefined;
  // The main campaign loses shard 1 of iteration 1 once, as a reclaimed Spot worker would.
  const recording = createRecordingTestActivities({
    delayMs: { rolloutShard: 200, computeRewards: 100, updatePolicy: 1500, commitCheckpoint: 100 },
    failWhen: (c) =>
      c.campaignId === mainId &&
      c.activity === 'rolloutShard' &&
      c.iteration === 1 &&
      c.shard === 1 &&
      c.attempt === 1
        ? new Error(spotFailure)
        : undefined,
  });

  /** Runs the CLI in-process against the test server. */
  async function cli(...args: string[]): Promise<CliResult> {
    let stdout = '';
    let stderr = '';
    const code = await main([...args, '--address', t.address, '--namespace', t.namespace], {
      stdout: { write: (s: string) => (stdout += s) },
      stderr: { write: (s: string) => (stderr += s) },
      env: { MOERL_TASK_QUEUE_PREFIX: prefix },
    });
    return { code, stdout, stderr };
  }

  async function cliJson<T>(...args: string[]): Promise<T> {
    const r = await cli(...args, '--json');
    assert.equal(r.code, 0, `moerl ${args.join(' ')} failed: ${r.stderr}`);
    return JSON.parse(r.stdout) as T;
  }

  const state = async (id: string) => (await cliJson<{ state: CampaignState }>('status', id)).state;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-cli-test-'));
    specFile = join(dir, 'campaign.yaml');
    writeFileSync(
      specFile,
      [
        `name: ${name}`,
        'task: { builtin: add }',
        'model: { layers: 1, hidden: 16, heads: 2, experts: 4, topK: 2 }',
        'iterations: 40',
        'promptsPerIteration: 4',
        'groupSize: 2',
        'rolloutShards: 2',
        'chunkSize: 2',
        'epWorldSize: 2',
        'retention: { keepLast: 20 }',
        'seed: 3',
        // Continue-as-new every 2 iterations, so history and list must read across runs.
        'orchestration: { continueAsNewEvery: 2, rolloutHeartbeatSeconds: 5, updateHeartbeatSeconds: 5 }',
      ].join('\n'),
    );
    t = await startTestEnvironment();
    const noop = () => undefined;
    const logger = { log: noop, trace: noop, debug: noop, info: noop, warn: noop, error: noop };
    workers = runWorkers({
      roles: ['all'],
      connection: t.nativeConnection,
      namespace: t.namespace,
      taskQueues: { control: `${prefix}control`, rollout: `${prefix}rollout`, train: `${prefix}train` },
      activities: recording.activities,
      workflowBundle: await bundleWorkflowCode({ workflowsPath, logger }),
      shutdownGraceMs: 500,
      signal: stopWorkers.signal,
    });
  });

  after(async () => {
    stopWorkers.abort();
    await workers?.catch(() => undefined);
    await t?.teardown();
    rmSync(dir, { recursive: true, force: true });
  });

  it('bin/moerl.js --help lists every command (subprocess)', async () => {
    const r = await cliProcess('--help');
    assert.equal(r.code, 0, r.stderr);
    for (const command of commandNames) assert.match(r.stdout, new RegExp(`^  ${command} `, 'm'), command);
    assert.match(r.stdout, /--json/);
  });

  it('every command has --help', async () => {
    for (const command of commandNames) {
      const r = await cli(command, '--help');
      assert.equal(r.code, 0);
      assert.match(r.stdout, new RegExp(`^usage: moerl ${command}`), command);
    }
  });

  it('bad arguments are usage errors: one line, exit 2', async () => {
    assertOneLineError(await cli('start'), 2, /start: missing argument \(usage: moerl start <spec\.yaml>/);
    assertOneLineError(
      await cli('list', '--status', 'sleeping'),
      2,
      /--status must be one of running, pausing/,
    );
    assertOneLineError(await cli('list', '--bogus'), 2, /Unknown option '--bogus'/);
    assertOneLineError(await cli('set', 'some-id'), 2, /set: missing argument/);
    assertOneLineError(await cli('set', 'some-id', 'lr'), 2, /expected key=value/);
    assertOneLineError(await cli('fork', 'some-id'), 2, /fork needs --from-iteration N/);
    assertOneLineError(await cli('fork', 'some-id', '--from-iteration', 'x'), 2, /--from-iteration must be/);
    assertOneLineError(await cli('start', specFile, '--set', 'noequals'), 2, /--set expects key=value/);
    assertOneLineError(await cli('frobnicate'), 2, /unknown command "frobnicate"/);
  });

  it('start validates the spec file before contacting the server', async () => {
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'name: Bad Name\nseed: -1\n');
    const r = await cli('start', bad);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^moerl: .*bad\.yaml is invalid:\n/);
    assert.match(r.stderr, /bad\.yaml:1:1: name: got "Bad Name"/);
    assert.match(r.stderr, /seed: got -1/);
  });

  it('start: campaigns with memo, search attributes and the prefixed control queue', async () => {
    const text = await cli('start', specFile, '--id', mainId, '--set', 'hyperparameters.lr=0.002');
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`^started campaign ${mainId}\\n`));
    assert.match(text.stdout, new RegExp(`task queue  ${prefix}control`));

    const other = await cliJson<{ campaignId: string; name: string; taskQueues: { control: string } }>(
      'start',
      specFile,
      '--set',
      `name=${name}-other`,
    );
    assert.match(other.campaignId, new RegExp(`^${name}-other-[0-9a-z]{6}$`));
    assert.equal(other.taskQueues.control, `${prefix}control`);

    const description = await t.client.workflow.getHandle(mainId).describe();
    assert.equal(description.taskQueue, `${prefix}control`);
    assert.equal((description.memo?.spec as { iterations: number }).iterations, 40);
    assertOneLineError(await cli('start', specFile, '--id', mainId), 1, /already exists/);
  });

  it('status: a readable summary and the full state as JSON', async () => {
    const s = await waitFor('the first committed checkpoint', async () => {
      const st = await state(mainId);
      return st.committedIteration >= 0 ? st : undefined;
    });
    assert.equal(s.campaignId, mainId);
    assert.equal(s.hyperparameters.lr, 0.002, '--set reached the campaign');
    const r = await cli('status', mainId);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, new RegExp(`^campaign +${mainId} \\(${name}\\)`));
    assert.match(r.stdout, /^status +running/m);
    assert.match(r.stdout, /^hyperparameters +lr=0\.002/m);
    assert.match(r.stdout, /of 40, next rollout/);
  });

  it('list: filters by name and status', async () => {
    const byName = await waitFor('the campaign in visibility', async () => {
      const out = await cliJson<{ campaigns: { campaignId: string; status: string }[] }>(
        'list',
        '--name',
        name,
      );
      return out.campaigns.some((c) => c.campaignId === mainId) ? out : undefined;
    });
    assert.deepEqual(
      byName.campaigns.map((c) => c.campaignId),
      [mainId],
      'the other campaign has another name',
    );
    const running = await waitFor('both campaigns listed as running', async () => {
      const out = await cliJson<{ campaigns: { campaignId: string }[] }>('list', '--status', 'running');
      const ids = out.campaigns.map((c) => c.campaignId);
      return ids.includes(mainId) && ids.some((id) => id.startsWith(`${name}-other-`)) ? ids : undefined;
    });
    assert.ok(running.length >= 2);
    const completed = await cliJson<{ campaigns: { campaignId: string }[] }>('list', '--status', 'completed');
    assert.ok(!completed.campaigns.some((c) => c.campaignId === mainId));
    const text = await cli('list', '--name', name);
    assert.match(text.stdout, /^CAMPAIGN +NAME +STATUS +ITERATION +MEAN REWARD +CREATED +BUILD\n/);
    assert.match(text.stdout, new RegExp(`^${mainId} +${name} +running .* unversioned$`, 'm'));
  });

  it('set: an accepted change is recorded, a rejected one shows the reason', async () => {
    const accepted = await cliJson<{ change: HyperparameterChange }>(
      'set',
      mainId,
      'lr=0.0005',
      'temperature=0.9',
      '--reason',
      'cli test',
    );
    assert.deepEqual(accepted.change.changes, { lr: 0.0005, temperature: 0.9 });
    assert.equal(accepted.change.reason, 'cli test');
    assert.ok(accepted.change.iteration >= 1);
    const text = await cli('set', mainId, 'hyperparameters.clipEps=0.3');
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`^${mainId}: clipEps=0\\.3 from iteration \\d+\\n$`));

    assertOneLineError(await cli('set', mainId, 'lr=5'), 1, /rejected the change: .*lr: got 5/);
    assertOneLineError(
      await cli('set', mainId, 'learningRate=0.1'),
      1,
      /rejected the change: .*unknown field.*"learningRate"/,
    );
    const s = await state(mainId);
    assert.equal(s.hyperparameters.lr, 0.0005);
    assert.equal(s.hyperparameters.clipEps, 0.3);
    assert.equal(s.hyperparameterChanges.length, 2);
  });

  it('history: per-iteration stage times, attempts and the retried failure, rewards, changes', async () => {
    await waitFor('three committed iterations', async () =>
      (await state(mainId)).committedIteration >= 3 ? true : undefined,
    );
    const history = await cliJson<CampaignHistory>('history', mainId);
    assert.equal(history.campaignId, mainId);
    assert.ok(history.runs.length >= 2, 'the campaign continued as new after iteration 2');
    const committed = (await state(mainId)).committedIteration;
    const listed = history.iterations.map((it) => it.iteration);
    for (let i = 0; i <= committed; i++)
      assert.ok(listed.includes(i), `iteration ${i} from runs ${history.runs.join(',')}`);
    assert.ok(history.iterations.slice(0, committed + 1).every((it) => it.checkpoint !== null));
    // Memo and search attributes follow the campaign into its new runs; list shows it once.
    assert.match((await cli('status', mainId)).stdout, /of 40, next rollout/);
    const byName = await cliJson<{ campaigns: { campaignId: string }[] }>('list', '--name', name);
    assert.deepEqual(
      byName.campaigns.map((c) => c.campaignId),
      [mainId],
    );
    const [i0, i1, i2] = history.iterations;
    assert.equal(i0?.iteration, 0);
    assert.ok(
      i0?.stages.prepare && i0.stages.checkpoint,
      'iteration 0 prepares and commits the initial policy',
    );
    assert.equal(i1?.iteration, 1);
    assert.equal(i1?.stages.rollout?.attempts, 2, 'shard 1 of iteration 1 ran twice');
    assert.equal(i1?.stages.rollout?.activities, 2);
    assert.ok(
      i1?.stages.rollout?.failures.some((f) => f.includes(spotFailure) && f.startsWith('shard 1 attempt 1')),
    );
    assert.ok((i1?.stages.update?.seconds ?? 0) >= 1.5, 'update stage time covers its 1.5 s');
    assert.ok(Math.abs((i1?.meanReward ?? 0) - 0.15) < 1e-9, 'reward of iteration 1');
    assert.equal(i2?.stages.rollout?.attempts, 1);
    assert.match(i1?.checkpoint ?? '', new RegExp(`campaigns/${mainId}/checkpoints/000001`));
    assert.equal(history.hyperparameterChanges.length, 2);

    const text = await cli('history', mainId);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`^campaign ${mainId}: \\d+ iterations in \\d+ workflow runs\\n`));
    assert.match(
      text.stdout,
      /^ITER +PREPARE +ROLLOUT +REWARD +UPDATE +CHECKPOINT +ATTEMPTS +REWARD +MISMATCH KL +CHANGES$/m,
    );
    assert.match(text.stdout, /^ +1 +- +\d+\.\d+s +\d+\.\d+s +\d+\.\d+s +\d+\.\d+s +rollout 2 +0\.150/m);
    assert.match(
      text.stdout,
      new RegExp(`^failures:\\n  iteration 1 rollout shard 1 attempt 1: .*${spotFailure}`, 'm'),
    );
    assert.match(
      text.stdout,
      /^hyperparameter changes:\n {2}from iteration \d+: lr=0\.0005 temperature=0\.9 \(cli test\)/m,
    );
  });

  it('pause: pausing while a stage runs, then paused; resume: running again', async () => {
    // Pause while an update (1.5 s) is running, so the campaign must wait at the boundary.
    await waitFor('an update in flight', async () => {
      const s = await state(mainId);
      return s.activeStages.some((a) => a.stage === 'update') ? true : undefined;
    });
    const paused = await cliJson<{ status: string }>('pause', mainId, '--reason', 'inspect');
    assert.equal(paused.status, 'pausing');
    const s = await waitFor('paused', async () => {
      const st = await state(mainId);
      return st.status === 'paused' ? st : undefined;
    });
    assert.equal(s.pauseReason, 'inspect');
    assert.deepEqual(s.activeStages, []);
    const text = await cli('status', mainId);
    assert.match(text.stdout, /^status +paused: inspect$/m);
    const listed = await waitFor('paused in visibility', async () => {
      const out = await cliJson<{ campaigns: { campaignId: string }[] }>('list', '--status', 'paused');
      return out.campaigns.some((c) => c.campaignId === mainId) ? true : undefined;
    });
    assert.ok(listed);

    const resumed = await cli('resume', mainId);
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.match(resumed.stdout, new RegExp(`^${mainId} is running\\n$`));
    assert.equal((await state(mainId)).status, 'running');
  });

  it('fork --from-iteration: a new campaign starts from that committed checkpoint', async () => {
    const forkId = `${name}-fork`;
    const out = await cliJson<{ campaignId: string; forkFrom: { iteration: number; key: string } }>(
      'fork',
      mainId,
      '--from-iteration',
      '1',
      '--set',
      'iterations=3',
      '--id',
      forkId,
    );
    assert.equal(out.campaignId, forkId);
    assert.equal(out.forkFrom.iteration, 1);
    const prepare = await waitFor('the fork to prepare its policy', async () =>
      recording.calls.find((c) => c.activity === 'preparePolicy' && c.campaignId === forkId),
    );
    const source = (prepare.input as PrepareInput).source;
    assert.equal(source.kind, 'fork');
    assert.ok(source.kind === 'fork');
    assert.equal(source.checkpoint.campaignId, mainId);
    assert.equal(source.checkpoint.iteration, 1);
    assert.equal(source.checkpoint.key, `campaigns/${mainId}/checkpoints/000001`);
    const forked = await state(forkId);
    assert.deepEqual(forked.forkedFrom, { campaignId: mainId, iteration: 1 });
    const [lrChange, clipChange] = (await state(mainId)).hyperparameterChanges;
    assert.ok(lrChange && clipChange, "the set test's two changes");
    assert.equal(
      forked.hyperparameters.lr,
      lrChange.iteration <= 2 ? 0.0005 : 0.002,
      "the source spec's lr (from its --set), or the parent's set change when it applied by iteration 2",
    );

    // From a checkpoint after both changes applied, the fork trains with them, as its parent did.
    const late = await waitFor('a checkpoint after the set changes', async () => {
      const s = await state(mainId);
      return s.checkpoints.filter((c) => c.iteration + 1 >= clipChange.iteration).at(-1);
    });
    const lateId = `${name}-fork-late`;
    const forkLate = (id: string, ...sets: string[]) => [
      'fork',
      mainId,
      '--from-iteration',
      String(late.iteration),
      '--set',
      'iterations=3',
      ...sets,
      '--id',
      id,
    ];
    const lateOut = await cliJson<{ carriedChanges: HyperparameterChange[] }>(
      ...forkLate(lateId, '--set', 'hyperparameters.temperature=0.8'),
    );
    assert.equal(lateOut.carriedChanges.length, 2);
    const lateState = await state(lateId);
    assert.equal(lateState.hyperparameters.lr, 0.0005, "the parent's set lr");
    assert.equal(lateState.hyperparameters.clipEps, 0.3, "the parent's set clipEps");
    assert.equal(lateState.hyperparameters.temperature, 0.8, '--set wins over the carried change');
    const lateText = await cli(...forkLate(`${lateId}-text`));
    assert.equal(lateText.code, 0, lateText.stderr);
    assert.match(
      lateText.stdout,
      new RegExp(
        `^  carries ${mainId}'s set changes: lr=0\\.0005 temperature=0\\.9 \\(from iteration \\d+\\); clipEps=0\\.3`,
        'm',
      ),
    );

    assertOneLineError(
      await cli('fork', mainId, '--from-iteration', '999'),
      1,
      /does not retain a committed checkpoint of iteration 999 \(retained: 0, 1, /,
    );
  });

  it(
    'cancel (subprocess): stops the campaign, reports its latest committed checkpoint and exits without waiting out --wait-seconds',
    { timeout: 120_000 },
    async () => {
      // A wait timer left running kept the process alive for the whole --wait-seconds.
      const r = await cliProcess(
        ...['cancel', mainId, '--wait-seconds', '600', '--json'],
        ...['--address', t.address, '--namespace', t.namespace],
      );
      assert.equal(r.code, 0, r.stderr);
      const out = JSON.parse(r.stdout) as {
        status: string;
        latestCheckpoint: { iteration: number; key: string } | null;
      };
      assert.equal(out.status, 'cancelled');
      const committed = recording.calls.filter(
        (c) => c.campaignId === mainId && c.activity === 'commitCheckpoint' && c.outcome === 'ok',
      );
      const last = Math.max(...committed.map((c) => c.iteration));
      assert.ok(last >= 2);
      assert.equal(out.latestCheckpoint?.iteration, last);
      assert.equal(
        out.latestCheckpoint?.key,
        `campaigns/${mainId}/checkpoints/${String(last).padStart(6, '0')}`,
      );
      assertOneLineError(await cli('cancel', mainId), 1, /is cancelled; there is nothing to cancel/);
      assertOneLineError(await cli('pause', mainId), 1, /is cancelled; there is nothing to pause/);
      const listed = await waitFor('cancelled in visibility', async () => {
        const list = await cliJson<{ campaigns: { campaignId: string }[] }>('list', '--status', 'cancelled');
        return list.campaigns.some((c) => c.campaignId === mainId) ? true : undefined;
      });
      assert.ok(listed);

      const others = (
        await cliJson<{ campaigns: { campaignId: string }[] }>('list', '--status', 'running')
      ).campaigns
        .map((c) => c.campaignId)
        .filter((id) => id.startsWith(`${name}-`));
      for (const id of others) {
        const text = await cli('cancel', id);
        // The short fork may complete between the list and the cancel.
        if (text.code === 1 && /is completed; there is nothing to cancel/.test(text.stderr)) continue;
        assert.equal(text.code, 0, text.stderr);
        assert.match(
          text.stdout,
          new RegExp(`^${id} is (cancelled|completed)\\nlatest committed checkpoint: iteration \\d+ at `),
        );
      }
    },
  );

  it('an unknown campaign is a one-line error', async () => {
    for (const command of ['status', 'history', 'pause', 'resume', 'cancel'])
      assertOneLineError(
        await cli(command, 'no-such-campaign'),
        1,
        /campaign "no-such-campaign" not found in namespace/,
      );
    assertOneLineError(await cli('set', 'no-such-campaign', 'lr=0.1'), 1, /not found/);
    assertOneLineError(await cli('fork', 'no-such-campaign', '--from-iteration', '1'), 1, /not found/);
  });

  it('an unreachable server is a one-line error', async () => {
    const port = await freePort();
    let stderr = '';
    const code = await main(['list', '--address', `127.0.0.1:${port}`], {
      stdout: { write: () => true },
      stderr: { write: (s: string) => (stderr += s) },
      env: {},
    });
    assertOneLineError(
      { code, stdout: '', stderr },
      1,
      new RegExp(`cannot reach Temporal at 127\\.0\\.0\\.1:${port}`),
    );
  });

  it('dev: server and worker in one process tree, serving metrics as a cluster worker does, stopped cleanly by SIGTERM', async () => {
    const stateDir = join(dir, 'dev');
    const port = await freePort();
    const sdkMetricsPort = await freePort();
    const child = spawn(
      process.execPath,
      [
        bin,
        'dev',
        '--state-dir',
        stateDir,
        '--port',
        String(port),
        '--ui-port',
        String(await freePort()),
        '--metrics-port',
        '0',
        '--sdk-metrics-port',
        String(sdkMetricsPort),
        '--json',
      ],
      {
        cwd: root,
        env: {
          ...process.env,
          MOERL_TASK_QUEUE_PREFIX: `${prefix}dev-`,
          MOERL_CACHE_DIR: join(dir, 'dev-cache'),
        },
      },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      const ready = await waitFor('moerl dev to be ready', async () => {
        if (child.exitCode !== null) throw new Error(`moerl dev exited early: ${stderr}`);
        try {
          return JSON.parse(stdout) as { address: string; uiUrl: string; metricsUrl: string };
        } catch {
          return undefined;
        }
      });
      assert.equal(ready.address, `127.0.0.1:${port}`);
      assert.match(ready.uiUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
      assert.ok(existsSync(join(stateDir, 'temporal.db')));

      // The shipped activities train for real: a shrunken demo campaign runs to completion.
      const run = (...args: string[]) =>
        main([...args, '--address', ready.address, '--json'], {
          stdout: { write: (s: string) => (out += s) },
          stderr: { write: () => true },
          env: { MOERL_TASK_QUEUE_PREFIX: `${prefix}dev-` },
        });
      let out = '';
      const shrink = [
        'iterations=1',
        'model={"layers": 1, "hidden": 32, "heads": 2, "experts": 4, "topK": 2}',
        'promptsPerIteration=4',
        'groupSize=4',
        'chunkSize=2',
        'sftWarmStartSteps=0',
        `store.path=${join(dir, 'dev-store')}`,
      ].flatMap((s) => ['--set', s]);
      const demo = join(root, 'examples', 'demo.yaml');
      assert.equal(await run('start', demo, ...shrink, '--id', `${name}-dev`), 0);
      const done = await waitFor(
        'the campaign to complete',
        async () => {
          out = '';
          assert.equal(await run('status', `${name}-dev`), 0);
          const s = (JSON.parse(out) as { state: CampaignState }).state;
          assert.notEqual(s.status, 'paused', `the campaign paused: ${s.pauseReason}`);
          return s.status === 'completed' ? s : undefined;
        },
        120_000,
      );
      assert.equal(done.latestCheckpoint?.iteration, 1);

      // The metrics of the worker program (docs/metrics.md): what this campaign ran, its status.
      assert.match(ready.metricsUrl, /^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
      const scrape = await (await fetch(ready.metricsUrl)).text();
      const sample = (series: string) =>
        Number(
          scrape
            .split('\n')
            .find((l) => l.startsWith(`${series} `))
            ?.slice(series.length + 1),
        );
      assert.equal(sample('moerl_activity_attempts_total{stage="update"}'), 1, scrape);
      assert.equal(sample('moerl_rollout_samples_total'), 16, "the campaign's 4 prompts × 4 samples");
      assert.equal(sample(`moerl_campaign_iteration{campaign="${name}-dev"}`), 1);
      assert.equal(sample(`moerl_campaign_status{campaign="${name}-dev",status="completed"}`), 1);
      // Its control role reads the rollout fleet's demand (docs/metrics.md, "Rollout demand").
      assert.ok(sample('moerl_rollout_demand_read_timestamp_seconds') > 0, 'the demand was read');
      assert.ok(Number.isInteger(sample('moerl_rollout_ranks_wanted')));
      const sdk = await (await fetch(`http://127.0.0.1:${sdkMetricsPort}/metrics`)).text();
      assert.match(sdk, /^temporal_activity_execution_latency_seconds_count\{/m, "the SDK's metrics");
    } finally {
      child.kill('SIGTERM');
    }
    assert.equal(await exited, 0, stderr);
    assert.match(stderr, /SIGTERM, stopping the worker, then the server/);
    assert.match(stderr, /moerl dev: stopped/);
    const after = await main(['list', '--address', `127.0.0.1:${port}`], {
      stdout: { write: () => true },
      stderr: { write: () => true },
      env: {},
    });
    assert.equal(after, 1, 'the dev server is gone');
  });
});
