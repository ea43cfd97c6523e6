// Real campaigns on a real Kubernetes node (kube-node.ts) running the moerl image: the trainer
// ranks of every update as pods of an Indexed Job talking over libfabric tcp, committing what
// the same campaign commits with local ranks over shm; and a rollout worker run as a Deployment
// whose pod is deleted mid-rollout (the kubelet's SIGTERM, the worker's graceful shutdown, a
// replacement pod) redoing at most one chunk per interrupted shard.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { cp } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { AppsV1Api, CoreV1Api, Watch, type V1Pod } from '@kubernetes/client-node';
import { workerActivityDeps } from '../../activities/deps.js';
import { createActivities } from '../../activities/index.js';
import * as keys from '../../activities/layout.js';
import { openStore, type ObjectStore } from '../../activities/store/index.js';
import type { CampaignSpec, CampaignSpecInput } from '../../workflows/spec.js';
import type { CampaignState } from '../../workflows/types.js';
import {
  artifacts,
  startCampaign,
  tinyRealSpec,
  uniqueTaskQueues,
  waitFor as poll,
  withWorkers,
} from '../support/campaign-harness.js';
import { arithmeticRow, writeVerlParquet } from '../support/dataset-fixtures.js';
import { waitFor, type KubeCluster } from '../support/kube-cluster.js';
import {
  checkpointHashes,
  finishedCampaign,
  hostBlasEnv,
  watchPods,
  startNodeCampaignEnv,
  type NodeCampaignEnv,
} from '../support/node-campaign.js';
import { nodeUnsupportedReason, type KubeNode } from '../support/kube-node.js';
import { pythonReference } from '../support/python-reference.js';
import type { TestEnvironment } from '../support/temporal.js';

const run = promisify(execFile);
// In CI a machine that cannot run the node fails the suite instead of skipping it.
const skip = process.env.CI === 'true' ? undefined : nodeUnsupportedReason();

