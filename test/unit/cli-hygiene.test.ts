// Item 11 of the long-campaign correctness work, the CLI's part: `--set` paths cannot reach
// Object.prototype, the API key can come from a file (and the visible flag warns), and the
// status of a finished campaign shows no stale pause reason.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import type { WorkflowExecutionDescription } from '@temporalio/client';
import { CommandContext } from '../../cli/command.js';
import { parseHyperparameterArgs } from '../../cli/commands/set.js';
import { statusText } from '../../cli/commands/status.js';
import { UsageError } from '../../cli/errors.js';
import { commands, main } from '../../cli/main.js';
import { applyOverrides, loadSpecFile, parseOverride } from '../../cli/spec-file.js';
import { repoRoot } from '../../cli/temporal-tools.js';
import { initialState } from '../../workflows/state.js';
import type { CampaignState } from '../../workflows/types.js';

const demo = join(repoRoot(), 'examples', 'demo.yaml');
const dir = mkdtempSync(join(tmpdir(), 'moerl-cli-hygiene-'));
after(() => rmSync(dir, { recursive: true, force: true }));

async function run(argv: string[], env: NodeJS.ProcessEnv = {}) {
  let stdout = '';
  let stderr = '';
  const code = await main(argv, {
    stdout: { write: (s: string) => (stdout += s) },
    stderr: { write: (s: string) => (stderr += s) },
    env,
  });
  return { code, stdout, stderr };
}

/** Whether Object.prototype gained `key`; removes it again so one failure cannot spread. */
function polluted(key: string): boolean {
  const found = Object.prototype.hasOwnProperty.call(Object.prototype, key);
  if (found) delete (Object.prototype as Record<string, unknown>)[key];
  return found;
}

describe('item 11a: --set cannot pollute Object.prototype', () => {
  it('refuses __proto__, constructor and prototype path segments with a clear usage error', async () => {
    const paths = ['__proto__.pwned', 'constructor.prototype.pwned', 'model.__proto__.pwned', 'prototype'];
    for (const path of paths)
      for (const command of [['start'], ['spec', 'check']]) {
        const argv = [...command, demo, '--set', `${path}=1`];
        const r = await run(argv);
        assert.equal(polluted('pwned'), false, `${argv.join(' ')} polluted Object.prototype`);
        assert.equal(r.code, 2, `${argv.join(' ')}: ${r.stderr}`);
        assert.match(r.stderr, /is not allowed as a field name/, argv.join(' '));
        assert.ok(r.stderr.includes(`--set ${path}=1: "`), r.stderr);
      }
  });

  it('applyOverrides writes own properties only, whatever path it is handed', () => {
    assert.throws(
      () => applyOverrides({}, [{ path: ['__proto__', 'pwned'], value: 1, text: '__proto__.pwned=1' }]),
      UsageError,
    );
    assert.equal(polluted('pwned'), false);
    // An inherited name is a new section, not the function Object.prototype has under it.
    const out = applyOverrides({}, [parseOverride('toString.x=1')]) as Record<string, unknown>;
    assert.deepEqual(Object.getOwnPropertyDescriptor(out, 'toString')?.value, { x: 1 });
    assert.throws(() => loadSpecFile(demo, [parseOverride('toString.x=1')]), /unknown field\(s\) "toString"/);
  });

  it('JSON values and set arguments cannot carry __proto__ either', () => {
    assert.throws(
      () => parseOverride('launcher.nodeSelector={"__proto__":{"pwned":1}}'),
      /"__proto__" is not allowed/,
    );
    assert.throws(() => parseHyperparameterArgs(['__proto__={"lr":1}']), /"__proto__" is not allowed/);
    assert.equal(polluted('pwned'), false);
    assert.deepEqual(parseOverride('launcher.nodeSelector={"zone":"a"}').value, { zone: 'a' });
  });
});

describe('item 11b: the CLI takes the API key from a file and warns about --api-key', () => {
  const status = commands.find((c) => c.name === 'status')!;
  const context = (values: Record<string, string>, env: NodeJS.ProcessEnv = {}) => {
    let stderr = '';
    const ctx = new CommandContext(status, values, ['x'], {
      stdout: { write: () => undefined },
      stderr: { write: (s: string) => (stderr += s) },
      env,
    });
    return { ctx, stderr: () => stderr };
  };

  it('--api-key-file and TEMPORAL_API_KEY_FILE are read; no warning without --api-key', () => {
    const file = join(dir, 'api-key');
    writeFileSync(file, 'file-key\n');
    const fromFlag = context({ 'api-key-file': file });
    assert.equal(fromFlag.ctx.temporal().apiKey, 'file-key');
    assert.ok(fromFlag.ctx.temporal().tls, 'an API key implies TLS');
    assert.equal(fromFlag.stderr(), '');
    const fromEnv = context({}, { TEMPORAL_API_KEY_FILE: file });
    assert.equal(fromEnv.ctx.temporal().apiKey, 'file-key');
    assert.equal(context({}, { TEMPORAL_API_KEY: 'env-key' }).ctx.temporal().apiKey, 'env-key');
  });

  it('--api-key works but prints one warning on stderr', async () => {
    const flag = context({ 'api-key': 'visible-key' });
    assert.equal(flag.ctx.temporal().apiKey, 'visible-key');
    flag.ctx.temporal();
    assert.match(flag.stderr(), /^moerl: warning: --api-key shows the key to every user of this machine/);
    assert.equal(flag.stderr().split('\n').length, 2, 'one line, once');
    assert.ok(!flag.stderr().includes('visible-key'));
    // End to end, without a server: the warning comes before the options are checked.
    const r = await run(['list', '--api-key', 'visible-key', '--api-key-file', join(dir, 'api-key')]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^moerl: warning: --api-key .*TEMPORAL_API_KEY, --api-key-file FILE/);
    assert.match(r.stderr, /\nmoerl: give the API key once: --api-key or --api-key-file, not both\n$/);
    assert.match((await run(['--help'])).stdout, /--api-key-file FILE/);
  });
});

describe('item 11c: status of a finished campaign', () => {
  const spec = loadSpecFile(demo);
  const state = (over: Partial<CampaignState>): CampaignState => ({
    ...initialState({
      campaignId: 'demo-abc123',
      spec,
      taskQueues: { control: 'c', rollout: 'r', train: 't' },
    }),
    ...over,
  });
  const described = (status: string) =>
    ({ status: { name: status }, memo: { spec } }) as unknown as WorkflowExecutionDescription;
  const statusLine = (text: string) => /^status +(.*)$/m.exec(text)?.[1];

  it('shows no pause reason once completed or cancelled', () => {
    const stale = { pauseRequested: true, pauseReason: 'paused from the temporal CLI' };
    assert.equal(
      statusLine(statusText(state({ ...stale, status: 'completed' }), described('COMPLETED'))),
      'completed (workflow completed)',
    );
    assert.equal(
      statusLine(statusText(state({ ...stale, status: 'cancelled' }), described('CANCELED'))),
      'cancelled (workflow cancelled)',
    );
  });

  it('still shows why a live campaign is paused or pausing', () => {
    for (const status of ['paused', 'pausing'] as const)
      assert.equal(
        statusLine(
          statusText(state({ status, pauseRequested: true, pauseReason: 'inspect' }), described('RUNNING')),
        ),
        `${status}: inspect`,
      );
  });
});
