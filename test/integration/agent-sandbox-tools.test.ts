// The sandboxed tools of agentic rollouts with real jailed processes: the builtin calculator and
// python tools give their results and clear errors, a call leaves nothing behind for the next
// one on the same process (globals, builtins, modules, files, environment), the jail has no
// network, and the pool's limits, unknown tools and an aborted wait fail the call as they should.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  builtinToolSchemas,
  SandboxToolError,
  sandboxToolRunner,
  type SandboxToolRunner,
} from '../../activities/agents/sandbox-tools.js';
import { ToolCallParser } from '../../activities/agents/tool-calls.js';
import { availableIsolation, resolveRewardPython } from '../../activities/rewards/sandbox.js';

const namespaces = availableIsolation() === 'namespaces';
let python: string | undefined;
let noPython: string | undefined;
try {
  python = resolveRewardPython();
} catch (err) {
  noPython = `no reward Python interpreter: ${(err as Error).message}`;
}
const skip = (!namespaces && 'no network/PID namespaces on this machine') || noPython || false;

const limits = { timeoutMs: 10_000, cpuSeconds: 5, memoryBytes: 512 * 1024 ** 2, python };
const never = new AbortController().signal;

/** The SandboxToolError a call rejects with (fails the test when it resolves instead). */
async function failure(promise: Promise<string>): Promise<SandboxToolError> {
  try {
    const text = await promise;
    assert.fail(`the call returned ${JSON.stringify(text)}`);
  } catch (err) {
    if (!(err instanceof SandboxToolError)) throw err;
    return err;
  }
}

