// How the KubernetesLauncher reads a job from its Job and pod objects: per-rank states, why a
// failed Job failed (naming rank and pod, permanent or not), pods that cannot start, and the
// one mapping of API errors to retryable and non-retryable failures.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ApiException } from '@kubernetes/client-node';
import type { V1ContainerState, V1Job, V1Pod, V1PodCondition } from '@kubernetes/client-node';
import { ApplicationFailure } from '@temporalio/common';
import { kubernetesFailure } from '../../activities/launch/kubernetes/errors.js';
import {
  completedIndexes,
  currentPods,
  failedJobFailure,
  gangRestarts,
  pendingFailure,
  pendingProblem,
  podAccount,
  rankStatuses,
} from '../../activities/launch/kubernetes/failures.js';

const job = 'grpo-u1-abcd';

function pod(
  rank: number,
  phase: string,
  opts: {
    suffix?: string;
    created?: string;
    state?: V1ContainerState;
    conditions?: V1PodCondition[];
    memory?: string;
    /** Its rank's failures before the pod, as the Job controller writes them: counted, ignored. */
    failures?: [number, number];
  } = {},
): V1Pod {
  return {
    metadata: {
      name: `${job}-${rank}-${opts.suffix ?? 'aaaaa'}`,
      uid: `uid-${rank}-${opts.suffix ?? 'aaaaa'}`,
      creationTimestamp: (opts.created ?? '2026-01-01T00:00:00Z') as unknown as Date,
      annotations: {
        'batch.kubernetes.io/job-completion-index': String(rank),
        ...(opts.failures
          ? {
              'batch.kubernetes.io/job-index-failure-count': String(opts.failures[0]),
              'batch.kubernetes.io/job-index-ignored-failure-count': String(opts.failures[1]),
            }
          : {}),
      },
    },
    spec: {
      containers: [
        {
          name: 'rank',
          image: 'moerl:0.1.0',
          ...(opts.memory ? { resources: { limits: { memory: opts.memory } } } : {}),
        },
      ],
    },
    status: {
      phase,
      conditions: opts.conditions ?? [],
      containerStatuses: opts.state
        ? [
            {
              name: 'rank',
              image: 'moerl:0.1.0',
              imageID: '',
              ready: false,
              restartCount: 0,
              state: opts.state,
            },
          ]
        : [],
    },
  };
}

const exited = (
  exitCode: number,
  reason = 'Error',
  finishedAt = '2026-01-01T00:10:00Z',
): V1ContainerState => ({
  terminated: { exitCode, reason, finishedAt: finishedAt as unknown as Date },
});

function failedJob(reason: string, message: string): V1Job {
  return {
    metadata: { name: job, uid: 'job-uid' },
    spec: { template: {}, activeDeadlineSeconds: 60 },
    status: {
      conditions: [
        { type: 'FailureTarget', status: 'True', reason, message },
        { type: 'Failed', status: 'True', reason, message },
      ],
    },
  };
}

describe('kubernetes launcher: rank states', () => {
  it('reads each rank from its newest pod, and completed indexes whose pods are gone', () => {
    const pods = [
      pod(0, 'Running'),
      pod(1, 'Failed', { state: exited(137, 'OOMKilled') }),
      pod(1, 'Pending', { suffix: 'bbbbb', created: '2026-01-01T00:11:00Z' }),
      pod(2, 'Succeeded', { state: exited(0, 'Completed') }),
    ];
    assert.equal(currentPods(pods).get(1)?.metadata?.name, `${job}-1-bbbbb`);
    const statuses = rankStatuses({ status: { completedIndexes: '2-3' } }, pods, 5);
    assert.deepEqual(statuses, [
      { rank: 0, state: 'running', exitCode: null, signal: null },
      { rank: 1, state: 'pending', exitCode: null, signal: null },
      { rank: 2, state: 'succeeded', exitCode: 0, signal: null },
      { rank: 3, state: 'succeeded', exitCode: 0, signal: null },
      { rank: 4, state: 'pending', exitCode: null, signal: null },
    ]);
    assert.deepEqual(rankStatuses(null, [pod(0, 'Failed', { state: exited(137, 'OOMKilled') })], 1)[0], {
      rank: 0,
      state: 'failed',
      exitCode: 137,
      signal: 'SIGKILL',
    });
    assert.deepEqual(
      [...completedIndexes({ status: { completedIndexes: '0-2,5,7-8' } })],
      [0, 1, 2, 5, 7, 8],
    );
  });

  it('once the success policy is met, every rank succeeded, the pods the Job stopped then too', () => {
    const met: V1Job = {
      status: { completedIndexes: '0', conditions: [{ type: 'SuccessCriteriaMet', status: 'True' }] },
    };
    const pods = [pod(0, 'Succeeded', { state: exited(0) }), pod(1, 'Failed', { state: exited(143) })];
    assert.deepEqual(
      rankStatuses(met, pods, 3).map((r) => [r.state, r.exitCode]),
      [
        ['succeeded', 0],
        ['succeeded', 0],
        ['succeeded', 0],
      ],
    );
  });
});

