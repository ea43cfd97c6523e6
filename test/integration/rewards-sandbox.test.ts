// Users' reward functions in the sandbox: real Python and JavaScript functions that loop, sleep,
// allocate without bound, connect to a loopback server this test runs, look for a secret this
// test puts in the worker's environment, print megabytes, raise, or die. Each sample is
// contained and scores 0 with its reason, and the pool goes on scoring good samples in fresh
// processes; a function that fails on every sample is reported as such with its first error.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { BadInputError } from '../../activities/rewards/errors.js';
import { RewardFunctions, type Sample } from '../../activities/rewards/functions.js';
import { cgroupSupport } from '../../activities/rewards/cgroups.js';
import { availableIsolation, resolveRewardPython } from '../../activities/rewards/sandbox.js';
import { userFunctionPool } from '../../activities/rewards/user-function.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-reward-fns-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const secret = `s3cret-${process.pid}-${Date.now()}`;
/** A file of the worker's own user, outside the function's folder (a stand-in token or cache file). */
const outsideDir = mkdtempSync(join(tmpdir(), 'moerl-reward-outside-'));
after(() => rmSync(outsideDir, { recursive: true, force: true }));
const outside = join(outsideDir, 'token');
writeFileSync(outside, secret, { mode: 0o600 });
const python = resolveRewardPython();
const namespaces = availableIsolation() === 'namespaces';
/** The argument of the `sleep` an "orphan" sample starts: unique, so the test can look for it. */
const orphan = String(7000 + (process.pid % 1000) + 0.5);

/** Whether a process with exactly this command line runs on the machine. */
function running(cmdline: string): boolean {
  return readdirSync('/proc').some((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8') === cmdline;
    } catch {
      return false;
    }
  });
}

// One function, one behaviour per solution_str; "good" scores 1 when it equals the ground truth.
writeFileSync(
  join(dir, 'behaviours.py'),
  `import json, os, socket, subprocess, sys, threading, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "spin":
        while True:
            pass
    if solution_str == "sleep":
        time.sleep(600)
    if solution_str == "orphan":
        # A child in a session of its own would outlive a process-group kill, not the namespace.
        subprocess.Popen(["sleep", extra_info["orphan"]], start_new_session=True)
        time.sleep(600)
    if solution_str == "allocate":
        hoard = []
        while True:
            hoard.append(bytearray(50 * 1024 * 1024))
    if solution_str == "connect":
        with socket.create_connection(("127.0.0.1", extra_info["port"]), timeout=5) as s:
            s.sendall(b"reward leaked")
        return 1.0
    if solution_str == "secret":
        seen = " ".join(os.environ.values())
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    seen += f.read().decode(errors="replace")
            except OSError:
                pass
        return 1.0 if extra_info["secret"] in seen else 0.0
    if solution_str == "jail":
        # What the jail is, not only what fails in it: a silent fallback would fail this.
        status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
        facts = {
            "uid": os.getuid(),
            "capEff": status["CapEff"].strip(),
            "noNewPrivs": status["NoNewPrivs"].strip(),
            "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "root": sorted(os.listdir("/")),
            "passwd": os.path.exists("/etc/passwd"),
        }
        for name, path in [("outside", extra_info["outside"]), ("own", __file__)]:
            try:
                open(path, "a").close()
                facts[name] = "writable"
            except OSError as e:
                facts[name] = type(e).__name__
        raise RuntimeError("jail " + json.dumps(facts))
    if solution_str == "fork-many":
        children = [subprocess.Popen(["sleep", "30"]) for _ in range(200)]
        return 1.0
    if solution_str == "fork-allocate":
        # Each child stays under the per-process limit; together they pass the tree's.
        children = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                hoard = b"x" * (250 * 1024 * 1024)
                time.sleep(30)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        return 1.0
    if solution_str == "fill-scratch":
        with open("fill", "wb") as f:
            for _ in range(100):
                f.write(b"x" * 1024 * 1024)
        return 1.0
    if solution_str == "thread-fork-spin":
        # A child forked from a thread other than the main one is listed under that thread only.
        # (while that thread lives: once it ends, its children pass to the main thread).
        threading.Thread(target=lambda: (subprocess.Popen([sys.executable, "-c", "while True: pass"]), time.sleep(600))).start()
        time.sleep(600)
    if solution_str == "env":
        raise RuntimeError("environment: " + ",".join(sorted(os.environ)))
    if solution_str == "print":
        while True:
            print("x" * 4096)
    if solution_str == "raise":
        raise ValueError("no score for you")
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "nan":
        return float("nan")
    return {"score": 1.0 if solution_str == ground_truth else 0.0, "acc": True}
`,
);
writeFileSync(
  join(dir, 'always_fails.py'),
  'def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1 / 0\n',
);
writeFileSync(join(dir, 'broken.py'), 'def compute_score(:\n');
writeFileSync(
  join(dir, 'behaviours.mjs'),
  `export function compute_score(dataSource, solutionStr, groundTruth, extraInfo) {
  if (solutionStr === 'spin') for (;;);
  if (solutionStr === 'secret') return Object.values(process.env).includes(extraInfo.secret) ? 1 : 0;
  if (solutionStr === 'env') throw new Error('environment: ' + Object.keys(process.env).sort().join(','));
  // Address space is what the limit bounds: untouched buffers reach it without spending the CPU
  // limit on page faults (filled ones met the 1 s CPU limit first on a loaded machine).
  if (solutionStr === 'allocate') { const hoard = []; for (;;) hoard.push(Buffer.allocUnsafe(64 * 1024 * 1024)); }
  return solutionStr === groundTruth;
}
`,
);

