// Tool resolution through scripts/tools.sh: overrides win, failures are one-line typed errors.
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { repoRoot, resolveTool, ToolResolutionError } from '../../cli/temporal-tools.js';

describe('resolveTool', () => {
  let dir: string;
  let fakeTemporal: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-tools-test-'));
    fakeTemporal = join(dir, 'temporal');
    writeFileSync(fakeTemporal, '#!/bin/sh\nexit 0\n');
    chmodSync(fakeTemporal, 0o755);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  // PATH keeps only what bash and the script need, so no temporal or go from the host leaks in.
  const bareEnv = (extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv => ({
    PATH: '/usr/bin:/bin',
    HOME: dir,
    MOERL_TOOLS_DIR: join(dir, 'tools'),
    ...extra,
  });

  it('finds the repository root from the compiled module', () => {
    assert.ok(existsSync(join(repoRoot(), 'scripts', 'tools.sh')));
    assert.ok(existsSync(join(repoRoot(), 'package.json')));
  });

  it('uses TEMPORAL_CLI_PATH when set', async () => {
    const path = await resolveTool('temporal', { env: bareEnv({ TEMPORAL_CLI_PATH: fakeTemporal }) });
    assert.equal(path, fakeTemporal);
  });

  it('uses a temporal on PATH', async () => {
    const path = await resolveTool('temporal', { env: bareEnv({ PATH: `${dir}:/usr/bin:/bin` }) });
    assert.equal(path, fakeTemporal);
  });

  it('rejects an override that is not executable with a one-line error', async () => {
    const missing = join(dir, 'no-such-temporal');
    await assert.rejects(resolveTool('temporal', { env: bareEnv({ TEMPORAL_CLI_PATH: missing }) }), (err) => {
      assert.ok(err instanceof ToolResolutionError);
      assert.equal(err.tool, 'temporal');
      assert.match(err.message, /TEMPORAL_CLI_PATH=.*no-such-temporal is not an executable file/);
      assert.doesNotMatch(err.message, /\n/);
      return true;
    });
  });

  it('says how to get a binary when there is neither one nor Go', async (t) => {
    const env = bareEnv({});
    if (['/usr/bin/go', '/bin/go'].some((go) => existsSync(go))) {
      t.skip('a go on the bare PATH would build the binary');
      return;
    }
    await assert.rejects(resolveTool('versitygw', { env }), (err) => {
      assert.ok(err instanceof ToolResolutionError);
      assert.match(err.message, /Go is not installed/);
      assert.match(err.message, /VERSITYGW_PATH/);
      assert.doesNotMatch(err.message, /\n/);
      return true;
    });
  });
});