describe('kubernetes launcher: why a Job failed', () => {
  it('exit 2 under the podFailurePolicy: permanent, naming the rank and the pod', () => {
    const pods = [
      pod(0, 'Failed', { state: exited(143, 'Error', '2026-01-01T00:10:05Z') }),
      pod(1, 'Failed', { state: exited(2) }),
    ];
    const { failure, pod: blamed } = failedJobFailure(
      failedJob(
        'PodFailurePolicy',
        'Container rank for pod ns/x failed with exit code 2 matching FailJob rule at index 1',
      ),
      pods,
    );
    assert.equal(blamed?.metadata?.name, `${job}-1-aaaaa`);
    assert.equal(failure.permanent, true);
    assert.equal(failure.rank, 1);
    assert.equal(failure.exitCode, 2);
    assert.match(failure.logTail, /rank 1 \(pod grpo-u1-abcd-1-aaaaa\) exited with code 2 \(bad input\)/);
    assert.match(failure.logTail, /PodFailurePolicy/);
  });

  it('OOMKilled, then the backoff limit: retryable, saying to raise launcher.memory', () => {
    const pods = [
      pod(0, 'Failed', { state: exited(137, 'OOMKilled', '2026-01-01T00:05:00Z'), memory: '64Gi' }),
      pod(0, 'Failed', { suffix: 'bbbbb', state: exited(1, 'Error', '2026-01-01T00:09:00Z') }),
    ];
    const { failure } = failedJobFailure(
      failedJob('BackoffLimitExceeded', 'Job has reached the specified backoff limit'),
      pods,
    );
    assert.equal(failure.permanent, false);
    assert.equal(failure.rank, 0);
    assert.equal(failure.exitCode, 137);
    assert.equal(failure.signal, 'SIGKILL');
    assert.match(
      failure.logTail,
      /^rank 0 \(pod grpo-u1-abcd-0-aaaaa\) was OOMKilled: raise launcher.memory \(now 64Gi\); job grpo-u1-abcd: BackoffLimitExceeded/,
    );
  });

  it('a gang restart: the lost rank is the cause, never a peer that exited 75 because it was lost', () => {
    // The peers noticed the loss and exited 75 before the lost rank's own exit was reported.
    const pods = [
      pod(0, 'Failed', { state: exited(75, 'Error', '2026-01-01T00:01:00Z') }),
      pod(2, 'Failed', { state: exited(75, 'Error', '2026-01-01T00:01:01Z') }),
      pod(1, 'Failed', { state: exited(1, 'Error', '2026-01-01T00:01:02Z') }),
    ];
    const { failure, pod: blamed } = failedJobFailure(failedJob('BackoffLimitExceeded', 'limit'), pods);
    assert.equal(blamed?.metadata?.name, `${job}-1-aaaaa`);
    assert.equal(failure.rank, 1);
    assert.equal(failure.exitCode, 1);
    assert.equal(failure.permanent, false);
  });

  it('a disrupted pod is not the cause', () => {
    const evicted = pod(0, 'Failed', {
      state: exited(143, 'Error', '2026-01-01T00:01:00Z'),
      conditions: [{ type: 'DisruptionTarget', status: 'True', reason: 'EvictionByEvictionAPI' }],
    });
    const crashed = pod(0, 'Failed', { suffix: 'bbbbb', state: exited(1) });
    const { failure } = failedJobFailure(failedJob('BackoffLimitExceeded', 'limit'), [evicted, crashed]);
    assert.match(failure.logTail, /pod grpo-u1-abcd-0-bbbbb\) exited with code 1/);
  });

  it('the active deadline: the Job is the cause, retryable', () => {
    const { failure, pod: blamed } = failedJobFailure(
      failedJob('DeadlineExceeded', 'Job was active longer than specified deadline'),
      [pod(0, 'Failed', { state: exited(143) })],
    );
    assert.equal(blamed, null);
    assert.deepEqual(failure, {
      rank: null,
      exitCode: null,
      signal: null,
      logTail: 'job grpo-u1-abcd: DeadlineExceeded: Job was active longer than specified deadline',
      permanent: false,
    });
  });
});

