// An EP job is a gang (issue 19), on a real node: the trainer ranks of a tiny campaign's updates
// run at EP 4 as pods of the moerl image (kube-node.ts), and pods of an update are force-deleted
// (`kubectl delete pod --force --grace-period=0`) while the ranks meet at rank 0 (the rendezvous),
// while they train, or after training while one rank has not stored its outputs yet. The update
// must complete without a retry, commit the same bytes as a fault-free run, count each fault's
// restart once, and never end as bad input (exit 2, FailJob). test/k8s/gang.test.ts checks the
// Job's rules with kwok's fake pods; this file what the rank program, the native bootstrap, the
// kubelet and the cluster DNS do with them. The last case failed before the ranks held their
// group until every rank's outputs were stored: the lost rank's replacement ran alone, its
// peers having exited 0, and waited for them until its start-up deadline.
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, Watch, type V1Job, type V1Pod } from '@kubernetes/client-node';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import { rankWorkDir } from '../../activities/launch/kubernetes/manifests.js';
import { openStore } from '../../activities/store/index.js';
import type { UpdateOutput } from '../../activities/types.js';
import type { CampaignSpecInput } from '../../workflows/spec.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, tinyRealSpec, withWorkers } from '../support/campaign-harness.js';
import {
  checkpointHashes,
  finishedCampaign,
  hostBlasEnv,
  startNodeCampaignEnv,
  type NodeCampaignEnv,
} from '../support/node-campaign.js';
import type { KubeCluster } from '../support/kube-cluster.js';
import { nodeUnsupportedReason } from '../support/kube-node.js';
import type { TestEnvironment } from '../support/temporal.js';

// In CI a machine that cannot run the node fails the suite instead of skipping it.
const skip = process.env.CI === 'true' ? undefined : nodeUnsupportedReason();

const worldSize = 4;

/**
 * Where in an update the pods go: while the ranks meet at rank 0; once the group has formed
 * (these updates train for about a second on this machine and the kubelet takes about as long
 * to stop a pod, so the loss lands in training or in the wait for the outputs after it); or
 * once training is over, the lost rank's program held up (SIGSTOP) before it has stored its
 * outputs while its peers store theirs, as a slow upload would.
 */
type Moment = 'rendezvous' | 'training' | 'after training';
interface Fault {
  iteration: number;
  pods: number;
  moment: Moment;
}