let server: Server;
let port = 0;
let connections = 0;
before(async () => {
  process.env.MOERL_TEST_REWARD_SECRET = secret;
  process.env.AWS_SECRET_ACCESS_KEY = secret;
  server = createServer((socket) => {
    connections++;
    // Read and close gently, so a client that gets through is not reset mid-write.
    socket.on('error', () => undefined);
    socket.resume();
    socket.end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as { port: number }).port;
});
after(() => {
  delete process.env.MOERL_TEST_REWARD_SECRET;
  delete process.env.AWS_SECRET_ACCESS_KEY;
  server.close();
});

const limits = { timeoutMs: 15_000, cpuSeconds: 1, memoryBytes: 512 * 1024 ** 2, maxOutputBytes: 256 * 1024 };
const sample = (dataSource: string, solutionStr: string): Sample => ({
  dataSource,
  solutionStr,
  groundTruth: 'good',
  extraInfo: { port, secret, orphan, outside },
});

describe(
  'reward function sandbox',
  { skip: !namespaces && 'no network/PID namespaces on this machine' },
  () => {
    const rewards = new RewardFunctions(
      {
        bySource: {
          py: { kind: 'python', file: join(dir, 'behaviours.py') },
          failing: { kind: 'python', module: 'always_fails', path: [dir] },
          broken: { kind: 'python', file: join(dir, 'broken.py') },
          js: { kind: 'js', file: join(dir, 'behaviours.mjs') },
        },
      },
      { sandbox: { ...limits, processes: 3, python } },
    );
    after(() => rewards.close());

    it('contains each failure, scores it 0 with its reason, and goes on', async () => {
      const cases: [string, string, number, string | undefined, RegExp?][] = [
        ['py', 'good', 1, undefined],
        ['py', 'spin', 0, 'cpu', /more than 1 s of CPU/],
        ['py', 'good', 1, undefined],
        ['py', 'sleep', 0, 'timeout', /within 15000 ms/],
        ['py', 'orphan', 0, 'timeout', /within 15000 ms/],
        ['py', 'allocate', 0, 'memory', /MemoryError/],
        // The jail's own loopback is up, with nothing on it: the worker's is out of reach.
        ['py', 'connect', 0, 'exception', /ConnectionRefusedError: \[Errno 111\] Connection refused/],
        ['py', 'secret', 0, undefined],
        ['py', 'env', 0, 'exception', /^RuntimeError: environment: HOME,LANG,PATH,PWD,TMPDIR /],
        ['py', 'print', 0, 'output', /printed more than 262144 bytes; last output: "x+/],
        ['py', 'raise', 0, 'exception', /^ValueError: no score for you \(behaviours\.py:\d+\)$/],
        ['py', 'exit', 0, 'crash', /exited with code 3/],
        ['py', 'nan', 0, 'bad-result', /returned float 'nan', not a finite number/],
        ['py', 'bad', 0, undefined],
        ['py', 'good', 1, undefined],
      ];
      const batch = await rewards.scoreBatch(cases.map(([source, text]) => sample(source, text)));
      cases.forEach(([source, text, score, reason, message], i) => {
        const result = batch.results[i];
        const where = `${source} ${text}: ${JSON.stringify(result)}`;
        assert.equal(result?.score, score, where);
        assert.equal(result?.failure?.reason, reason, where);
        if (message) assert.match(result?.failure?.message ?? '', message, where);
      });
      assert.equal(connections, 0, 'the loopback server saw a connection');
      // The kernel ends the namespace's other processes as its first one exits: give it a moment.
      let orphanAlive = running(`sleep\0${orphan}\0`);
      for (let i = 0; orphanAlive && i < 50; i++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        orphanAlive = running(`sleep\0${orphan}\0`);
      }
      assert.equal(orphanAlive, false, 'a process the function started outlived it by 5 s');
      assert.deepEqual(batch.failures.byReason, {
        cpu: 1,
        timeout: 2,
        memory: 1,
        exception: 3,
        output: 1,
        crash: 1,
        'bad-result': 1,
      });
      assert.equal(batch.failures.count, 10);
      assert.deepEqual(batch.allFailing, []);
    });

    it('runs in a jail: no capability, its own /proc and root, limits that hold across forks', async () => {
      const [jail, forks, scratch, threadFork, forkAllocate] = (
        await rewards.scoreBatch(
          ['jail', 'fork-many', 'fill-scratch', 'thread-fork-spin', 'fork-allocate'].map((t) =>
            sample('py', t),
          ),
        )
      ).results;
      const facts = JSON.parse(
        /^RuntimeError: jail (\{.*\}) \(behaviours/.exec(jail?.failure?.message ?? '')?.[1] ?? 'null',
      ) as {
        uid: number;
        capEff: string;
        noNewPrivs: string;
        procs: number[];
        root: string[];
        passwd: boolean;
        outside: string;
        own: string;
      } | null;
      assert.ok(facts, `the jail's report: ${JSON.stringify(jail)}`);
      assert.equal(facts.uid, 65534);
      assert.equal(facts.capEff, '0000000000000000');
      assert.equal(facts.noNewPrivs, '1');
      // bwrap's init, the prlimit-turned-interpreter: nothing of the host's.
      assert.ok(
        facts.procs.length <= 3 && facts.procs.includes(1),
        `processes seen: ${facts.procs.join(' ')}`,
      );
      for (const top of ['home', 'var', 'sys', 'boot'])
        assert.ok(!facts.root.includes(top), `the jail's root has /${top}: ${facts.root.join(' ')}`);
      assert.equal(facts.passwd, false, "the host's /etc/passwd is visible");
      assert.equal(facts.outside, 'FileNotFoundError', 'a file outside the function folder');
      assert.match(facts.own, /OSError|PermissionError/, 'the function folder is read-only');
      // As root the cgroup's pids.max holds it (RLIMIT_NPROC does not bind a jail made by root);
      // otherwise RLIMIT_NPROC, or the cgroup where one is delegated.
      assert.equal(forks?.failure?.reason, 'exception', JSON.stringify(forks));
      assert.match(forks?.failure?.message ?? '', /Resource temporarily unavailable/);
      // Three children of 250 MiB, each under the 512 MiB per-process limit: only a cgroup holds
      // the tree to it (and 64 MiB for the jail) (a worker with none, not root and none delegated, has rlimits alone).
      if (cgroupSupport().kind === 'cgroups') {
        assert.equal(forkAllocate?.failure?.reason, 'memory', JSON.stringify(forkAllocate));
        assert.match(
          forkAllocate?.failure?.message ?? '',
          /together used more than 603979776 bytes of memory/,
        );
      }
      assert.equal(scratch?.failure?.reason, 'exception', JSON.stringify(scratch));
      assert.match(scratch?.failure?.message ?? '', /File too large|No space left/);
      assert.equal(threadFork?.failure?.reason, 'cpu', JSON.stringify(threadFork));
    });

    it('reports a function that fails on every sample, with its first error', async () => {
      const batch = await rewards.scoreBatch([
        sample('failing', 'a'),
        sample('py', 'good'),
        sample('failing', 'b'),
      ]);
      assert.deepEqual(
        batch.results.map((r) => r.score),
        [0, 1, 0],
      );
      assert.equal(batch.allFailing.length, 1);
      const [failing] = batch.allFailing;
      assert.equal(failing?.function, 'python:always_fails');
      assert.equal(failing?.samples, 2);
      assert.equal(failing?.reason, 'exception');
      assert.match(failing?.message ?? '', /^ZeroDivisionError: division by zero \(always_fails\.py:2\)$/);
      assert.equal(batch.failures.first?.index, 0);
    });

    it('a function that cannot load fails every sample at once with the load error', async () => {
      const started = Date.now();
      const batch = await rewards.scoreBatch(Array.from({ length: 20 }, () => sample('broken', 'x')));
      assert.equal(batch.failures.count, 20);
      assert.deepEqual(batch.failures.byReason, { start: 20 });
      assert.equal(batch.allFailing[0]?.samples, 20);
      assert.match(batch.allFailing[0]?.message ?? '', /could not load the function: SyntaxError/);
      assert.ok(Date.now() - started < 15_000, 'a broken function is not restarted per sample');
    });

    it('JavaScript functions get the same limits and environment', async () => {
      const cases: [string, number, string | undefined, RegExp?][] = [
        ['good', 1, undefined],
        ['spin', 0, 'cpu'],
        ['secret', 0, undefined],
        ['env', 0, 'exception', /^Error: environment: HOME,LANG,PATH,PWD,TMPDIR /],
        ['allocate', 0, 'memory'],
        ['good', 1, undefined],
      ];
      const results = await Promise.all(
        cases.map(([text]) => rewards.score('js', text, 'good', { port, secret })),
      );
      cases.forEach(([text, score, reason, message], i) => {
        const where = `js ${text}: ${JSON.stringify(results[i])}`;
        assert.equal(results[i]?.score, score, where);
        assert.equal(results[i]?.failure?.reason, reason, where);
        if (message) assert.match(results[i]?.failure?.message ?? '', message, where);
      });
    });
  },
);

describe('the cgroup of a worker process', () => {
  it('is a cgroup path the operator names; another value is refused, naming it', () => {
    for (const bad of ['moerl', '/a/../b', '/a/./b', '/a b', '/'])
      assert.deepEqual(cgroupSupport({ MOERL_REWARD_CGROUP: bad }), {
        kind: 'broken',
        why: `MOERL_REWARD_CGROUP=${bad} must be a cgroup path such as /moerl-rewards (no "." or ".." parts)`,
      });
  });

  // After the suite above has closed its pool, so no other pool of this process starts one.
  it("removes each worker process's cgroup once the process is gone", async (t) => {
    const support = cgroupSupport();
    if (support.kind !== 'cgroups') return t.skip('no cgroups: not root, and MOERL_REWARD_CGROUP is not set');
    const own = () =>
      new Set(
        support.base.dirs.flatMap((d) => readdirSync(d).filter((n) => n.startsWith(`w${process.pid}-`))),
      );
    const before = own();
    const pool = new RewardFunctions(
      { bySource: { py: { kind: 'python', file: join(dir, 'behaviours.py') } } },
      { sandbox: { ...limits, processes: 2, python } },
    );
    t.after(() => pool.close()); // a failed assertion must not leave its processes holding the file open
    assert.deepEqual(
      (await pool.scoreBatch([sample('py', 'good'), sample('py', 'exit')])).results.map((r) => r.score),
      [1, 0],
    );
    const made = [...own()].filter((n) => !before.has(n));
    assert.ok(made.length > 0, 'each live worker process has a cgroup');
    pool.close();
    const left = () => made.filter((n) => own().has(n));
    for (let i = 0; left().length > 0 && i < 50; i++)
      await new Promise((resolve) => setTimeout(resolve, 100));
    assert.deepEqual(left(), [], 'cgroups left behind');
  });

  it('is made under the cgroup named, by a worker that may write it (root here)', (t) => {
    if (process.getuid?.() !== 0) return t.skip('not root: no cgroup this test may write');
    const named = `/moerl-test-${process.pid}`;
    const support = cgroupSupport({ MOERL_REWARD_CGROUP: named });
    assert.equal(support.kind, 'cgroups', JSON.stringify(support));
    if (support.kind !== 'cgroups') return;
    for (const d of support.base.dirs) {
      assert.ok(d.endsWith(named), d);
      rmdirSync(d);
    }
  });
});

describe('the default isolation', () => {
  it('is namespaces: a pool starts where they exist, and is refused where they do not', () => {
    const start = () => userFunctionPool({ kind: 'python', file: join(dir, 'behaviours.py') }, { python });
    if (namespaces) {
      start().close();
    } else {
      assert.throws(
        start,
        (err: unknown) => err instanceof BadInputError && /isolation to none/.test(err.message),
      );
    }
  });
});

describe('reward function sandbox with isolation "none"', () => {
  it('keeps the environment and the limits, and (as documented) not the network', async () => {
    const pool = userFunctionPool(
      { kind: 'python', file: join(dir, 'behaviours.py') },
      { ...limits, python, isolation: 'none', processes: 2 },
    );
    try {
      const call = (text: string) =>
        pool.call({
          data_source: 'x',
          solution_str: text,
          ground_truth: 'good',
          extra_info: { port, secret },
        });
      const [env, spin, good] = await Promise.all([call('env'), call('spin'), call('good')]);
      assert.equal(env.ok ? 'ok' : env.reason, 'exception');
      assert.match(env.ok ? '' : env.message, /^RuntimeError: environment: HOME,LANG,PATH,PWD,TMPDIR /);
      assert.equal(spin.ok ? 'ok' : spin.reason, 'cpu');
      assert.deepEqual(good, { ok: true, value: 1 });
      const before = connections;
      assert.deepEqual(await call('connect'), { ok: true, value: 1 });
      for (let i = 0; connections === before && i < 50; i++) await new Promise((r) => setTimeout(r, 100));
      assert.equal(connections, before + 1, 'without namespaces the loopback server is reachable');
    } finally {
      pool.close();
    }
  });

  it('ends a process the function started in a session of its own', async () => {
    const pool = userFunctionPool(
      { kind: 'python', file: join(dir, 'behaviours.py') },
      { ...limits, timeoutMs: 3000, python, isolation: 'none', processes: 1 },
    );
    const noneOrphan = String(8000 + (process.pid % 1000) + 0.5);
    try {
      const result = await pool.call({
        data_source: 'x',
        solution_str: 'orphan',
        ground_truth: 'good',
        extra_info: { orphan: noneOrphan },
      });
      assert.equal(result.ok ? 'ok' : result.reason, 'timeout');
    } finally {
      pool.close();
    }
    let alive = running(`sleep\0${noneOrphan}\0`);
    for (let i = 0; alive && i < 50; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      alive = running(`sleep\0${noneOrphan}\0`);
    }
    assert.equal(alive, false, 'a process the function started with setsid outlived its sample by 5 s');
  });
});