describe('kubernetes launcher: pods that cannot start', () => {
  const waiting = (reason: string, message: string): V1ContainerState => ({ waiting: { reason, message } });

  it('an image that cannot be pulled is permanent and names the image', () => {
    const p = pod(3, 'Pending', {
      state: waiting('ImagePullBackOff', 'Back-off pulling image "moerl:0.1.0": not found'),
    });
    const problem = pendingProblem(p);
    assert.deepEqual(problem, { kind: 'image', message: 'Back-off pulling image "moerl:0.1.0": not found' });
    const failure = pendingFailure(p, problem!, 121_000);
    assert.equal(failure.permanent, true);
    assert.equal(failure.rank, 3);
    assert.match(
      failure.logTail,
      /^rank 3 \(pod grpo-u1-abcd-3-aaaaa\): image moerl:0.1.0 cannot be pulled: Back-off pulling/,
    );
  });

  it('a pod the scheduler has no room for is retryable and quotes the scheduler', () => {
    const message = '0/2 nodes are available: 2 Insufficient nvidia.com/gpu.';
    const p = pod(0, 'Pending', {
      conditions: [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message }],
    });
    const problem = pendingProblem(p);
    assert.equal(problem?.kind, 'unschedulable');
    const failure = pendingFailure(p, problem!, 600_000);
    assert.equal(failure.permanent, false);
    assert.equal(
      failure.logTail,
      `rank 0 (pod grpo-u1-abcd-0-aaaaa) could not be scheduled for 600 s (launcher.unschedulableTimeoutSeconds): ${message}`,
    );
  });

  it('a container that cannot be created is permanent; a pod merely starting is no problem', () => {
    const p = pod(0, 'Pending', {
      state: waiting('CreateContainerConfigError', 'container has runAsNonRoot and image will run as root'),
    });
    assert.equal(pendingProblem(p)?.kind, 'config');
    assert.equal(pendingFailure(p, pendingProblem(p)!, 1).permanent, true);
    assert.equal(pendingProblem(pod(0, 'Pending', { state: waiting('ContainerCreating', '') })), null);
    assert.equal(pendingProblem(pod(0, 'Running')), null);
  });
});