describe('an EP 4 update is a gang on a real node', { skip }, () => {
  let env: NodeCampaignEnv;
  let cluster: KubeCluster;
  let t: TestEnvironment;
  let core: CoreV1Api;
  let image: string;
  let namespace: string;
  let dir: string;
  let storePath: string;

  before(async () => {
    env = await startNodeCampaignEnv('gang', { node: { logDir: process.env.GANG_LOGS } });
    ({ cluster, t, image, namespace, dir, storePath } = env);
    core = cluster.kubeConfig().makeApiClient(CoreV1Api);
  });
  after(() => env?.stop());

  // Four updates at EP 4 (one expert per rank) of a policy that an SFT warm start has taught
  // the `add` task a little, so that every update has groups with unequal rewards to train on
  // (the untrained tiny policy scores 0 everywhere, and its updates skip every step); 24 epochs
  // of 4 minibatches (96 steps). On a CPU without AVX-512 (the kernels round differently) the
  // policy of 300 SFT steps scored 0 on every prompt of update 4, at the default learning rate
  // and at a third of it, and that update skipped: 600 steps and the gentler rate. The campaign
  // is deterministic on one CPU: should a change of the model make an update of this spec skip,
  // the first assertion says so.
  const spec = (name: string, launcher: CampaignSpecInput['launcher']) =>
    tinyRealSpec(name, dir, {
      task: { builtin: 'add' },
      model: { layers: 2, hidden: 64, heads: 4, experts: worldSize, topK: 2, contextLength: 32 },
      sftWarmStartSteps: 600,
      retention: { keepLast: 5, keepBest: true }, // every checkpoint kept, to compare
      iterations: 4,
      promptsPerIteration: 32,
      epWorldSize: worldSize,
      launcher,
      hyperparameters: { maxNewTokens: 10, minibatches: 4, epochs: 24, lr: 1e-4 },
      orchestration: { rolloutHeartbeatSeconds: 10, updateHeartbeatSeconds: 10 },
    });

  /** Runs the campaign; returns its id, result, state and each update's output by iteration. */
  async function runCampaign(name: string, launcher: CampaignSpecInput['launcher'], faults: Fault[] = []) {
    const activities = createActivities(
      workerActivityDeps(env.signal, {
        ...process.env,
        KUBECONFIG: cluster.kubeconfig,
        MOERL_CACHE_DIR: join(dir, `cache-${name}`),
      }),
    );
    const updates = new Map<number, UpdateOutput>();
    const recorded = {
      ...activities,
      updatePolicy: async (input: Parameters<typeof activities.updatePolicy>[0]) => {
        const out = await activities.updatePolicy(input);
        updates.set(input.iteration, out);
        return out;
      },
    };
    const started = Date.now();
    return withWorkers(t.nativeConnection, t.namespace, recorded, async (queues) => {
      const handle = await startCampaign(t.client, spec(name, launcher), queues);
      const injecting = injectFaults(faults);
      injecting.catch(() => undefined); // awaited below, once the campaign has ended
      let result;
      try {
        result = await finishedCampaign(handle, 300_000);
      } finally {
        halted = true; // a campaign that failed leaves no injector waiting for its updates
      }
      await injecting;
      console.log(`# campaign ${name}: ${Date.now() - started} ms`);
      return { id: handle.workflowId, result, state: await handle.query<CampaignState>('status'), updates };
    });
  }

  /** Set once the campaign has ended: the injector stops waiting. */
  let halted = false;
  const notHalted = () => {
    if (halted) throw new Error('the campaign ended before this fault');
  };

  /** Force-deletes the pods each fault names, in each update's job, at its moment. */
  async function injectFaults(faults: Fault[]): Promise<void> {
    halted = false;
    for (const fault of faults) {
      const job = await updateJob(fault.iteration);
      const victims = new Set<number>();
      while (victims.size < fault.pods) victims.add(randomInt(worldSize));
      const at = await moment(job, fault.moment, victims);
      const pods = (await core.listNamespacedPod({ namespace, labelSelector: `moerl.dev/job=${job}` })).items;
      const targets = pods.filter(
        (p) => victims.has(rank(p)) && !p.metadata?.deletionTimestamp && p.status?.phase !== 'Failed',
      );
      await Promise.all(
        targets.map((p) =>
          core.deleteNamespacedPod({ namespace, name: p.metadata!.name!, gracePeriodSeconds: 0 }),
        ),
      );
      console.log(
        `# update ${fault.iteration}: force-deleted ${targets.map((p) => `rank ${rank(p)} (${p.status?.phase})`).join(', ')} ` +
          `${fault.moment === 'after training' ? 'after' : 'during'} ${fault.moment.replace('after ', '')}: ${at}`,
      );
    }
  }

  /** The name of the update job of `iteration`, once its pods exist. */
  async function updateJob(iteration: number): Promise<string> {
    for (const deadline = Date.now() + 240_000; ; await sleep(200)) {
      notHalted();
      const pods = (
        await core.listNamespacedPod({ namespace, labelSelector: `moerl.dev/iteration=${iteration}` })
      ).items;
      const name = pods.map((p) => p.metadata?.labels?.['moerl.dev/job'] ?? '').find((j) => /-u\d+-/.test(j));
      if (name) return name;
      if (Date.now() > deadline) throw new Error(`no pods of update ${iteration} after 240 s`);
    }
  }

  /** Waits for the moment of `job`'s ranks; returns what rank 0's bootstrap looked like then. */
  async function moment(job: string, when: Moment, victims: Set<number>): Promise<string> {
    if (when === 'after training') return afterTraining(job, victims);
    let seen = '';
    await pollFast(`the ${when} of job ${job}`, 120_000, () => {
      notHalted();
      const ranks = rankProcesses(job);
      const rank0 = ranks.get(0);
      const listening = rank0 === undefined ? null : coordinatorSockets(rank0);
      seen =
        `ranks ${[...ranks.keys()].sort().join(',') || 'none'} in moe_train, rank 0 ` +
        (listening === null
          ? 'not yet'
          : listening.listening
            ? `listening, ${listening.peers} peer(s) in`
            : `not listening, ${listening.peers} peer(s) in`);
      const formed = listening !== null && !listening.listening && listening.peers === worldSize - 1;
      return when === 'rendezvous' ? ranks.size > 0 && !formed : formed;
    });
    // Into the steps by up to a second (a step of this policy takes tenths of one).
    if (when === 'training') await sleep(randomInt(1000));
    return seen;
  }

  /**
   * Stops the victims' rank programs (SIGSTOP, from this host) once their moe_train runs, so
   * that they never store their outputs; waits until their moe_train has written its checkpoint,
   * then 3 s more, in which the other ranks store theirs and, unless the group waits for
   * every rank's outputs, exit 0.
   */
  async function afterTraining(job: string, victims: Set<number>): Promise<string> {
    const stopped = new Map<number, number>();
    await pollFast(`the moe_train of rank(s) ${[...victims].join(', ')} of job ${job}`, 120_000, () => {
      notHalted();
      for (const [r, pid] of rankProcesses(job))
        if (victims.has(r) && !stopped.has(r)) {
          const program = parentOf(pid);
          process.kill(program, 'SIGSTOP');
          stopped.set(r, pid);
        }
      return stopped.size === victims.size;
    });
    await pollFast(`the checkpoint of rank(s) ${[...victims].join(', ')}`, 120_000, () => {
      notHalted();
      return [...stopped.values()].every((pid) => checkpointWritten(pid));
    });
    await sleep(3000);
    const pods = (await core.listNamespacedPod({ namespace, labelSelector: `moerl.dev/job=${job}` })).items;
    return `the other ranks ${pods
      .filter((p) => !victims.has(rank(p)))
      .map((p) => `${rank(p)} ${p.status?.phase}`)
      .join(', ')}`;
  }

  it('force-deleted pods, one or two at a time, in the rendezvous or in training: each update completes once, as a fault-free run does', async () => {
    const reference = await runCampaign('gang-reference', { kind: 'local' });
    assert.equal(reference.result.committedIteration, 4);
    for (const [iteration, out] of reference.updates)
      assert.equal(
        out.metrics.step,
        95,
        `update ${iteration} trained every step: ${JSON.stringify(out.metrics)}`,
      );

    const faults: Fault[] = [
      { iteration: 1, pods: 1, moment: 'rendezvous' },
      { iteration: 2, pods: 2, moment: 'rendezvous' },
      { iteration: 3, pods: 2, moment: 'training' },
      { iteration: 4, pods: 1, moment: 'after training' },
    ];
    const seen = await watchNamespace(cluster, namespace);
    let faulted;
    try {
      faulted = await runCampaign(
        'gang-faulted',
        {
          kind: 'kubernetes',
          namespace,
          image,
          imagePullPolicy: 'Never',
          storeVolume: { hostPath: storePath },
          env: hostBlasEnv,
        },
        faults,
      );
    } finally {
      seen.stop();
      report(seen);
    }
    assert.equal(faulted.result.committedIteration, 4);
    assert.deepEqual(faulted.state.retries, { ...faulted.state.retries, update: 0, prepare: 0 });

    // No rank ever ended as bad input, and no Job failed.
    for (const pod of seen.pods.values())
      assert.notEqual(exitCode(pod), 2, `${pod.metadata?.name} exited 2 (bad input)`);
    for (const job of seen.jobs.values())
      for (const c of job.status?.conditions ?? [])
        assert.ok(
          !(['Failed', 'FailureTarget'].includes(c.type) && c.status === 'True'),
          `job ${job.metadata?.name}: ${c.type} ${c.reason} ${c.message}`,
        );
    for (const [iteration, out] of [...faulted.updates].sort(([a], [b]) => a - b))
      console.log(`# update ${iteration}: ${out.gangRestarts ?? 0} gang restart(s), ran ${out.runSeconds} s`);
    // Each fault counted once: one restart of the job (every rank, or the lost ones alone while
    // the group still formed). A pod the kubelet had not started yet may run on all the same,
    // nothing replaced: then none.
    for (const fault of faults) {
      const out = faulted.updates.get(fault.iteration);
      assert.ok(out, `update ${fault.iteration} reported`);
      const pods = [...seen.pods.values()].filter((p) =>
        p.metadata?.labels?.['moerl.dev/job']?.includes(`-u${fault.iteration}-`),
      );
      assert.equal(
        out.gangRestarts ?? 0,
        pods.length > worldSize ? 1 : 0,
        `update ${fault.iteration}: ${pods.length} pods for ${worldSize} ranks`,
      );
    }

    const store = openStore(spec('x', { kind: 'local' }).store);
    for (let it = 0; it <= 4; it++)
      assert.deepEqual(
        await checkpointHashes(store, faulted.id, it),
        await checkpointHashes(store, reference.id, it),
        `checkpoint ${it}: the faulted pods commit what fault-free local ranks commit`,
      );
  });
});

