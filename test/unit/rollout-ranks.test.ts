// runGenerateRanks with a fake generator (a shell script): the rank contract each rank sees,
// a failing rank named with its exit and the others stopped, cancellation stopping every rank.
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { runGenerateRanks } from '../../activities/rollout-ranks.js';

let dir: string;
let tool: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'moerl-rollout-ranks-'));
  tool = join(dir, 'fake-generate');
  // Writes its contract to env-<rank> (and the mode of its port file's directory); `$1` is the
  // rank that fails (exit 5) while the others wait for a long time, unless it is "none"; rank 0
  // prints a progress record first.
  writeFileSync(
    tool,
    [
      '#!/bin/sh',
      'env | grep -E "^(MOERL_|SECRET_)" | sort > "$2/env-$MOERL_RANK"',
      'stat -c "port_file_dir_mode=%a" "$(dirname "$MOERL_COORDINATOR_PORT_FILE")" >> "$2/env-$MOERL_RANK"',
      '[ "$MOERL_RANK" = 0 ] && echo \'{"chunk":0,"progress":true}\'',
      '[ "$MOERL_RANK" = "$1" ] && { echo "rank $1 broke" >&2; exit 5; }',
      '[ "$1" = none ] && exit 0',
      'exec sleep 60',
      '',
    ].join('\n'),
  );
  chmodSync(tool, 0o755);
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('rollout ranks (fake generator)', () => {
  it('runs every rank under the rank contract, without the worker environment', async () => {
    process.env.SECRET_TOKEN = 'not for ranks';
    const records: unknown[] = [];
    const run = await runGenerateRanks(tool, ['none', dir], {
      worldSize: 3,
      what: 'fake',
      onRecord: (r) => void records.push(r),
    });
    delete process.env.SECRET_TOKEN;
    assert.equal(run.code, 0);
    assert.deepEqual(records, [{ chunk: 0, progress: true }]);
    const envs = [0, 1, 2].map((r) => readFileSync(join(dir, `env-${r}`), 'utf8'));
    // No port chosen ahead (another local user could take it first): rank 0 binds port 0 and
    // publishes what it got in a file of the run's own directory.
    const portFile = /^MOERL_COORDINATOR_PORT_FILE=(.+)$/m.exec(envs[0]!)?.[1];
    assert.ok(portFile, envs[0]);
    envs.forEach((text, r) => {
      assert.match(text, new RegExp(`^MOERL_RANK=${r}$`, 'm'));
      assert.match(text, /^MOERL_WORLD_SIZE=3$/m);
      assert.match(text, /^MOERL_COORDINATOR=127\.0\.0\.1:0$/m);
      assert.ok(text.includes(`\nMOERL_COORDINATOR_PORT_FILE=${portFile}\n`), text);
      assert.match(text, /^port_file_dir_mode=700$/m, 'only this user may plant a port there');
      assert.doesNotMatch(text, /SECRET_/);
    });
    assert.equal(existsSync(dirname(portFile)), false, 'the run removed its directory');
  });

  it('names the failed rank and its exit, and stops the others', async () => {
    const started = Date.now();
    await assert.rejects(
      runGenerateRanks(tool, ['1', dir], { worldSize: 2, what: 'moe_generate (iteration 1, shard 0)' }),
      (err: unknown) => {
        assert.ok(err instanceof ApplicationFailure);
        assert.match(
          err.message,
          /moe_generate \(iteration 1, shard 0\) rank 1 of 2 exited with code 5: rank 1 broke/,
        );
        return true;
      },
    );
    assert.ok(Date.now() - started < 10_000, 'rank 0 was stopped, not waited for');
  });

  it('stops every rank when cancelled', async () => {
    const stop = new AbortController();
    setTimeout(() => stop.abort(), 300);
    const run = await runGenerateRanks(tool, ['none-fails', dir], {
      worldSize: 2,
      what: 'fake',
      signal: stop.signal,
    });
    assert.equal(run.signal, 'SIGTERM');
  });
});
