// The PyTorch trainer (engines/pytorch) as pods on a real node (kube-node.ts): the tiny Hugging
// Face campaign of pytorch-campaign.test.ts, `engine.trainer: pytorch`, whose trainer ranks run
// as 2 pods of an Indexed Job of the moerl-pytorch image (the Dockerfile's pytorch target), the
// group formed through torch's TCPStore at rank 0's pod and trained over gloo on the pod network.
// It must commit exactly the bytes that the same campaign commits with 2 local ranks run by the
// tests' reference interpreter, whose pins are the image's.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { openStore } from '../../activities/store/index.js';
import type { CampaignSpecInput } from '../../workflows/spec.js';
import type { CampaignState } from '../../workflows/types.js';
import { startCampaign, withWorkers } from '../support/campaign-harness.js';
import { hfCampaignSpec, writeHfCampaignFixture } from '../support/hf-campaign-fixtures.js';
import type { KubeCluster } from '../support/kube-cluster.js';
import { nodeUnsupportedReason, type KubeNode } from '../support/kube-node.js';
import { nativeTools } from '../support/native-tools.js';
import {
  checkpointHashes,
  finishedCampaign,
  hostBlasEnv,
  watchPods,
  startNodeCampaignEnv,
  type NodeCampaignEnv,
} from '../support/node-campaign.js';
import { pytorchEngine } from '../support/pytorch-engine.js';
import type { TestEnvironment } from '../support/temporal.js';

const run = promisify(execFile);
// In CI a machine that cannot run the node fails the suite instead of skipping it.
const skip = process.env.CI === 'true' ? undefined : nodeUnsupportedReason();
const engine = pytorchEngine();
const native = nativeTools(['moe_train', 'moe_generate', 'moe_hf']);

