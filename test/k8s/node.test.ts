// A real node (kube-node.ts: containerd, runc, CNI bridge, kubelet, CoreDNS) joined to the test
// control plane, running the moerl image built by scripts/build-image.sh: the native tools run
// in pods, two ranks of an Indexed Job find rank 0 through the headless Service's DNS name and
// run the EP benchmark over libfabric tcp between their pods, a graceful delete reaches the
// container as SIGTERM, and neither stop() nor the clean-up after a killed test process leaves
// anything on the host.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  BatchV1Api,
  CoreV1Api,
  Watch,
  type V1Container,
  type V1EnvVar,
  type V1Pod,
  type V1PodSpec,
  type V1SeccompProfile,
} from '@kubernetes/client-node';
import { repoRoot } from '../../cli/temporal-tools.js';
import { startKubeCluster, waitFor, type KubeCluster } from '../support/kube-cluster.js';
import { nodeUnsupportedReason, startKubeNode, type KubeNode } from '../support/kube-node.js';
import { reapStaleNodes } from '../support/kube-node-host.js';

const run = promisify(execFile);
const skip = nodeUnsupportedReason();

describe('a real Kubernetes node', { skip }, () => {
  let cluster: KubeCluster;
  let node: KubeNode;
  let core: CoreV1Api;
  let batch: BatchV1Api;
  let image: string;
  let namespace: string;

  before(async () => {
    let started = Date.now();
    const built = await run('bash', [join(repoRoot(), 'scripts', 'build-image.sh'), 'moerl'], {
      timeout: 600_000,
    });
    const [ref, archive] = built.stdout.trim().split(' ');
    assert.ok(ref && archive, `scripts/build-image.sh printed "${built.stdout}"`);
    image = ref;
    console.log(`# moerl image ${ref} built in ${Date.now() - started} ms`);
    cluster = await startKubeCluster({ kwok: false });
    started = Date.now();
    node = await startKubeNode(cluster, { images: [archive] });
    console.log(`# node ${node.name} Ready in ${Date.now() - started} ms (image import included)`);
    core = cluster.kubeConfig().makeApiClient(CoreV1Api);
    batch = cluster.kubeConfig().makeApiClient(BatchV1Api);
    namespace = await cluster.createNamespace('node');
  });
  after(async () => {
    await node?.stop();
    await cluster?.stop();
  });

  const podSpec = (command: string[], extra: Partial<V1PodSpec> = {}, env: V1EnvVar[] = []): V1PodSpec => ({
    restartPolicy: 'Never',
    automountServiceAccountToken: false,
    nodeName: node.name,
    containers: [{ name: 'main', image, imagePullPolicy: 'Never', command, env }],
    ...extra,
  });

  async function podPhase(name: string, phases: string[], timeoutMs = 120_000): Promise<V1Pod> {
    let pod: V1Pod | undefined;
    await waitFor(`pod ${name} in ${phases.join('/')}`, timeoutMs, async () => {
      pod = await core.readNamespacedPod({ namespace, name });
      return phases.includes(pod.status?.phase ?? '') ? true : `phase ${pod.status?.phase}`;
    });
    return pod!;
  }

  it('runs the native trainer of the moerl image in a pod, as the image user', async () => {
    const started = Date.now();
    await core.createNamespacedPod({
      namespace,
      body: { metadata: { name: 'tool' }, spec: podSpec(['/app/native/build/bin/moe_train', '--help']) },
    });
    const pod = await podPhase('tool', ['Succeeded', 'Failed']);
    console.log(`# pod start to completion: ${Date.now() - started} ms`);
    const logs = node.containerLog(namespace, 'tool');
    assert.equal(pod.status?.phase, 'Succeeded', `pod failed; logs:\n${logs}`);
    assert.match(logs, /Usage: moe_train/);

    await core.createNamespacedPod({
      namespace,
      body: {
        metadata: { name: 'whoami' },
        spec: podSpec(['/usr/local/bin/node', '-p', 'process.getuid()']),
      },
    });
    await podPhase('whoami', ['Succeeded', 'Failed']);
    assert.equal(node.containerLog(namespace, 'whoami').trim(), '65532');
  });

  it('two ranks of an Indexed Job find rank 0 by DNS and exchange tokens over libfabric tcp', async () => {
    const job = 'ep';
    const service = 'ep-ranks';
    await core.createNamespacedService({
      namespace,
      body: {
        metadata: { name: service },
        spec: {
          clusterIP: 'None',
          // Ranks start together: rank 0's name must resolve before it is Ready.
          publishNotReadyAddresses: true,
          selector: { 'batch.kubernetes.io/job-name': job },
          ports: [{ name: 'coordinator', port: 29500 }],
        },
      },
    });
    const started = Date.now();
    await batch.createNamespacedJob({
      namespace,
      body: {
        metadata: { name: job },
        spec: {
          completionMode: 'Indexed',
          completions: 2,
          parallelism: 2,
          backoffLimit: 0,
          template: {
            spec: podSpec(
              [
                '/app/native/build/bin/ep_bench',
                ...['--provider', 'tcp', '--tokens', '64', '--hidden', '64', '--experts', '4', '--topk', '2'],
                ...['--dtype', 'bf16', '--warmup', '1', '--iters', '2', '--json'],
              ],
              // Through the scheduler, as the launcher's pods go (the other pods name the node).
              { subdomain: service, nodeName: undefined },
              [
                {
                  name: 'MOERL_RANK',
                  valueFrom: {
                    fieldRef: {
                      fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                    },
                  },
                },
                { name: 'MOERL_WORLD_SIZE', value: '2' },
                { name: 'MOERL_COORDINATOR', value: `${job}-0.${service}:29500` },
                { name: 'MOERL_FI_PROVIDER', value: 'tcp' },
              ],
            ),
          },
        },
      },
    });
    await waitFor(`job ${job} to finish`, 180_000, async () => {
      const status = (await batch.readNamespacedJob({ namespace, name: job })).status;
      const done = status?.conditions?.find(
        (c) => (c.type === 'Complete' || c.type === 'Failed') && c.status === 'True',
      );
      return done ? true : `succeeded=${status?.succeeded ?? 0} failed=${status?.failed ?? 0}`;
    });
    console.log(`# 2-rank EP job created to complete: ${Date.now() - started} ms`);
    const pods = await core.listNamespacedPod({
      namespace,
      labelSelector: `batch.kubernetes.io/job-name=${job}`,
    });
    const logs = pods.items.map((pod) => {
      const name = pod.metadata!.name!;
      return { name, phase: pod.status?.phase, log: node.containerLog(namespace, name) };
    });
    for (const l of logs) assert.equal(l.phase, 'Succeeded', `${l.name} ${l.phase}:\n${l.log}`);
    for (const pod of pods.items) assert.equal(pod.spec?.nodeName, node.name, 'scheduled onto the real node');
    const rank0 = logs.find((l) => l.name.startsWith(`${job}-0-`));
    assert.ok(rank0, `no pod of index 0 among ${logs.map((l) => l.name).join(', ')}`);
    const report = JSON.parse(rank0.log.trim().split('\n').at(-1)!) as {
      ranks: number;
      fi_provider: string;
      dispatch_gbps: number;
    };
    assert.equal(report.ranks, 2);
    assert.match(report.fi_provider, /^tcp/);
    assert.ok(report.dispatch_gbps > 0, `dispatch bandwidth ${report.dispatch_gbps}`);
  });

  it('delivers SIGTERM to the container when its pod is deleted gracefully', async () => {
    const name = 'graceful';
    const script = [
      "process.on('SIGTERM', () => {",
      "  require('fs').writeFileSync('/dev/termination-log', 'got SIGTERM');",
      '  process.exit(0);',
      '});',
      "console.log('waiting');",
      'setInterval(() => {}, 60000);',
    ].join('\n');
    const created = await core.createNamespacedPod({
      namespace,
      body: {
        metadata: { name },
        spec: podSpec(['/usr/local/bin/node', '-e', script], { terminationGracePeriodSeconds: 60 }),
      },
    });
    await podPhase(name, ['Running']);
    await waitFor(`pod ${name} to install its handler`, 30_000, async () =>
      node.containerLog(namespace, name).includes('waiting') ? true : 'no output yet',
    );
    // The final state arrives with the DELETED event: the kubelet removes the pod only after
    // it has reported every container terminated.
    const final = new Promise<V1Pod>((done, fail) => {
      void new Watch(cluster.kubeConfig())
        .watch(
          `/api/v1/namespaces/${namespace}/pods`,
          { fieldSelector: `metadata.name=${name}`, resourceVersion: created.metadata?.resourceVersion },
          (type, pod: V1Pod) => {
            if (type === 'DELETED') done(pod);
          },
          (err) => (err ? fail(err as Error) : undefined),
        )
        .catch(fail);
    });
    const deleted = Date.now();
    await core.deleteNamespacedPod({ namespace, name, gracePeriodSeconds: 60 });
    const pod = await final;
    const elapsed = Date.now() - deleted;
    console.log(`# graceful delete to pod gone: ${elapsed} ms`);
    const terminated = pod.status?.containerStatuses?.[0]?.state?.terminated;
    assert.equal(terminated?.exitCode, 0, JSON.stringify(pod.status?.containerStatuses));
    assert.equal(terminated?.message, 'got SIGTERM');
    // Well inside the 60 s grace period: the container ended on the signal, not on SIGKILL.
    assert.ok(elapsed < 30_000, `${elapsed} ms from delete to gone`);
  });

  it("runs reward code in bwrap's jail in a restricted pod with the shipped seccomp profile, and refuses it under RuntimeDefault", async () => {
    // The kubelet reads Localhost profiles below its root; on a cluster the profile is installed
    // there by k8s/seccomp (docs/operations.md).
    const profiles = join(node.dir, 'kubelet', 'seccomp', 'moerl');
    mkdirSync(profiles, { recursive: true });
    writeFileSync(
      join(profiles, 'rewards.json'),
      readFileSync(join(repoRoot(), 'k8s', 'seccomp', 'rewards.json')),
    );
    const restricted = await cluster.createNamespace('restricted');
    const label = await cluster.kubectl([
      'label',
      'namespace',
      restricted,
      'pod-security.kubernetes.io/enforce=restricted',
    ]);
    assert.equal(label.code, 0, label.stderr);
    // What a campaign's JavaScript reward function would try, scored by the worker's own pool.
    const behaviours = `import fs from 'node:fs';
import net from 'node:net';
import { spawn } from 'node:child_process';
export async function compute_score(dataSource, solution, truth, extra) {
  if (solution === 'jail')
    throw new Error('jail ' + JSON.stringify({
      uid: process.getuid(),
      procs: fs.existsSync('/proc') ? fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p)) : [],
      root: fs.readdirSync('/').sort(),
      passwd: fs.existsSync('/etc/passwd'),
      workerCode: fs.existsSync('/app/node_modules') || fs.existsSync('/app/dist/workers'),
      neighbour: fs.existsSync('/tmp/runtime-default'),
    }));
  if (solution === 'connect')
    await new Promise((done, fail) => net.connect(extra.port, '127.0.0.1', done).on('error', fail));
  if (solution === 'secret') {
    let seen = Object.values(process.env).join(' ');
    for (const pid of fs.existsSync('/proc') ? fs.readdirSync('/proc') : [])
      try { seen += fs.readFileSync('/proc/' + pid + '/environ', 'utf8'); } catch {}
    return seen.includes(extra.secret) ? 1 : 0;
  }
  if (solution === 'fork-many')
    for (let i = 0; i < 100; i++)
      await new Promise((done, fail) => spawn('sleep', ['30']).on('spawn', done).on('error', fail));
  if (solution === 'fork-spin') {
    spawn(process.execPath, ['-e', 'for (;;);']);
    await new Promise(() => {});
  }
  if (solution === 'fill-scratch') {
    const fd = fs.openSync('fill', 'w');
    for (let i = 0; i < 100; i++) fs.writeSync(fd, Buffer.alloc(1024 * 1024));
  }
  return solution === truth;
}
`;
    // A user's Python function that needs the reward environment's packages (sympy).
    const pythonFunction = `import sympy

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth and sympy.Rational(2, 4) == sympy.Rational(1, 2))
`;
    const cases = ['good', 'jail', 'connect', 'secret', 'fork-many', 'fill-scratch', 'fork-spin'];
    const script = `import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
const { RewardFunctions } = await import('/app/dist/activities/rewards/functions.js');
const fn = '/tmp/' + process.env.MOERL_TEST_CONTAINER;
mkdirSync(fn);
writeFileSync(fn + '/behaviours.mjs', ${JSON.stringify(behaviours)});
writeFileSync(fn + '/score.py', ${JSON.stringify(pythonFunction)});
let connections = 0;
const server = createServer((socket) => { connections++; socket.resume(); socket.end(); });
await new Promise((done) => server.listen(0, '127.0.0.1', done));
const extra = { port: server.address().port, secret: process.env.MOERL_TEST_SECRET };
let report;
try {
  const rewards = new RewardFunctions(
    { bySource: { js: { kind: 'js', file: fn + '/behaviours.mjs' }, py: { kind: 'python', file: fn + '/score.py' }, math: { kind: 'math' } } },
    { sandbox: { timeoutMs: 30000, cpuSeconds: 2, pids: 32, processes: 2 } },
  );
  const samples = ${JSON.stringify(cases)}.map((solutionStr) => ({ dataSource: 'js', solutionStr, groundTruth: 'good', extraInfo: extra }));
  // The image's own Python: a user's function on the reward environment, and the math verifier.
  samples.push({ dataSource: 'py', solutionStr: 'good', groundTruth: 'good', extraInfo: {} });
  samples.push({ dataSource: 'math', solutionStr: 'so \\\\boxed{\\\\frac{1}{2}}', groundTruth: '0.5', extraInfo: {} });
  report = { results: (await rewards.scoreBatch(samples)).results };
  await rewards.close();
} catch (err) {
  report = { refused: err.name + ': ' + err.message };
}
console.log('REPORT ' + JSON.stringify({ ...report, connections }));
server.close();
`;
    const secret = `s3cret-${Date.now()}`;
    // Both containers as the rollout worker's (k8s/base/workers/rollout/deployment.yaml), but
    // for the seccomp profile.
    const container = (name: string, seccompProfile: V1SeccompProfile): V1Container => ({
      name,
      image,
      imagePullPolicy: 'Never',
      command: ['/usr/local/bin/node', '--input-type=module', '-e', script],
      env: [
        { name: 'MOERL_TEST_SECRET', value: secret },
        { name: 'MOERL_TEST_CONTAINER', value: name },
      ],
      securityContext: {
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        capabilities: { drop: ['ALL'] },
        seccompProfile,
      },
      volumeMounts: [{ name: 'tmp', mountPath: '/tmp' }],
    });
    await core.createNamespacedPod({
      namespace: restricted,
      body: {
        metadata: { name: 'rewards' },
        spec: {
          ...podSpec([]),
          securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532 },
          containers: [
            container('localhost', { type: 'Localhost', localhostProfile: 'moerl/rewards.json' }),
            container('runtime-default', { type: 'RuntimeDefault' }),
          ],
          volumes: [{ name: 'tmp', emptyDir: {} }],
        },
      },
    });
    let pod: V1Pod | undefined;
    await waitFor('pod rewards to end', 180_000, async () => {
      pod = await core.readNamespacedPod({ namespace: restricted, name: 'rewards' });
      return ['Succeeded', 'Failed'].includes(pod.status?.phase ?? '') ? true : `phase ${pod.status?.phase}`;
    });
    const report = (name: string) => {
      const log = node.containerLog(restricted, 'rewards', name);
      const line = log.split('\n').find((l) => l.includes('REPORT '));
      assert.ok(line, `container ${name} printed no report:\n${log}`);
      return JSON.parse(line.slice(line.indexOf('REPORT ') + 7)) as {
        refused?: string;
        results?: { score: number; failure?: { reason: string; message: string } }[];
        connections: number;
      };
    };
    // The runtime's default profile refuses user namespaces: the worker refuses reward code and
    // says why, rather than run it in a weaker jail.
    const refused = report('runtime-default');
    assert.match(
      refused.refused ?? '',
      /BadInputError: reward function js:.*the reward sandbox cannot start on this worker \(bwrap could not make the jail: .*namespace/,
    );
    assert.match(refused.refused ?? '', /MOERL_REWARD_ISOLATION=none/);

    const jailed = report('localhost');
    assert.ok(jailed.results, `refused with the shipped profile: ${jailed.refused}`);
    const [good, jail, connect, leaked, forks, scratch, forkSpin, python, math] = jailed.results;
    const where = JSON.stringify(jailed.results);
    assert.equal(good?.score, 1, where);
    // What the jail is, not only what fails in it: a silent fallback would fail here.
    const facts = JSON.parse(/^Error: jail (\{.*\})/.exec(jail?.failure?.message ?? '')?.[1] ?? 'null') as {
      uid: number;
      procs: string[];
      root: string[];
      passwd: boolean;
      workerCode: boolean;
      neighbour: boolean;
    } | null;
    assert.ok(facts, `the jail's report: ${where}`);
    assert.equal(facts.uid, 65534, 'uid 65534 of its own user namespace, not the image user 65532');
    assert.ok(facts.procs.length <= 3, `processes seen: ${facts.procs.join(' ')}`);
    // Its root holds the system's /usr, the runner's and the function's folders, read-only.
    for (const top of ['home', 'var', 'proc', 'root'])
      assert.ok(!facts.root.includes(top), `the jail's root has /${top}: ${facts.root.join(' ')}`);
    assert.equal(facts.workerCode, false, "the worker's own code is visible");
    assert.equal(facts.neighbour, false, 'a folder beside the function is visible');
    assert.equal(facts.passwd, false, "the image's /etc/passwd is visible");
    assert.equal(connect?.failure?.reason, 'exception', where);
    assert.equal(jailed.connections, 0, "the worker's loopback server was reached");
    assert.equal(leaked?.score, 0, "the worker's environment reached the function");
    assert.match(forks?.failure?.message ?? '', /EAGAIN|spawn/, where);
    assert.match(scratch?.failure?.message ?? '', /EFBIG|ENOSPC|File too large|no space/i, where);
    // CPU time counts across the tree: a child's spin ends the sample.
    assert.equal(forkSpin?.failure?.reason, 'cpu', where);
    // The image carries the reward functions' Python (MOERL_REWARD_PYTHON).
    assert.equal(python?.score, 1, where);
    assert.equal(math?.score, 1, where);
  });

  it('stop() removes the containers, mounts, network namespaces, bridge and cgroups', async () => {
    await node.stop();
    await assertNodeGone(node);
  });

  it('a node whose test process was killed is torn down by the next start', async () => {
    const child = spawn(
      process.execPath,
      [fileURLToPath(new URL('../support/kube-node-child.js', import.meta.url))],
      {
        env: {
          ...process.env,
          MOERL_TEST_CLUSTER: JSON.stringify({
            server: cluster.server,
            kubeconfig: cluster.kubeconfig,
            ca: cluster.ca,
          }),
        },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const exited = new Promise((done) => child.once('exit', done));
    const orphan = await new Promise<{ name: string; dir: string; bridge: string }>((done, fail) => {
      let out = '';
      child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
        out += chunk;
        if (out.includes('\n'))
          done(JSON.parse(out.split('\n')[0]!) as { name: string; dir: string; bridge: string });
      });
      void exited.then(() => fail(new Error('the node process exited before its node was Ready')));
    });
    try {
      const pod = 'orphan';
      // The child's node has the pause image only (startKubeNode imports it on every node).
      const pause = readFileSync(join(repoRoot(), '.moerl', 'images', 'moerl-pause.ref'), 'utf8').trim();
      const spec = podSpec(['/pause']);
      spec.containers[0]!.image = pause;
      await core.createNamespacedPod({
        namespace,
        body: { metadata: { name: pod }, spec: { ...spec, nodeName: orphan.name } },
      });
      await podPhase(pod, ['Running'], 60_000);
    } catch (err) {
      child.kill('SIGKILL');
      await exited;
      await reapStaleNodes();
      throw err;
    }
    // SIGKILL: no clean-up runs. The kubelet, CoreDNS and containerd get their parent-death
    // signal; the shims and the pod's processes live on, as after a crashed test process.
    child.kill('SIGKILL');
    await exited;
    assert.notDeepEqual(processesReferring(orphan.dir), [], 'the pod outlived its node process, as it would');
    const started = Date.now();
    await reapStaleNodes();
    console.log(`# stale node torn down in ${Date.now() - started} ms`);
    await assertNodeGone(orphan);
  });
});

async function assertNodeGone(node: { dir: string; name: string; bridge: string }): Promise<void> {
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.includes(node.dir));
  assert.deepEqual(mounts, []);
  assert.equal(existsSync(node.dir), false);
  const links = (await run('ip', ['-o', 'link', 'show'])).stdout;
  assert.equal(links.includes(`${node.bridge}:`), false, `bridge ${node.bridge} still there`);
  assert.deepEqual(processesReferring(node.dir), [], 'processes still referring to the node folder');
  for (const hierarchy of ['memory', 'cpu', 'pids', 'systemd']) {
    const left = readdirSync(`/sys/fs/cgroup/${hierarchy}`).filter((entry) => entry.includes(node.name));
    assert.deepEqual(left, [], `cgroups left in ${hierarchy}`);
  }
}

// Shims name the node's containerd socket; pod processes live in its cgroups (checked above).
function processesReferring(dir: string): string[] {
  return readdirSync('/proc')
    .filter((pid) => /^\d+$/.test(pid))
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(dir);
      } catch {
        return false;
      }
    });
}