describe('campaigns on a real Kubernetes node', { skip }, () => {
  let env: NodeCampaignEnv;
  let cluster: KubeCluster;
  let node: KubeNode;
  let t: TestEnvironment;
  let core: CoreV1Api;
  let apps: AppsV1Api;
  let image: string;
  let namespace: string;
  let dir: string;
  let storePath: string;

  before(async () => {
    env = await startNodeCampaignEnv('campaign');
    ({ cluster, node, t, image, namespace, dir, storePath } = env);
    core = cluster.kubeConfig().makeApiClient(CoreV1Api);
    apps = cluster.kubeConfig().makeApiClient(AppsV1Api);
  });
  after(() => env?.stop());

  const deps = (name: string) =>
    workerActivityDeps(env.signal, {
      ...process.env,
      KUBECONFIG: cluster.kubeconfig,
      MOERL_CACHE_DIR: join(dir, `cache-${name}`),
    });

  const kubernetesLauncher = () =>
    ({
      kind: 'kubernetes',
      namespace,
      image,
      imagePullPolicy: 'Never',
      storeVolume: { hostPath: storePath },
      env: hostBlasEnv,
    }) as const;

  async function runCampaign(spec: CampaignSpec, cache: string) {
    const started = Date.now();
    return withWorkers(t.nativeConnection, t.namespace, createActivities(deps(cache)), async (queues) => {
      const handle = await startCampaign(t.client, spec, queues);
      const result = await finishedCampaign(handle);
      const ms = Date.now() - started;
      console.log(`# campaign ${spec.name} (launcher ${spec.launcher.kind}): ${ms} ms`);
      return { id: handle.workflowId, result, state: await handle.query<CampaignState>('status') };
    });
  }

  it('trains with 2 EP ranks as pods over tcp and commits exactly what local ranks over shm commit', async () => {
    // The demo's policy (examples/demo.yaml): two iterations with a short SFT warm start.
    const spec = (name: string, launcher: CampaignSpecInput['launcher']) =>
      tinyRealSpec(name, dir, {
        model: { layers: 2, hidden: 128, heads: 4, experts: 8, topK: 2, contextLength: 32 },
        iterations: 2,
        promptsPerIteration: 16,
        groupSize: 4,
        chunkSize: 4,
        sftWarmStartSteps: 10,
        launcher,
        hyperparameters: { maxNewTokens: 10, minibatches: 2, epochs: 1 },
        orchestration: { rolloutHeartbeatSeconds: 10, updateHeartbeatSeconds: 30 },
      });
    const seen = await watchPods(cluster, namespace);
    const onNode = await runCampaign(spec('on-node', kubernetesLauncher()), 'node');
    seen.stop();
    assert.equal(onNode.result.committedIteration, 2);

    // Every training job (SFT, 2 updates) ran as 2 pods on the real node, which all succeeded
    // (the update removes its Job once it has collected the outputs).
    const rankPods = [...seen.pods.values()].filter((p) => p.metadata?.labels?.['moerl.dev/job']);
    const jobs = new Set(rankPods.map((p) => p.metadata!.labels!['moerl.dev/job']));
    assert.ok(jobs.size >= 3, `a Job per training job: ${[...jobs].join(', ')}`);
    assert.equal(rankPods.length, 2 * jobs.size, 'two pods per job, none replaced');
    for (const pod of rankPods) {
      assert.equal(pod.spec?.nodeName, node.name);
      assert.ok(seen.succeeded.has(pod.metadata!.name!), `${pod.metadata?.name} succeeded`);
    }

    const local = await runCampaign(spec('local', { kind: 'local' }), 'local');
    assert.equal(local.result.committedIteration, 2);

    const store = openStore(spec('x', { kind: 'local' }).store);
    for (let it = 0; it <= 2; it++) {
      const [a, b] = [
        await checkpointHashes(store, onNode.id, it),
        await checkpointHashes(store, local.id, it),
      ];
      assert.ok(a.size >= 3, `checkpoint ${it} lists its files (${[...a.keys()].join(', ')})`);
      assert.deepEqual(
        a,
        b,
        `checkpoint ${it}: pods over tcp and local ranks over shm commit the same bytes`,
      );
    }
  });

  const pyref = pythonReference();
  it(
    'a Hugging Face model: 2 EP rank pods each import their own tensors and commit what local ranks commit',
    { skip: pyref.skip },
    async () => {
      // The tiny Qwen3-MoE of the HF tests and verl-schema prompts, in the store the pods mount.
      const model = join(dir, 'qwen3');
      await pyref.run('hf_models.py', ['make', model, '--family', 'qwen3_moe']);
      await cp(model, join(storePath, 'models', 'qwen3'), { recursive: true });
      // safetensors writes its file owner-only; the pods read the store as another user.
      await run('chmod', ['-R', 'a+rX', join(storePath, 'models')]);
      mkdirSync(join(storePath, 'datasets'), { recursive: true, mode: 0o777 });
      writeVerlParquet(
        join(storePath, 'datasets', 'arith.parquet'),
        Array.from({ length: 12 }, (_, i) => arithmeticRow(i)),
      );
      const spec = (name: string, launcher: CampaignSpecInput['launcher']) =>
        tinyRealSpec(name, dir, {
          task: { dataset: { train: 'datasets/arith.parquet', format: 'parquet' } },
          model: { huggingFace: 'models/qwen3' },
          rewards: { default: { kind: 'match' } },
          iterations: 2,
          promptsPerIteration: 8,
          groupSize: 2,
          chunkSize: 2,
          launcher,
          hyperparameters: { maxNewTokens: 12, minibatches: 1, epochs: 1 },
          orchestration: { rolloutHeartbeatSeconds: 10, updateHeartbeatSeconds: 30 },
        });
      const onNode = await runCampaign(spec('hf-on-node', kubernetesLauncher()), 'hf-node');
      assert.equal(onNode.result.committedIteration, 2);
      const local = await runCampaign(spec('hf-local', { kind: 'local' }), 'hf-local');
      assert.equal(local.result.committedIteration, 2);
      const store = openStore(spec('x', { kind: 'local' }).store);
      for (let it = 0; it <= 2; it++)
        assert.deepEqual(
          await checkpointHashes(store, onNode.id, it),
          await checkpointHashes(store, local.id, it),
          `checkpoint ${it}: the same bytes from pods and from local ranks`,
        );
    },
  );

  it('a rollout worker pod deleted mid-rollout redoes at most one chunk per interrupted shard', async () => {
    // 16 chunks per shard: the rollout lasts long enough to be interrupted.
    const spec = (name: string) =>
      tinyRealSpec(name, dir, {
        iterations: 2,
        promptsPerIteration: 64,
        chunkSize: 2,
        orchestration: { rolloutHeartbeatSeconds: 2, updateHeartbeatSeconds: 10 },
      });
    const chunksPerShard = 16;
    const store = openStore(spec('x').store);
    const reference = await runCampaign(spec('rollout-reference'), 'reference');

    const queues = uniqueTaskQueues();
    const prefix = queues.rollout.slice(0, -'rollout'.length);
    const deployment = 'rollout-worker';
    const labels = { app: deployment };
    await apps.createNamespacedDeployment({
      namespace,
      body: {
        metadata: { name: deployment },
        spec: {
          replicas: 1,
          selector: { matchLabels: labels },
          template: {
            metadata: { labels },
            spec: {
              // The dev server listens on the host's 127.0.0.1 only (k8s/overlays/local does the same).
              hostNetwork: true,
              dnsPolicy: 'ClusterFirstWithHostNet',
              automountServiceAccountToken: false,
              containers: [
                {
                  name: 'worker',
                  image,
                  imagePullPolicy: 'Never',
                  args: ['--role', 'rollout', '--shutdown-grace-seconds', '5'],
                  env: [
                    { name: 'TEMPORAL_ADDRESS', value: t.address },
                    { name: 'TEMPORAL_NAMESPACE', value: t.namespace },
                    { name: 'MOERL_TASK_QUEUE_PREFIX', value: prefix },
                    ...Object.entries(hostBlasEnv).map(([name, value]) => ({ name, value })),
                  ],
                  volumeMounts: [
                    { name: 'store', mountPath: storePath },
                    { name: 'cache', mountPath: '/var/cache/moerl' },
                  ],
                },
              ],
              volumes: [
                { name: 'store', hostPath: { path: storePath, type: 'Directory' } },
                { name: 'cache', emptyDir: {} },
              ],
            },
          },
        },
      },
    });
    const workerPod = async (except?: string): Promise<V1Pod> => {
      let found: V1Pod | undefined;
      await waitFor(
        `a running rollout worker pod${except ? ` other than ${except}` : ''}`,
        120_000,
        async () => {
          const pods = (await core.listNamespacedPod({ namespace, labelSelector: `app=${deployment}` }))
            .items;
          found = pods.find(
            (p) =>
              p.status?.phase === 'Running' && !p.metadata?.deletionTimestamp && p.metadata?.name !== except,
          );
          return found
            ? true
            : pods.map((p) => `${p.metadata?.name} ${p.status?.phase}`).join(', ') || 'no pod';
        },
      );
      return found!;
    };
    const first = await workerPod();
    const firstName = first.metadata!.name!;

    const outcome = await withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(deps('interrupted')),
      async () => {
        const handle = await startCampaign(t.client, spec('rollout-interrupted'), queues);
        const id = handle.workflowId;
        await poll(
          'iteration 1 rollout to be under way',
          async () => ((await chunksStored(store, id, 1)).reduce((a, b) => a + b, 0) >= 2 ? true : undefined),
          120_000,
          20,
        );
        const before = await chunksStored(store, id, 1);
        const gone = podDeleted(cluster, namespace, firstName, first.metadata!.resourceVersion!);
        const deleted = Date.now();
        await core.deleteNamespacedPod({ namespace, name: firstName }); // default grace: 30 s
        const final = await gone;
        console.log(
          `# rollout pod deleted at chunks ${JSON.stringify(before)}, gone after ${Date.now() - deleted} ms`,
        );
        const replacement = await workerPod(firstName);
        await finishedCampaign(handle);
        return { id, before, final, replacement, state: await handle.query<CampaignState>('status') };
      },
      queues,
      ['control', 'train'],
    );
    const terminated = outcome.final.status?.containerStatuses?.[0]?.state?.terminated;
    assert.equal(
      terminated?.exitCode,
      0,
      `the worker shut down on SIGTERM within its grace: ${JSON.stringify(outcome.final.status?.containerStatuses)}`,
    );
    const interrupted = outcome.before.filter((n) => n < chunksPerShard).length;
    assert.ok(
      interrupted >= 1,
      `a shard was still running when the pod went (${JSON.stringify(outcome.before)})`,
    );
    const [first1, ...rest] = outcome.state.recentIterations;
    console.log(
      `# chunks redone per iteration ${JSON.stringify(outcome.state.recentIterations.map((i) => i.chunksRedone))}, ` +
        `${interrupted} shard(s) interrupted, rollout retries ${outcome.state.retries.rollout}`,
    );
    assert.equal(first1?.iteration, 1);
    assert.ok(
      first1.chunksRedone <= interrupted,
      `at most one chunk per interrupted shard (${first1.chunksRedone})`,
    );
    for (const it of rest) assert.equal(it.chunksRedone, 0, `iteration ${it.iteration} was not interrupted`);

    const [want, got] = [await artifacts(store, reference.id), await artifacts(store, outcome.id)];
    assert.ok(want.size >= 2 * 2 * chunksPerShard, `rollout chunks of both iterations (${want.size})`);
    assert.deepEqual([...got.keys()].sort(), [...want.keys()].sort());
    for (const [key, text] of want) assert.equal(got.get(key), text, `${key} matches the uninterrupted run`);
    await apps.deleteNamespacedDeployment({ namespace, name: deployment });
  });
});

async function chunksStored(store: ObjectStore, campaignId: string, iteration: number): Promise<number[]> {
  const counts = [0, 0];
  for (const shard of [0, 1])
    for await (const _ of store.list(`${keys.rolloutShardPrefix(campaignId, iteration, shard)}/`))
      counts[shard]!++;
  return counts;
}

/** The pod's last state, from its DELETED event: the kubelet reports every container ended first. */
function podDeleted(cluster: KubeCluster, namespace: string, name: string, resourceVersion: string) {
  return new Promise<V1Pod>((done, fail) => {
    void new Watch(cluster.kubeConfig())
      .watch(
        `/api/v1/namespaces/${namespace}/pods`,
        { fieldSelector: `metadata.name=${name}`, resourceVersion },
        (type, pod: V1Pod) => {
          if (type === 'DELETED') done(pod);
        },
        (err) => (err ? fail(err as Error) : undefined),
      )
      .catch(fail);
  });
}