const rank = (pod: V1Pod) => Number(pod.metadata?.annotations?.['batch.kubernetes.io/job-completion-index']);
const exitCode = (pod: V1Pod) =>
  pod.status?.containerStatuses?.[0]?.state?.terminated?.exitCode ??
  pod.status?.containerStatuses?.[0]?.lastState?.terminated?.exitCode;

/** Every pod and Job of the namespace as last seen (deleted ones included), until stop(). */
async function watchNamespace(cluster: KubeCluster, namespace: string) {
  const pods = new Map<string, V1Pod>();
  const jobs = new Map<string, V1Job>();
  /** When this process first saw each pod, and first saw it being deleted. */
  const created = new Map<string, number>();
  const deleting = new Map<string, number>();
  const watch = new Watch(cluster.kubeConfig());
  const requests = [
    await watch.watch(
      `/api/v1/namespaces/${namespace}/pods`,
      {},
      (_type, pod: V1Pod) => {
        const name = pod.metadata!.name!;
        if (!created.has(name)) created.set(name, Date.now());
        if (pod.metadata?.deletionTimestamp && !deleting.has(name)) deleting.set(name, Date.now());
        pods.set(name, pod);
      },
      () => undefined,
    ),
    await watch.watch(
      `/apis/batch/v1/namespaces/${namespace}/jobs`,
      {},
      (_type, job: V1Job) => jobs.set(job.metadata!.name!, job),
      () => undefined,
    ),
  ];
  return { pods, jobs, created, deleting, stop: () => requests.forEach((r) => r.abort()) };
}