describe('kubernetes launcher: API errors', () => {
  const call = { verb: 'create', resource: 'jobs/x', namespace: 'trainers' };
  const status = (code: number, body: Record<string, unknown>) =>
    new ApiException(code, 'x', JSON.stringify(body), {});

  it('rejected credentials, RBAC, a missing namespace and an invalid object are not retried', () => {
    const cases: [unknown, RegExp][] = [
      [
        new ApiException(401, 'Unauthorized', undefined, {}),
        /cannot create jobs\/x in namespace trainers: .*credentials \(401\)/,
      ],
      [
        status(403, {
          reason: 'Forbidden',
          message: 'jobs.batch is forbidden: User "system:serviceaccount:w:w" cannot create resource "jobs"',
        }),
        /cannot create jobs\/x in namespace trainers: forbidden \(403\): jobs.batch is forbidden/,
      ],
      [
        status(404, { reason: 'NotFound', details: { kind: 'namespaces', name: 'trainers' } }),
        /namespace trainers does not exist/,
      ],
      [
        status(422, {
          reason: 'Invalid',
          message: 'Job.batch "x" is invalid: spec.template.spec.containers[0].resources',
        }),
        /rejected it \(422\): Job.batch "x" is invalid/,
      ],
    ];
    for (const [err, message] of cases) {
      const failure = kubernetesFailure(err, call);
      assert.ok(failure instanceof ApplicationFailure);
      assert.equal(failure.nonRetryable, true, failure.message);
      assert.match(failure.message, message);
    }
  });

  it('an unreachable or overloaded API server is retried', () => {
    const refused = Object.assign(new Error('request to https://127.0.0.1:1/ failed'), {
      code: 'ECONNREFUSED',
    });
    for (const err of [
      status(503, { message: 'etcdserver: leader changed' }),
      status(429, {}),
      status(409, { reason: 'Conflict' }),
      refused,
    ]) {
      const failure = kubernetesFailure(err, call);
      assert.equal(failure.nonRetryable, false, failure.message);
      assert.match(failure.message, /^Kubernetes API: cannot create jobs\/x in namespace trainers/);
    }
    assert.match(kubernetesFailure(refused, call).message, /ECONNREFUSED/);
  });
});

describe('kubernetes launcher: gang restarts', () => {
  it('counts each gang restart once, however many ranks were lost', () => {
    assert.equal(gangRestarts([]), 0);
    assert.equal(gangRestarts([pod(0, 'Running'), pod(1, 'Running')]), 0);
    // One restart after ranks 1 and 2 were lost together: every rank has one failed pod, and
    // the Job controller wrote each rank's failure on its new pod (ranks 0 and 3 exited 75,
    // ignored; rank 1 was force-deleted and stopped by SIGTERM, 143, ignored; rank 2 crashed).
    const first = [
      pod(0, 'Failed', { state: exited(75) }),
      pod(1, 'Failed', { state: exited(143) }),
      pod(2, 'Failed', { state: exited(1) }),
      pod(3, 'Failed', { state: exited(75) }),
    ];
    const failures: [number, number][] = [
      [0, 1],
      [0, 1],
      [1, 0],
      [0, 1],
    ];
    const second = [0, 1, 2, 3].map((r) => pod(r, 'Running', { suffix: 'bbbbb', failures: failures[r] }));
    assert.equal(gangRestarts([...first, ...second]), 1);
    // The failed pods may be gone (force-deleted, or removed once counted): the new ones tell.
    assert.equal(gangRestarts(second), 1);
    // A second restart: rank 3 lost, the others exited 75 once more.
    const third = [0, 1, 2, 3].map((r) =>
      pod(r, 'Running', {
        suffix: 'ccccc',
        failures: [failures[r]![0] + (r === 3 ? 1 : 0), failures[r]![1] + (r === 3 ? 0 : 1)],
      }),
    );
    assert.equal(gangRestarts(third), 2);
  });

  it('counts a rank replaced alone while the group formed once, and never the pods the Job stopped after it succeeded', () => {
    // Rank 2 lost while rank 0 still admitted ranks: its replacement took its place.
    assert.equal(
      gangRestarts([0, 1, 3].map((r) => pod(r, 'Running')).concat(pod(2, 'Running', { failures: [0, 1] }))),
      1,
    );
    // The success policy met, the Job stopped the ranks not yet exited (143): no restart.
    const done = [
      pod(0, 'Succeeded', { state: exited(0) }),
      ...[1, 2, 3].map((r) => pod(r, 'Failed', { state: exited(143) })),
    ];
    assert.equal(gangRestarts(done), 0);
  });

  it('says a rank that exited 75 restarted with its gang, and never blames it for a failed Job', () => {
    const peer = pod(4, 'Failed', { state: exited(75) });
    assert.equal(
      podAccount(peer),
      "rank 4 (pod grpo-u1-abcd-4-aaaaa) exited with code 75 (a peer was lost): restarted with the job's other ranks",
    );
    const { failure } = failedJobFailure(failedJob('BackoffLimitExceeded', 'limit'), [peer]);
    assert.equal(failure.rank, null);
  });
});
