// The rollout fleet of the eks overlay on a test control plane whose nodes are kwok's: the
// rendered Deployment (and ScaledObject, for an elastic fleet) sized for a test, and a stand-in
// for the pods' kubelet that runs a real rollout worker in this process for each running pod
// (marking its pod busy or idle as a real worker does) and stops it gracefully, as SIGTERM stops
// a real one, once its pod is deleted. Used by test/k8s/keda.test.ts and bench/rollout_fleet.ts.
import assert from 'node:assert/strict';
import type { AppsV1Api, CoreV1Api, V1Pod } from '@kubernetes/client-node';
import { NativeConnection } from '@temporalio/worker';
import { logTail } from '../../cli/dev-server.js';
import type { CampaignActivities, RolloutShardInput } from '../../activities/types.js';
import { Registry } from 'prom-client';
import { rolloutDemandReader, trackRolloutDemand } from '../../workers/demand.js';
import { serveMetrics, type MetricsServer } from '../../workers/metrics.js';
import { podBusyMarker } from '../../workers/pod-deletion-cost.js';
import { startWorkerMetrics } from '../../workers/telemetry.js';
import { runWorkers } from '../../workers/worker.js';
import type { TaskQueues } from '../../workflows/types.js';
import { waitFor } from './campaign-harness.js';
import type { Keda } from './keda.js';
import type { KubeCluster } from './kube-cluster.js';
import { find, parseObjects, render, type K8sObject } from '../k8s/render.js';

export const rolloutDeployment = 'moerl-rollout';

/** The ScaledObject's timings and bounds, for a fleet that must react within a test. */
export interface ElasticSettings {
  pollingInterval: number;
  cooldownPeriod: number;
  maxReplicaCount: number;
  /** HPA scale-down behaviour: stabilization window and pods removed per period. */
  scaleDown: { stabilizationWindowSeconds: number; pods: number; periodSeconds: number };
}

/**
 * The rendered eks objects of the rollout fleet in `namespace`, each pod 1 CPU (1 rank): with
 * `elastic`, the ScaledObject whose metrics-api trigger reads `metricsUrl` with a target of 1 rank
 * per pod; with `fixedReplicas` instead, the Deployment alone at that size.
 */