describe('sandboxed tools', { skip }, () => {
  let runner: SandboxToolRunner;
  let server: Server;
  let port = 0;
  let connections = 0;
  const dir = mkdtempSync(join(tmpdir(), 'moerl-agent-tools-'));
  before(async () => {
    runner = sandboxToolRunner({ ...limits, processes: 1 });
    server = createServer((socket) => {
      connections++;
      socket.on('error', () => undefined);
      socket.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as { port: number }).port;
  });
  after(() => {
    runner.close();
    server.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const calc = (expression: string) => runner.call('calculator', { expression }, never);
  const py = (code: string) => runner.call('python', { code }, never);

  it('declares its tools in the form a ToolCallParser takes', () => {
    const parser = new ToolCallParser(builtinToolSchemas, 'hermes');
    assert.deepEqual(parser.toolNames, ['calculator', 'python']);
    const turn = parser.parse('<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>');
    assert.equal(turn.errors[0]?.kind, 'bad-arguments', JSON.stringify(turn));
  });

  it('calculator: arithmetic as Python does it, nothing else', async () => {
    const cases: [string, string][] = [
      ['(3 + 4) * 2 ** 10 / 7', '1024.0'],
      ['7 // 2', '3'],
      ['-7 % 3', '2'],
      ['-3 ** 2', '-9'],
      ['2 ** -2', '0.25'],
      ['0.1 + 0.2', '0.30000000000000004'],
      ['2 ** 100', '1267650600228229401496703205376'],
    ];
    for (const [expression, value] of cases) assert.equal(await calc(expression), value, expression);
    const errors: [string, RegExp][] = [
      ['1 / 0', /^division by zero$/],
      ['5 % 0', /^division by zero$/],
      ['x + 1', /^unknown name 'x'/],
      ["__import__('os').system('true')", /^Call is not allowed/],
      ['1 +', /^not an arithmetic expression/],
      ['(-8) ** 0.5', /is not a real number/],
      ['2.0 ** 100000', /too large for a floating-point number/],
    ];
    for (const [expression, message] of errors) {
      const error = await failure(calc(expression));
      assert.equal(error.reason, 'exception', expression);
      assert.match(error.message, message, expression);
    }
  });

  it('calculator: refuses a huge power at once instead of computing it', async () => {
    for (const expression of ['9**9**9', '10 ** 100000', '(2 ** 9000) * (2 ** 9000)']) {
      const started = Date.now();
      const error = await failure(calc(expression));
      assert.match(error.message, /too large \(more than 10000 bits\)/, expression);
      assert.ok(Date.now() - started < 2000, `${expression} took ${Date.now() - started} ms`);
    }
  });

  it("python: what the cell printed, its subprocesses' output, then its last expression", async () => {
    assert.equal(
      await py('import sys\nprint("hello")\nprint("warn", file=sys.stderr)\nx = 6\nx * 7'),
      'hello\nwarn\n42',
    );
    assert.match(
      await py('import subprocess\nsubprocess.run(["echo", "from a child"])'),
      /^from a child\nCompletedProcess/,
    );
    assert.equal(await py('x = 1'), '(no output)');
    assert.equal(await py('"text"'), "'text'");
    const long = await py('print("x" * 100_000)');
    assert.ok(long.length < 9000, `${long.length} characters`);
    assert.match(long, /more bytes of output cut\)$/);
  });

  it("python: a cell's exception is its error, with the cell's traceback and output", async () => {
    const error = await failure(py('print("before")\ndef f():\n    return 1 / 0\nf()'));
    assert.equal(error.reason, 'exception');
    assert.match(error.message, /^before\nTraceback[^]*File "<cell>", line 3, in f\n {4}return 1 \/ 0/);
    assert.match(error.message, /ZeroDivisionError: division by zero$/);
    assert.doesNotMatch(error.message, /builtin_tools|tool_runner/, 'frames of the runner are shown');
    assert.match((await failure(py('def (:'))).message, /SyntaxError/);
  });

  it('carries no state from one call to the next on the same process', async () => {
    const startedBefore = runner.processesStarted;
    // The first call changes the process in every way a cell can, and shows that it did.
    const changed = await py(
      [
        'import builtins, json, os, sys, types',
        'global counter',
        'counter = 1',
        'builtins.len = lambda x: -1',
        'builtins.moerl_marker = "left"',
        'json.dumps = lambda *a, **k: "patched"',
        'sys.modules["moerl_marker"] = types.ModuleType("moerl_marker")',
        'sys.path.append("/moerl-marker")',
        'os.environ["MOERL_MARKER"] = "left"',
        'open("marker.txt", "w").write("left")',
        'open("../escaped.txt", "w").write("left")',
        'os.makedirs(os.path.expanduser("~/.cache/moerl"), exist_ok=True)',
        'print(len("abc"), json.dumps(1), os.path.exists("marker.txt"), os.path.exists("../escaped.txt"))',
      ].join('\n'),
    );
    assert.equal(changed, '-1 patched True True');
    const seen = await py(
      [
        'import builtins, json, os, sys',
        'print(len("abc"), json.dumps(1), hasattr(builtins, "moerl_marker"), "counter" in globals())',
        'print("moerl_marker" in sys.modules, "/moerl-marker" in sys.path, os.environ.get("MOERL_MARKER"))',
        'print(os.listdir("."), os.path.exists("../escaped.txt"), os.path.exists(os.path.expanduser("~/.cache")))',
        'print(len(os.listdir("..")))',
      ].join('\n'),
    );
    assert.equal(seen, '3 1 False False\nFalse False None\n[] False False\n1');
    assert.equal(runner.processesStarted, startedBefore, 'both calls ran on the same process');
    assert.ok(runner.processesStarted >= 1);
  });

  it("a call's crash is its own error; the next call runs on the same process", async () => {
    const startedBefore = runner.processesStarted;
    const error = await failure(py('import os\nprint("going")\nos._exit(3)'));
    assert.equal(error.reason, 'crash');
    assert.match(error.message, /exited with code 3/);
    assert.equal(await calc('1 + 1'), '2');
    assert.equal(runner.processesStarted, startedBefore);
  });

  it('has no network: not the worker loopback, not the outside', async () => {
    const connect = (host: string) =>
      failure(py(`import socket\nsocket.create_connection((${JSON.stringify(host)}, ${port}), timeout=5)`));
    // The jail's own loopback is up, with nothing on it: the worker's is out of reach.
    assert.match((await connect('127.0.0.1')).message, /ConnectionRefusedError/);
    assert.match((await connect('10.255.255.1')).message, /OSError: \[Errno 101\] Network is unreachable/);
    assert.equal(connections, 0, 'the loopback server saw a connection');
  });

  it('an unknown tool, or arguments the tool does not take, are errors', async () => {
    const unknown = await failure(runner.call('calc', { expression: '1' }, never));
    assert.equal(unknown.reason, 'exception');
    assert.equal(unknown.message, 'unknown tool "calc"; the tools are: calculator, python');
    const badArgs = await failure(runner.call('calculator', { expr: '1' }, never));
    assert.match(badArgs.message, /^TypeError: calculator\(\) got an unexpected keyword argument 'expr'/);
  });

  it("runs a user's tools file: JSON results, and a declared tool missing from it refused", async () => {
    const file = join(dir, 'my_tools.py');
    writeFileSync(file, 'def lookup(key):\n    return {"key": key, "values": [1, 2.5, None]}\n');
    const own = sandboxToolRunner({
      ...limits,
      tools: { file, tools: [{ type: 'function', function: { name: 'lookup' } }] },
    });
    try {
      assert.deepEqual(
        own.tools.map((t) => t.function.name),
        ['lookup'],
      );
      assert.equal(await own.call('lookup', { key: 'k' }, never), '{"key": "k", "values": [1, 2.5, null]}');
    } finally {
      own.close();
    }
    const missing = sandboxToolRunner({
      ...limits,
      tools: { file, tools: [{ type: 'function', function: { name: 'search' } }] },
    });
    try {
      const error = await failure(missing.call('search', {}, never));
      assert.equal(error.reason, 'start');
      assert.match(
        error.message,
        /could not load the tools: AttributeError: my_tools\.py has no function search/,
      );
    } finally {
      missing.close();
    }
  });

  it("a tool past the pool's time limit fails with the timeout reason; an abort stops the wait", async () => {
    const slow = sandboxToolRunner({ ...limits, timeoutMs: 1500, processes: 1 });
    try {
      const started = Date.now();
      const error = await failure(slow.call('python', { code: 'import time\ntime.sleep(60)' }, never));
      assert.equal(error.reason, 'timeout');
      assert.match(error.message, /did not return within 1500 ms/);
      assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms`);
      // The killed process is replaced.
      assert.equal(await slow.call('calculator', { expression: '2 * 3' }, never), '6');
      assert.equal(slow.processesStarted, 2);

      const controller = new AbortController();
      const abortedAt = Date.now();
      setTimeout(() => controller.abort(new Error('the episode ran out of time')), 200);
      await assert.rejects(
        slow.call('python', { code: 'import time\ntime.sleep(60)' }, controller.signal),
        /the episode ran out of time/,
      );
      assert.ok(Date.now() - abortedAt < 1000, `the abort took ${Date.now() - abortedAt} ms`);
      await assert.rejects(
        slow.call('calculator', { expression: '1' }, controller.signal),
        /ran out of time/,
      );
    } finally {
      slow.close();
    }
  });
});