/** What each job's ranks did: their pods in order, seconds from the job's first pod. */
function report(seen: Awaited<ReturnType<typeof watchNamespace>>): void {
  const byJob = new Map<string, V1Pod[]>();
  for (const pod of seen.pods.values()) {
    const job = pod.metadata?.labels?.['moerl.dev/job'] ?? '';
    byJob.set(job, [...(byJob.get(job) ?? []), pod]);
  }
  for (const [job, pods] of [...byJob].sort()) {
    const at = (p: V1Pod) => seen.created.get(p.metadata!.name!)!;
    const first = Math.min(...pods.map(at));
    const s = (ms: number | undefined) => (ms === undefined ? '?' : ((ms - first) / 1000).toFixed(1));
    const lines = pods
      .sort((a, b) => rank(a) - rank(b) || at(a) - at(b))
      .map((p) => {
        const t = p.status?.containerStatuses?.[0]?.state?.terminated;
        const ms = (d: Date | string | undefined) => (d ? new Date(d).getTime() : undefined);
        // The last deletion is the update's own clean-up, after the pod ended.
        const del = seen.deleting.get(p.metadata!.name!);
        const faulted = del !== undefined && t?.finishedAt && del < ms(t.finishedAt)! + 500;
        return (
          `rank ${rank(p)} created ${s(at(p))} ran ${s(ms(t?.startedAt))}-${s(ms(t?.finishedAt))} ` +
          `${p.status?.phase} exit ${t?.exitCode ?? '-'}${faulted ? ` force-deleted ${s(del)}` : ''} ` +
          `(index failures ${p.metadata?.annotations?.['batch.kubernetes.io/job-index-failure-count'] ?? '-'}, ` +
          `ignored ${p.metadata?.annotations?.['batch.kubernetes.io/job-index-ignored-failure-count'] ?? '-'})`
        );
      });
    const failed = seen.jobs.get(job)?.status?.failed ?? 0;
    console.log(
      `# job ${job}: ${pods.length} pods, Job status.failed ${failed}:\n#   ${lines.join('\n#   ')}`,
    );
  }
}