export async function fleetObjects(
  namespace: string,
  fleet: { metricsUrl: string; elastic: ElasticSettings } | { fixedReplicas: number },
): Promise<{ objects: K8sObject[]; nodeLabels: Record<string, string> }> {
  const eks = parseObjects(await render('eks'));
  const rollout = structuredClone(find(eks, 'Deployment', rolloutDeployment)) as K8sObject & {
    spec: {
      replicas?: number;
      template: { spec: { nodeSelector: Record<string, string>; containers: { resources: object }[] } };
    };
  };
  const pod = rollout.spec.template.spec;
  for (const c of pod.containers)
    c.resources = { requests: { cpu: '1', memory: '1Gi' }, limits: { cpu: '1', memory: '1Gi' } };
  // KEDA reads the target's environment (envFrom included) for triggers that name a variable.
  const config = eks.filter((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('moerl-config'));
  const account = find(eks, 'ServiceAccount', 'moerl-rollout');
  const objects: K8sObject[] = [...config, account, rollout];
  if ('fixedReplicas' in fleet) rollout.spec.replicas = fleet.fixedReplicas;
  else {
    const scaled = structuredClone(find(eks, 'ScaledObject', rolloutDeployment)) as K8sObject & {
      spec: {
        pollingInterval: number;
        cooldownPeriod: number;
        maxReplicaCount: number;
        advanced: { horizontalPodAutoscalerConfig: { behavior: { scaleDown: object } } };
        triggers: { type: string; metadata: Record<string, string> }[];
      };
    };
    const e = fleet.elastic;
    scaled.spec.pollingInterval = e.pollingInterval;
    scaled.spec.cooldownPeriod = e.cooldownPeriod;
    scaled.spec.maxReplicaCount = e.maxReplicaCount;
    scaled.spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown = {
      stabilizationWindowSeconds: e.scaleDown.stabilizationWindowSeconds,
      policies: [{ type: 'Pods', value: e.scaleDown.pods, periodSeconds: e.scaleDown.periodSeconds }],
    };
    const trigger = scaled.spec.triggers.find((tr) => tr.type === 'metrics-api');
    assert.ok(trigger, 'the ScaledObject has its metrics-api trigger');
    trigger.metadata.url = fleet.metricsUrl;
    trigger.metadata.targetValue = '1';
    objects.push(scaled);
  }
  return {
    objects: objects.map((o) => ({ ...o, metadata: { ...o.metadata, namespace } })),
    nodeLabels: pod.nodeSelector,
  };
}

/** Waits until KEDA reports the rollout ScaledObject of `namespace` Ready; else fails with its operator's log. */
export async function scaledObjectReady(cluster: KubeCluster, keda: Keda, namespace: string): Promise<void> {
  await waitFor(
    'the ScaledObject to be ready',
    async () => {
      const out = await cluster.kubectl([
        '-n',
        namespace,
        'get',
        'scaledobject',
        rolloutDeployment,
        '-o',
        'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
      ]);
      return out.stdout === 'True' ? true : undefined;
    },
    120_000,
    500,
  ).catch((err: Error) => {
    throw new Error(`${err.message}; keda-operator log:\n${logTail(keda.operatorLog, 0)}`);
  });
}

/**
 * What a control worker serves to KEDA: moerl_rollout_ranks_wanted of the campaigns on
 * `taskQueues`, read every 500 ms, at `url` on 127.0.0.1 until `stop`.
 */
export async function serveRolloutDemand(
  connection: NativeConnection,
  namespace: string,
  taskQueues: TaskQueues,
): Promise<{ url: string; stop(): Promise<void> }> {
  const registry = new Registry();
  const server = await serveMetrics(registry, 0, '127.0.0.1');
  const halt = new AbortController();
  const tracking = trackRolloutDemand({
    registry,
    read: rolloutDemandReader(connection.workflowService, namespace, taskQueues),
    intervalMs: 500,
    signal: halt.signal,
  });
  return {
    url: server.url,
    async stop() {
      halt.abort();
      await tracking;
      await server.close();
    },
  };
}

/** Pods of the rollout Deployment, deleting ones included. */
export async function rolloutPods(core: CoreV1Api, namespace: string): Promise<V1Pod[]> {
  return (await core.listNamespacedPod({ namespace, labelSelector: 'moerl.dev/role=rollout' })).items;
}

export async function rolloutReplicas(apps: AppsV1Api, namespace: string): Promise<number> {
  return (await apps.readNamespacedDeployment({ namespace, name: rolloutDeployment })).spec?.replicas ?? 0;
}

export interface PodWorker {
  pod: string;
  running: number;
  /** Activities running when its pod was deleted and the worker told to stop. */
  runningAtStop?: number;
  /** What runs now, e.g. "rolloutShard c/1/0", and what ran when it was told to stop. */
  active: Set<string>;
  activeAtStop?: string[];
  /** Shards (campaign/iteration/shard) it ran. */
  ran: string[];
  /** When its worker started (its pod seen running) and stopped (ms). */
  startedAt: number;
  stoppedAt?: number;
  /** With `metricsPorts`: the port it holds until it stops, and its own /metrics there. */
  metricsPort?: number;
  metrics?: MetricsServer;
  stop: AbortController;
  done: Promise<void>;
}

export interface RolloutFleet {
  workers: Map<string, PodWorker>;
  /** Workers whose pod is not deleted. */
  live(): PodWorker[];
  stop(): Promise<void>;
}

/**
 * Plays the kubelet for the rollout pods of `namespace` on kwok nodes: a rollout worker per
 * running pod on the Temporal server at `temporal`, stopped once its pod is deleted. With
 * `metricsPorts` each worker serves its metrics on 127.0.0.1 (moerl_rollout_rank_capacity 1
 * among them), found in `PodWorker.metrics` while it runs.
 */
export function rolloutFleet(opts: {
  cluster: KubeCluster;
  core: CoreV1Api;
  namespace: string;
  temporal: { address: string; namespace: string };
  taskQueues: TaskQueues;
  activities: CampaignActivities;
  /**
   * Ports on which the workers serve their metrics (each takes one no other running worker
   * holds), so that a scraper can list them all in advance and see a worker from its first
   * second; without them the workers serve none.
   */
  metricsPorts?: number[];
  log?: (line: string) => void;
}): RolloutFleet {
  const { namespace } = opts;
  const t0 = Date.now();
  const log = opts.log ?? ((line: string) => console.error(line));
  const workers = new Map<string, PodWorker>();
  const halt = new AbortController();
  const start = (pod: string): PodWorker => {
    const marker = podBusyMarker({
      pod: { name: pod, namespace },
      kubeConfig: opts.cluster.kubeConfig(),
      log: (line) => log(`pod ${pod}: ${line}`),
    });
    // Taken before the first await: pods that start together never pick the same port.
    const held = new Set(
      [...workers.values()].flatMap((o) => (o.stoppedAt === undefined ? [o.metricsPort] : [])),
    );
    const metricsPort = opts.metricsPorts?.find((p) => !held.has(p));
    if (opts.metricsPorts && metricsPort === undefined)
      throw new Error(`pod ${pod}: all ${opts.metricsPorts.length} metrics ports are held`);
    const w: PodWorker = {
      pod,
      metricsPort,
      startedAt: Date.now(),
      running: 0,
      ran: [],
      active: new Set(),
      stop: new AbortController(),
      done: Promise.resolve(),
    };
    const counted = Object.fromEntries(
      Object.entries(opts.activities).map(([name, fn]) => [
        name,
        async (input: unknown) => {
          const i = input as RolloutShardInput;
          const what = `${name} ${i.campaignId}/${i.iteration}/${i.shard ?? '-'} at ${Date.now() - t0} ms`;
          w.running++;
          w.active.add(what);
          if (name === 'rolloutShard') w.ran.push(`${i.campaignId}/${i.iteration}/${i.shard}`);
          try {
            return await (fn as (i: unknown) => Promise<unknown>)(input);
          } finally {
            w.running--;
            w.active.delete(what);
          }
        },
      ]),
    ) as unknown as CampaignActivities;
    // A connection each: the SDK allows one worker per task queue on a connection, a pod one.
    w.done = (async () => {
      try {
        const connection = await NativeConnection.connect({ address: opts.temporal.address });
        try {
          let activities = marker.instrument(counted);
          if (metricsPort !== undefined) {
            const served = await startWorkerMetrics({
              connection,
              namespace: opts.temporal.namespace,
              activities,
              port: metricsPort,
              host: '127.0.0.1',
              rolloutRanks: 1,
            });
            activities = served.activities;
            w.metrics = served.server;
          }
          await runWorkers({
            roles: ['rollout'],
            connection,
            namespace: opts.temporal.namespace,
            taskQueues: opts.taskQueues,
            activities,
            rolloutRanks: 1,
            shutdownGraceMs: 30_000,
            signal: w.stop.signal,
          });
        } finally {
          // Its metrics go with it, as a real worker's go with its process.
          await w.metrics?.close();
          w.metrics = undefined;
          await connection.close();
        }
      } finally {
        w.stoppedAt = Date.now();
      }
    })();
    return w;
  };
  /** Starts a worker for each pod newly running, stops those whose pod is gone or deleting. */
  const reconcile = (pods: V1Pod[]) => {
    const live = new Set<string>();
    for (const p of pods) {
      const name = p.metadata!.name!;
      if (p.metadata?.deletionTimestamp) continue;
      live.add(name);
      if (p.status?.phase === 'Running' && !workers.has(name)) {
        log(`pod ${name} runs at ${Date.now() - t0} ms`);
        workers.set(name, start(name));
      }
    }
    for (const w of workers.values())
      if (!live.has(w.pod) && w.runningAtStop === undefined) {
        w.runningAtStop = w.running;
        w.activeAtStop = [...w.active];
        log(`pod ${w.pod} deleted at ${Date.now() - t0} ms running [${w.activeAtStop.join('; ')}]`);
        w.stop.abort();
      }
  };
  const loop = (async () => {
    while (!halt.signal.aborted) {
      // A list the API server fails (a loaded machine) is tried again, as a kubelet's would be:
      // a loop that died of one left every later pod without a worker, and the test hanging.
      await rolloutPods(opts.core, namespace).then(reconcile, (err: unknown) =>
        log(`pods of ${namespace} not listed at ${Date.now() - t0} ms: ${String(err)}`),
      );
      await new Promise((r) => setTimeout(r, 250));
    }
  })();
  return {
    workers,
    live: () => [...workers.values()].filter((w) => w.runningAtStop === undefined),
    async stop() {
      halt.abort();
      await loop;
      for (const w of workers.values()) w.stop.abort();
      await Promise.all([...workers.values()].map((w) => w.done));
    },
  };
}