describe('the PyTorch trainer as pods on a real node', { skip: skip || engine.skip || native.skip }, () => {
  let env: NodeCampaignEnv;
  let cluster: KubeCluster;
  let node: KubeNode;
  let t: TestEnvironment;
  let image: string;
  let namespace: string;
  let dir: string;

  before(async () => {
    env = await startNodeCampaignEnv('pytorch', {
      target: 'moerl-pytorch',
      // 7 GB: on disk, not in the node's tmpfs; its import takes minutes.
      node: { containerdOnDisk: true, startTimeoutMs: 600_000 },
    });
    ({ cluster, node, t, image, namespace, dir } = env);
    await writeHfCampaignFixture(dir, engine.pyref);
    // safetensors writes its file owner-only; the pods read the store as another user.
    await run('chmod', ['-R', 'a+rX', join(dir, 'store')]);
  });
  after(() => env?.stop());

  // The pods' torch and the local ranks' run one thread each whatever this process was given.
  const threads = { OMP_NUM_THREADS: '1' };
  const spec = (name: string, launcher: CampaignSpecInput['launcher']) =>
    hfCampaignSpec(dir, name, {
      engine: { trainer: 'pytorch' },
      launcher,
      // KL to checkpoint 0: the pods fetch the reference directory too.
      hyperparameters: {
        maxNewTokens: 16,
        minibatches: 1,
        epochs: 1,
        lr: 0.002,
        klCoef: 0.05,
        entropyCoef: 0.01,
      },
      orchestration: { rolloutHeartbeatSeconds: 10, updateHeartbeatSeconds: 30 },
    });

  async function runCampaign(name: string, launcher: CampaignSpecInput['launcher']) {
    const activities = createActivities(
      workerActivityDeps(env.signal, {
        ...process.env,
        ...threads,
        ...(process.env.MOERL_PYREF_PYTHON ? { MOERL_PYTORCH_PYTHON: process.env.MOERL_PYREF_PYTHON } : {}),
        KUBECONFIG: cluster.kubeconfig,
        MOERL_CACHE_DIR: join(dir, `cache-${name}`),
      }),
    );
    const started = Date.now();
    return withWorkers(t.nativeConnection, t.namespace, activities, async (queues) => {
      const handle = await startCampaign(t.client, spec(name, launcher), queues);
      const result = await finishedCampaign(handle, 480_000);
      console.log(`# campaign ${name} (launcher ${launcher?.kind}): ${Date.now() - started} ms`);
      return { id: handle.workflowId, result, state: await handle.query<CampaignState>('status') };
    });
  }

  it('2 rank pods over gloo on the pod network commit the bytes that 2 local ranks commit', async () => {
    const seen = await watchPods(cluster, namespace);
    let onNode: Awaited<ReturnType<typeof runCampaign>>;
    try {
      onNode = await runCampaign('pt-on-node', {
        kind: 'kubernetes',
        namespace,
        image,
        imagePullPolicy: 'Never',
        storeVolume: { hostPath: join(dir, 'store') },
        env: { ...hostBlasEnv, ...threads },
      });
    } finally {
      seen.stop();
    }
    assert.equal(onNode.result.committedIteration, 2);

    // Both updates ran as 2 pods of the image on the node, each succeeding once.
    const rankPods = [...seen.pods.values()].filter((p) =>
      /-u\d+-/.test(p.metadata?.labels?.['moerl.dev/job'] ?? ''),
    );
    const jobs = new Set(rankPods.map((p) => p.metadata!.labels!['moerl.dev/job']));
    assert.equal(jobs.size, 2, `a Job per update: ${[...jobs].join(', ')}`);
    assert.equal(rankPods.length, 4, 'two pods per update, none replaced');
    for (const pod of rankPods) {
      assert.equal(pod.spec?.nodeName, node.name);
      assert.equal(pod.spec?.containers[0]?.image, image);
      assert.ok(seen.succeeded.has(pod.metadata!.name!), `${pod.metadata?.name} succeeded`);
    }

    const local = await runCampaign('pt-local', { kind: 'local' });
    assert.equal(local.result.committedIteration, 2);

    // Every file bitwise: the weights, the config and optimizer.moerl (Adam's moments; its
    // header's metadata is written in a fixed order, hf.py order_metadata). A tensor file that
    // differs says by how much, tensor by tensor.
    const store = openStore(spec('x', { kind: 'local' }).store);
    for (let it = 0; it <= 2; it++) {
      const [a, b] = [
        await checkpointHashes(store, onNode.id, it),
        await checkpointHashes(store, local.id, it),
      ];
      const want = [
        'config.json',
        'model.safetensors',
        'dense.safetensors',
        ...(it > 0 ? ['optimizer.moerl'] : []),
      ];
      for (const name of want)
        assert.ok(a.has(name), `checkpoint ${it} lists ${name} (${[...a.keys()].join(', ')})`);
      assert.deepEqual([...a.keys()].sort(), [...b.keys()].sort(), `checkpoint ${it}: the same files`);
      for (const [name, sha] of a) {
        if (sha === b.get(name)) continue;
        const tensors = /\.(safetensors|moerl)$/.test(name)
          ? maxRelL2(
              await store.get(`${keys.checkpointKey(onNode.id, it)}/${name}`),
              await store.get(`${keys.checkpointKey(local.id, it)}/${name}`),
            )
          : null;
        assert.fail(
          `checkpoint ${it} ${name}: rank pods and local ranks commit other bytes` +
            (tensors ? ` (largest relative L2 per tensor ${tensors.max}, ${tensors.worst})` : ''),
        );
      }
    }
  });
});

/** The largest relative L2 difference of the float32 tensors of two safetensors files. */
function maxRelL2(a: Buffer, b: Buffer): { max: number; worst: string } {
  const tensors = (bytes: Buffer) => {
    const n = Number(bytes.readBigUInt64LE(0));
    const header = JSON.parse(bytes.subarray(8, 8 + n).toString('utf8')) as Record<
      string,
      { dtype: string; data_offsets: [number, number] }
    >;
    const out = new Map<string, Float32Array>();
    for (const [name, t] of Object.entries(header)) {
      if (name === '__metadata__') continue;
      assert.equal(t.dtype, 'F32', `${name} is float32`);
      const data = bytes.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
      out.set(name, new Float32Array(new Uint8Array(data).buffer));
    }
    return out;
  };
  const [x, y] = [tensors(a), tensors(b)];
  assert.deepEqual([...x.keys()].sort(), [...y.keys()].sort(), 'the same tensors');
  let max = 0;
  let worst = '';
  for (const [name, u] of x) {
    const v = y.get(name)!;
    assert.equal(u.length, v.length, `${name}: the same shape`);
    let diff = 0;
    let norm = 0;
    for (let i = 0; i < u.length; i++) {
      diff += (u[i]! - v[i]!) ** 2;
      norm += v[i]! ** 2;
    }
    const rel = Math.sqrt(diff) / Math.max(Math.sqrt(norm), 1e-30);
    if (rel > max) [max, worst] = [rel, name];
  }
  return { max, worst };
}