/** The moe_train process of each rank of `job` on this machine (a pod's processes are the host's). */
function rankProcesses(job: string): Map<number, number> {
  const ranks = new Map<number, number>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/comm`, 'utf8').trim() !== 'moe_train') continue;
      const env = new Map(
        readFileSync(`/proc/${entry}/environ`, 'utf8')
          .split('\0')
          .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)] as const),
      );
      if (!env.get('MOERL_COORDINATOR')?.startsWith(`${job}-0.`)) continue;
      ranks.set(Number(env.get('MOERL_RANK')), Number(entry));
    } catch {
      continue; // gone meanwhile
    }
  }
  return ranks;
}

/** The parent of a process: of a rank's moe_train, its rank program. */
function parentOf(pid: number): number {
  return Number(/^PPid:\s*(\d+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);
}

/** Whether a rank's moe_train has written files into its output folder ({work}/out in its pod). */
function checkpointWritten(pid: number): boolean {
  try {
    return readdirSync(`/proc/${pid}/root${rankWorkDir}/out`).length > 0;
  } catch {
    return false;
  }
}

/**
 * Rank 0's coordinator socket as its network namespace shows it: still listening (the
 * rendezvous is open; `peers` ranks admitted or in their handshake), or closed (the group formed).
 */
function coordinatorSockets(pid: number): { listening: boolean; peers: number } {
  try {
    const port = Number(
      readFileSync(`/proc/${pid}/environ`, 'utf8')
        .split('\0')
        .find((kv) => kv.startsWith('MOERL_COORDINATOR='))!
        .split(':')
        .at(-1),
    );
    let listening = false;
    let peers = 0;
    for (const line of readFileSync(`/proc/${pid}/net/tcp`, 'utf8').split('\n').slice(1)) {
      const [, local, , state] = line.trim().split(/\s+/);
      if (!local || parseInt(local.split(':')[1]!, 16) !== port) continue;
      if (state === '0A') listening = true;
      else if (state === '01') peers++;
    }
    return { listening, peers };
  } catch {
    return { listening: false, peers: 0 };
  }
}

/** Polls `probe` every 20 ms: a rendezvous on this machine lasts tenths of a second to seconds. */
async function pollFast(what: string, timeoutMs: number, probe: () => boolean): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!probe()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((done) => setTimeout(done, 20));
  }
}
