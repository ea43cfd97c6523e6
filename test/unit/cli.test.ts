// The CLI without a server: help, usage errors and exit codes, spec commands, the visibility
// query, hyperparameter arguments, output helpers, and folding history events per iteration.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { defaultPayloadConverter } from '@temporalio/common';
import { listQuery } from '../../cli/commands/list.js';
import { parseHyperparameterArgs } from '../../cli/commands/set.js';
import { UsageError } from '../../cli/errors.js';
import { oneLine, seconds, table } from '../../cli/format.js';
import { iterationsFrom, readRunEvents, type HistoryEvent } from '../../cli/history.js';
import { commands, main } from '../../cli/main.js';
import { repoRoot } from '../../cli/temporal-tools.js';

async function run(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await main(argv, {
    stdout: { write: (s: string) => (stdout += s) },
    stderr: { write: (s: string) => (stderr += s) },
    env: {},
  });
  return { code, stdout, stderr };
}

describe('moerl help and usage errors', () => {
  it('--help lists every command', async () => {
    const r = await run('--help');
    assert.equal(r.code, 0);
    for (const c of commands)
      assert.match(r.stdout, new RegExp(`^  ${c.name} +${c.summary.slice(0, 20)}`, 'm'));
    assert.deepEqual(
      commands.map((c) => c.name),
      [
        'start',
        'list',
        'status',
        'watch',
        'pause',
        'resume',
        'set',
        'cancel',
        'history',
        'report',
        'fork',
        'export',
        'dev',
        'demo',
        'spec',
      ],
    );
  });

  it('help <command>, <command> --help and -h print the command usage', async () => {
    for (const argv of [
      ['help', 'fork'],
      ['fork', '--help'],
      ['fork', '-h'],
      ['--json', 'fork', '--help'],
    ]) {
      const r = await run(...argv);
      assert.equal(r.code, 0, argv.join(' '));
      assert.match(r.stdout, /^usage: moerl fork <campaign-id> --from-iteration N/);
      assert.match(r.stdout, /--from-iteration N/);
    }
  });

  it('no command prints help on stderr with exit 2', async () => {
    const r = await run();
    assert.equal(r.code, 2);
    assert.match(r.stderr, /^moerl — /);
  });

  it('usage errors are one line with exit 2', async () => {
    const cases: [string[], RegExp][] = [
      [['nope'], /unknown command "nope"/],
      [['help', 'nope'], /unknown command "nope"/],
      [['status'], /status: missing argument \(usage: moerl status <campaign-id>\)/],
      [['status', 'a', 'b'], /status: unexpected argument/],
      [['list', '--limit', '0'], /--limit must be a positive integer/],
      [['list', '--name', "x' OR 1=1"], /--name must be a campaign name/],
      [['cancel', 'x', '--wait-seconds=-1'], /--wait-seconds must be a number/],
      [['dev', '--port', '70000'], /--port must be a TCP port/],
      [['dev', '--metrics-port', '9464x'], /--metrics-port must be a port number 0..65535, got "9464x"/],
      [['spec', 'lint'], /unknown spec subcommand "lint"/],
      [['spec', 'check'], /spec check needs a spec file/],
      [['start', 'x.yaml', '--set'], /argument missing/],
      [['status', 'bad id!'], /is not a campaign id/],
    ];
    for (const [argv, pattern] of cases) {
      const r = await run(...argv);
      assert.equal(r.code, 2, `${argv.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /^moerl: [^\n]+\n$/, argv.join(' '));
      assert.match(r.stderr, pattern, argv.join(' '));
      assert.equal(r.stdout, '');
    }
  });

  it('a global option may come before the command', async () => {
    const r = await run('--address', '127.0.0.1:1', 'status');
    assert.equal(r.code, 2);
    assert.match(r.stderr, /status: missing argument/);
  });

  it('a missing spec file is named', async () => {
    const r = await run('start', 'no-such.yaml');
    assert.equal(r.code, 2);
    assert.match(r.stderr, /spec file no-such\.yaml does not exist/);
  });
});

describe('moerl spec', () => {
  const demo = join(repoRoot(), 'examples', 'demo.yaml');

  it('spec schema prints the JSON Schema', async () => {
    const r = await run('spec', 'schema');
    assert.equal(r.code, 0);
    const schema = JSON.parse(r.stdout) as { properties: Record<string, unknown> };
    assert.ok('hyperparameters' in schema.properties);
  });

  it('spec check validates a file, with overrides, as text or JSON', async () => {
    const ok = await run('spec', 'check', demo);
    assert.equal(ok.code, 0);
    assert.match(ok.stdout, /demo\.yaml: valid — demo: reverse/);
    const json = await run('spec', 'check', demo, '--set', 'iterations=3', '--json');
    assert.equal((JSON.parse(json.stdout) as { spec: { iterations: number } }).spec.iterations, 3);

    const bad = await run('spec', 'check', demo, '--set', 'model.topK=9', '--set', 'groupSize=1');
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /^moerl: .*demo\.yaml is invalid:\n/);
    assert.match(
      bad.stderr,
      /--set model\.topK=9: model\.topK: got 9; topK \(9\) must be at most experts \(8\)/,
    );
    assert.match(bad.stderr, /--set groupSize=1: groupSize: got 1/);
    const badJson = await run('spec', 'check', demo, '--set', 'model.topK=9', '--json');
    assert.equal(badJson.code, 1);
    const out = JSON.parse(badJson.stdout) as { valid: boolean; problems: string[] };
    assert.equal(out.valid, false);
    assert.equal(out.problems.length, 1);
  });
});

describe('list query', () => {
  it('filters on the campaign search attributes and skips continued-as-new runs', () => {
    assert.equal(listQuery({}), `WorkflowType = 'campaign' AND ExecutionStatus != 'ContinuedAsNew'`);
    assert.equal(
      listQuery({ status: 'paused', name: 'demo' }),
      `WorkflowType = 'campaign' AND ExecutionStatus != 'ContinuedAsNew' AND CampaignStatus = 'paused' AND ExecutionStatus = 'Running' AND CampaignName = 'demo'`,
    );
    assert.ok(!listQuery({ status: 'completed' }).includes(`ExecutionStatus = 'Running'`));
    assert.throws(() => listQuery({ status: 'done' }), UsageError);
  });
});

describe('set arguments', () => {
  it('parses key=value into numbers, accepting the hyperparameters. prefix', () => {
    assert.deepEqual(parseHyperparameterArgs(['lr=1e-4', 'hyperparameters.maxNewTokens=32']), {
      lr: 1e-4,
      maxNewTokens: 32,
    });
    assert.throws(() => parseHyperparameterArgs(['lr']), UsageError);
  });
});

describe('output helpers', () => {
  it('table aligns columns', () => {
    assert.equal(
      table(
        ['A', 'NUM'],
        [
          ['xx', '1'],
          ['y', '22'],
        ],
        new Set([1]),
      ),
      'A   NUM\nxx    1\ny    22',
    );
  });
  it('seconds scales its unit', () => {
    assert.equal(seconds(0.123), '0.12s');
    assert.equal(seconds(12.34), '12.3s');
    assert.equal(seconds(245), '4m05s');
    assert.equal(seconds(7380), '2h03m');
    assert.equal(seconds(null), '-');
  });
  it('oneLine joins a multi-line message', () => {
    assert.equal(
      oneLine('change is invalid:\n  - lr: got 5\n  - topP: got 2'),
      'change is invalid: lr: got 5; topP: got 2',
    );
  });
});

describe('history folding', () => {
  const p = (value: unknown) => ({ payloads: [defaultPayloadConverter.toPayload(value)] });
  const ts = (ms: number) => ({ seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 });
  let nextId = 1;
  const ev = (ms: number, attrs: Record<string, unknown>): HistoryEvent =>
    ({ eventId: nextId++, eventTime: ts(ms), ...attrs }) as unknown as HistoryEvent;
  const scheduled = (ms: number, activityId: string, type: string, input: unknown) =>
    ev(ms, {
      activityTaskScheduledEventAttributes: { activityId, activityType: { name: type }, input: p(input) },
    });

  it('gives stage durations, attempts with failure reasons, reward and changes per iteration', () => {
    nextId = 1;
    const events: HistoryEvent[] = [
      ev(0, { workflowExecutionStartedEventAttributes: { continuedExecutionRunId: 'run-0' } }),
      scheduled(1000, '1', 'rolloutShard', { iteration: 4, shard: 0 }), // eventId 2
      scheduled(1000, '2', 'rolloutShard', { iteration: 4, shard: 1 }), // eventId 3
      ev(1500, { activityTaskStartedEventAttributes: { scheduledEventId: 2, attempt: 1 } }),
      ev(1500, { activityTaskCompletedEventAttributes: { scheduledEventId: 2, result: p({}) } }),
      ev(4000, {
        activityTaskStartedEventAttributes: {
          scheduledEventId: 3,
          attempt: 3,
          lastFailure: { message: 'worker lost', applicationFailureInfo: { type: 'Error' } },
        },
      }),
      ev(4500, { activityTaskCompletedEventAttributes: { scheduledEventId: 3, result: p({}) } }),
      scheduled(4600, '3', 'computeRewards', { iteration: 4 }), // eventId 8
      ev(4800, { activityTaskStartedEventAttributes: { scheduledEventId: 8, attempt: 1 } }),
      ev(4900, {
        activityTaskCompletedEventAttributes: { scheduledEventId: 8, result: p({ meanReward: 0.5 }) },
      }),
      ev(5000, {
        workflowExecutionUpdateCompletedEventAttributes: {
          outcome: { success: p({ iteration: 5, changes: { lr: 0.01 }, reason: '', at: 'x' }) },
        },
      }),
      scheduled(5100, '4', 'updatePolicy', { iteration: 4 }), // eventId 12
      ev(6100, { activityTaskStartedEventAttributes: { scheduledEventId: 12, attempt: 2 } }),
      ev(6100, {
        activityTaskFailedEventAttributes: {
          scheduledEventId: 12,
          failure: { message: 'bad shard', applicationFailureInfo: { type: 'BadInput' } },
        },
      }),
      scheduled(6200, '5', 'rolloutShard', { iteration: 5, shard: 0 }),
    ];
    const read = readRunEvents('run-1', events);
    assert.equal(read.continuedFrom, 'run-0');
    assert.equal(read.changes.length, 1);
    const [it4, it5] = iterationsFrom(read.activities, read.changes);
    assert.equal(it4?.iteration, 4);
    assert.deepEqual(it4?.stages.rollout, {
      seconds: 3.5,
      attempts: 3,
      activities: 2,
      failures: ['shard 1 attempt 2: Error: worker lost'],
      running: false,
    });
    assert.equal(it4?.stages.reward?.seconds, 0.3);
    assert.equal(it4?.meanReward, 0.5);
    assert.deepEqual(it4?.stages.update?.failures, ['attempt 2: BadInput: bad shard']);
    assert.equal(it4?.stages.update?.attempts, 2);
    assert.equal(it5?.iteration, 5);
    assert.equal(it5?.stages.rollout?.running, true);
    assert.equal(it5?.stages.rollout?.seconds, null);
    assert.deepEqual(
      it5?.hyperparameterChanges.map((c) => c.changes),
      [{ lr: 0.01 }],
    );
  });
});
