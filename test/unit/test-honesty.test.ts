// Test honesty in scripts/test.sh: skipped tests are reported in the last line, and a skip
// because the native tools or the Python reference are missing is a failure with CI=true. Runs
// the real script on real test files whose native part skips when MOERL_NATIVE_BIN points at an
// empty folder, and whose Python part skips when MOERL_PYREF_PYTHON names no interpreter.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, describe, it } from 'node:test';
import { repoRoot } from '../../cli/temporal-tools.js';

const emptyBin = mkdtempSync(join(tmpdir(), 'moerl-no-native-'));
after(() => rmSync(emptyBin, { recursive: true, force: true }));

async function testSh(
  ci: boolean,
  file = 'test/unit/rewards-score.test.ts',
): Promise<{ code: number; lines: string[] }> {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    MOERL_NATIVE_BIN: emptyBin,
    MOERL_PYREF_PYTHON: join(emptyBin, 'python'),
    CI: ci ? 'true' : '',
  };
  // Set by the runner this test runs in; a nested `node --test` would report to it instead.
  delete env.NODE_TEST_CONTEXT;
  const args = ['scripts/test.sh', '--skip-setup', file];
  try {
    const { stdout } = await promisify(execFile)('bash', args, { cwd: repoRoot(), env });
    return { code: 0, lines: stdout.trimEnd().split('\n') };
  } catch (err) {
    const e = err as { code?: number; stdout?: string };
    return { code: e.code ?? -1, lines: (e.stdout ?? '').trimEnd().split('\n') };
  }
}

describe('test honesty in scripts/test.sh', () => {
  it('the last line counts skipped tests: "total: N passed, M failed, K skipped"', async () => {
    const { code, lines } = await testSh(false);
    assert.equal(code, 0, lines.join('\n'));
    assert.match(lines.at(-1) ?? '', /^total: [1-9]\d* passed, 0 failed, 1 skipped$/);
    assert.ok(
      lines.some((l) => /^ {2}node +\d+ passed, 0 failed, 1 skipped$/.test(l)),
      lines.join('\n'),
    );
  });

  it('with CI=true a skip for missing native tools is a failure, named in the summary', async () => {
    const { code, lines } = await testSh(true);
    assert.notEqual(code, 0);
    assert.match(lines.at(-1) ?? '', /^total: [1-9]\d* passed, 1 failed, 0 skipped$/);
    assert.ok(
      lines.some((l) =>
        l.includes('rewards-score.test.js: 1 skipped for missing native tools (a failure with CI=true)'),
      ),
      lines.join('\n'),
    );
  });

  it('with CI=true a skip for a missing Python reference is a failure, named in the summary', async () => {
    const { code, lines } = await testSh(true, 'test/unit/hf-tokenizer.test.ts');
    assert.notEqual(code, 0);
    assert.match(lines.at(-1) ?? '', /^total: [1-9]\d* passed, 1 failed, 0 skipped$/);
    assert.ok(
      lines.some((l) =>
        l.includes('hf-tokenizer.test.js: 1 skipped for a missing Python reference (a failure with CI=true)'),
      ),
      lines.join('\n'),
    );
  });
});
