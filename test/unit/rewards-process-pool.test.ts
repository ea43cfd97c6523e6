// The process pool's protocol and failure handling, with small Node programs as workers (no
// sandbox): answers on fd 3, output apart from them, a worker that answers garbage, too much or
// dies (its last output in the message), one that never loads or cannot load, and close().
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  maxFailureMessageChars,
  ProcessPool,
  type ProcessPoolOptions,
} from '../../activities/rewards/process-pool.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-pool-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const worker = join(dir, 'worker.mjs');
writeFileSync(
  worker,
  `import { writeSync } from 'node:fs';
import { createInterface } from 'node:readline';
const answer = (m) => writeSync(3, typeof m === 'string' ? m : JSON.stringify(m) + '\\n');
answer({ ready: true });
for await (const line of createInterface({ input: process.stdin })) {
  const { what, value } = JSON.parse(line);
  if (what === 'echo') { console.log('noise on stdout'); answer({ value }); }
  if (what === 'raise') answer({ error: 'it broke', kind: 'exception' });
  if (what === 'raise-long') answer({ error: 'x'.repeat(60000), kind: 'exception' });
  if (what === 'garbage') answer('not json\\n');
  if (what === 'huge') answer('{"value": "' + 'x'.repeat(100000));
  if (what === 'die') { process.stderr.write('bye from the worker\\n'); process.exit(7); }
}
`,
);
const neverReady = join(dir, 'never-ready.mjs');
writeFileSync(neverReady, 'setInterval(() => {}, 1000);\n');
const cannotLoad = join(dir, 'cannot-load.mjs');
writeFileSync(
  cannotLoad,
  `import { writeSync } from 'node:fs';
writeSync(3, JSON.stringify({ error: 'could not load the function: no module x', kind: 'start' }) + '\\n');
process.exit(1);
`,
);

function pool(script: string, options: Partial<ProcessPoolOptions> = {}): ProcessPool {
  return new ProcessPool({
    name: 'test',
    size: 2,
    timeoutMs: 10_000,
    maxOutputBytes: 1024 ** 2,
    spawn: () => ({ command: process.execPath, args: [script], env: {} }),
    ...options,
  });
}

describe('process pool', () => {
  it('answers in order of calls, keeps output apart, and replaces a worker that failed', async () => {
    const p = pool(worker);
    try {
      const results = await Promise.all(
        [
          { what: 'echo', value: 1 },
          { what: 'raise' },
          { what: 'garbage' },
          { what: 'huge' },
          { what: 'die' },
          { what: 'echo', value: 2 },
        ].map((request) => p.call(request)),
      );
      assert.deepEqual(results[0], { ok: true, value: 1 });
      // The worker that raises may be the one that echoed: its stdout line can arrive after that
      // answer (another pipe), and then it is the raising call's last output.
      assert.equal(results[1]?.ok === false && results[1].reason, 'exception');
      assert.match(
        results[1]?.ok === false ? results[1].message : '',
        /^it broke(; last output: "noise on stdout")?$/,
      );
      assert.equal(results[2]?.ok === false && results[2].reason, 'bad-result');
      assert.match(
        results[2]?.ok === false ? results[2].message : '',
        /answered a line that is not JSON: "not json"/,
      );
      assert.equal(results[3]?.ok === false && results[3].reason, 'bad-result');
      assert.match(results[3]?.ok === false ? results[3].message : '', /answered more than 65536 bytes/);
      assert.equal(results[4]?.ok === false && results[4].reason, 'crash');
      assert.match(
        results[4]?.ok === false ? results[4].message : '',
        /^exited with code 7; last output: "bye from the worker"$/,
      );
      assert.deepEqual(results[5], { ok: true, value: 2 });
      assert.ok(p.started >= 3, `${p.started} processes started: each failed worker was replaced`);
    } finally {
      p.close();
    }
  });

  it('a request nested too deep to encode fails alone, and the process lives on', async () => {
    // The depth of a dataset row once made JSON.stringify throw a RangeError inside the stream
    // handler that hands the next request to a process that became ready: uncaught, it ended
    // the whole Node process.
    let deep: unknown = { what: 'echo', value: 1 };
    for (let i = 0; i < 20_000; i++) deep = { what: 'echo', value: deep };
    const p = pool(worker, { size: 1 });
    try {
      const results = await Promise.all([
        p.call({ what: 'echo', value: 1 }),
        p.call(deep),
        p.call({ what: 'echo', value: 2 }),
      ]);
      assert.deepEqual(results[0], { ok: true, value: 1 });
      assert.equal(results[1]?.ok, false);
      assert.match(
        !results[1]?.ok ? (results[1]?.message ?? '') : '',
        /request could not be encoded as JSON: RangeError/,
      );
      assert.deepEqual(results[2], { ok: true, value: 2 });
      assert.equal(p.started, 1);
    } finally {
      p.close();
    }
  });

  it('a failure message is cut to 4 KiB, saying so', async () => {
    const p = pool(worker, { size: 1 });
    try {
      const result = await p.call({ what: 'raise-long' });
      assert.equal(result.ok, false);
      const message = result.ok ? '' : result.message;
      assert.ok(message.length <= maxFailureMessageChars, `${message.length} characters`);
      assert.match(message, /\(truncated: 60000 characters in all, 4096 kept\)$/);
    } finally {
      p.close();
    }
  });

  it('a worker that cannot load fails every call with its message, started once', async () => {
    const p = pool(cannotLoad);
    try {
      const results = await Promise.all([1, 2, 3, 4, 5].map(() => p.call({ what: 'echo', value: 1 })));
      for (const result of results) {
        assert.deepEqual(result, {
          ok: false,
          reason: 'start',
          message: 'test: could not load the function: no module x',
        });
      }
      assert.ok(p.started <= 2, `${p.started} processes started for a broken function`);
    } finally {
      p.close();
    }
  });

  it('a worker that never says it is ready fails after the start limit', async () => {
    const p = pool(neverReady, { startTimeoutMs: 500, size: 1 });
    try {
      assert.deepEqual(await p.call({ what: 'echo' }), {
        ok: false,
        reason: 'start',
        message: 'test: did not load its function within 500 ms',
      });
    } finally {
      p.close();
    }
  });

  it('a program that cannot be started fails every call with the reason', async () => {
    const missing = join(dir, 'no-such-interpreter');
    const p = new ProcessPool({
      name: 'test',
      size: 1,
      timeoutMs: 1000,
      maxOutputBytes: 1024,
      spawn: () => ({ command: missing, args: [], env: {} }),
    });
    try {
      const result = await p.call({ what: 'echo' });
      assert.equal(result.ok ? 'ok' : result.reason, 'start');
      assert.match(
        result.ok ? '' : result.message,
        /^test: could not start .*no-such-interpreter: spawn .* ENOENT$/,
      );
    } finally {
      p.close();
    }
  });

  it('close() fails the calls still queued and ends the workers', async () => {
    const p = pool(neverReady, { size: 1 });
    const pending = p.call({ what: 'echo' });
    p.close();
    assert.deepEqual(await pending, { ok: false, reason: 'start', message: 'the pool is closed' });
    assert.deepEqual(await p.call({ what: 'echo' }), {
      ok: false,
      reason: 'start',
      message: 'the pool is closed',
    });
  });
});
