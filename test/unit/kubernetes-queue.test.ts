// Trainer Jobs under a Kueue queue (launcher.queueName): the spec field and its errors, the Job
// created suspended with the queue label (on the Job only), and the clock that keeps a Job's
// queue wait apart from its run time across admission, preemption and adoption.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Job } from '@kubernetes/client-node';
import { stringify } from 'yaml';
import { jobManifest, serviceManifest } from '../../activities/launch/kubernetes/manifests.js';
import { QueueClock, isQueued } from '../../activities/launch/kubernetes/queue.js';
import { emptyTrainJob } from '../support/train-job-spec.js';
import { parseSpecText } from '../../cli/spec-file.js';
import { SpecError } from '../../workflows/spec.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import { validSpecDoc } from '../support/spec-docs.js';

const minimal = { kind: 'kubernetes', namespace: 'moerl', image: 'moerl/moerl:0.1.0' };
const s3 = { kind: 's3', bucket: 'moerl-campaigns', region: 'us-west-2' };

function problems(launcher: Record<string, unknown>): string[] {
  try {
    parseSpecText(
      stringify({ ...validSpecDoc(), launcher: { ...minimal, ...launcher }, store: s3 }),
      'q.yaml',
    );
  } catch (err) {
    assert.ok(err instanceof SpecError, String(err));
    return err.problems;
  }
  assert.fail('the spec was accepted');
}

const spec = emptyTrainJob('grpo-u3-1a2b3c4d', 2, { campaignId: 'c', iteration: 3, attempt: 1 }, 'r');

describe('launcher.queueName', () => {
  it('is optional, and a LocalQueue name must be a DNS-1123 label', () => {
    const ok = parseSpecText(
      stringify({ ...validSpecDoc(), launcher: { ...minimal, queueName: 'team-a' }, store: s3 }),
      'q.yaml',
    );
    assert.equal(ok.launcher.kind === 'kubernetes' && ok.launcher.queueName, 'team-a');
    const bad = problems({ queueName: 'Team_A' });
    assert.equal(bad.length, 1, bad.join('\n'));
    assert.match(bad[0]!, /launcher\.queueName/);
    assert.match(bad[0]!, /DNS-1123 label \(a Kueue LocalQueue name\)/);
  });

  it('may not be set through launcher.labels, which would leave the Job unsuspended', () => {
    const bad = problems({ labels: { 'kueue.x-k8s.io/queue-name': 'team-a' } });
    assert.equal(bad.length, 1, bad.join('\n'));
    assert.match(bad[0]!, /launcher\.labels\.kueue\.x-k8s\.io\/queue-name.*launcher\.queueName/);
  });

  it('creates the Job suspended with the queue label on the Job only; without it the Job starts at once', () => {
    const queued = kubernetesLauncherSchema.parse({ ...minimal, queueName: 'team-a' });
    const job = jobManifest(spec, queued);
    assert.equal(job.spec?.suspend, true);
    assert.equal(job.metadata?.labels?.['kueue.x-k8s.io/queue-name'], 'team-a');
    assert.equal(job.spec?.template.metadata?.labels?.['kueue.x-k8s.io/queue-name'], undefined);
    const service = serviceManifest(spec, queued, { name: spec.name, uid: 'u' });
    assert.equal(service.metadata?.labels?.['kueue.x-k8s.io/queue-name'], undefined);
    const plain = jobManifest(spec, kubernetesLauncherSchema.parse(minimal));
    assert.equal('suspend' in (plain.spec ?? {}), false);
    assert.equal(plain.metadata?.labels?.['kueue.x-k8s.io/queue-name'], undefined);
  });
});

const t0 = Date.parse('2026-01-01T00:00:00Z');
const at = (s: number) => new Date(t0 + s * 1000).toISOString();

function job(opts: {
  suspend?: boolean;
  suspended?: { status: 'True' | 'False'; at: number };
  startTime?: number;
  complete?: number;
}): V1Job {
  const conditions = [
    ...(opts.suspended
      ? [{ type: 'Suspended', status: opts.suspended.status, lastTransitionTime: at(opts.suspended.at) }]
      : []),
    ...(opts.complete !== undefined
      ? [{ type: 'Complete', status: 'True', lastTransitionTime: at(opts.complete) }]
      : []),
  ];
  return {
    metadata: { name: 'j', creationTimestamp: at(0) as unknown as Date },
    spec: { template: {}, ...(opts.suspend !== undefined ? { suspend: opts.suspend } : {}) },
    status: {
      conditions: conditions as unknown as NonNullable<V1Job['status']>['conditions'],
      ...(opts.startTime !== undefined ? { startTime: at(opts.startTime) as unknown as Date } : {}),
      ...(opts.complete !== undefined ? { completionTime: at(opts.complete) as unknown as Date } : {}),
    },
  };
}

describe('QueueClock', () => {
  const ms = (s: number) => t0 + s * 1000;

  it('counts the wait from creation to admission and the run from admission to completion', () => {
    const clock = new QueueClock();
    clock.observe(job({ suspend: true }), ms(1));
    assert.deepEqual(clock.times(ms(10)), { queueWaitSeconds: 10, runSeconds: 0 });
    clock.observe(job({ suspend: false, suspended: { status: 'False', at: 30 }, startTime: 30 }), ms(30));
    assert.deepEqual(clock.times(ms(40)), { queueWaitSeconds: 30, runSeconds: 10 });
    clock.observe(job({ suspend: false, startTime: 30, complete: 90 }), ms(91));
    assert.deepEqual(clock.times(ms(500)), { queueWaitSeconds: 30, runSeconds: 60 });
  });

  it('counts a preemption (suspended again) as one more wait, not as run time', () => {
    const clock = new QueueClock();
    clock.observe(job({ suspend: true }), ms(0));
    clock.observe(job({ suspend: false, startTime: 20 }), ms(20));
    clock.observe(job({ suspend: true, suspended: { status: 'True', at: 50 } }), ms(50));
    assert.equal(isQueued(job({ suspend: true })), true);
    clock.observe(job({ suspend: false, startTime: 70 }), ms(70));
    assert.deepEqual(clock.times(ms(100)), { queueWaitSeconds: 40, runSeconds: 60 });
  });

  it('an adopted Job keeps the wait its own timestamps show', () => {
    const waiting = new QueueClock();
    waiting.observe(job({ suspend: true, suspended: { status: 'True', at: 1 } }), ms(45));
    assert.deepEqual(waiting.times(ms(45)), { queueWaitSeconds: 44, runSeconds: 0 });
    const admitted = new QueueClock();
    admitted.observe(job({ suspend: false, suspended: { status: 'False', at: 25 }, startTime: 25 }), ms(40));
    assert.deepEqual(admitted.times(ms(40)), { queueWaitSeconds: 25, runSeconds: 15 });
    const finished = new QueueClock();
    finished.observe(
      job({ suspend: false, suspended: { status: 'False', at: 5 }, startTime: 5, complete: 65 }),
      ms(99),
    );
    assert.deepEqual(finished.times(ms(99)), { queueWaitSeconds: 5, runSeconds: 60 });
  });

  it('a Job that never queued reports no wait', () => {
    const clock = new QueueClock();
    clock.observe(job({ startTime: 1 }), ms(2));
    assert.deepEqual(clock.times(ms(11)), { queueWaitSeconds: 0, runSeconds: 10 });
    assert.equal(isQueued(job({ suspend: true, complete: 3 })), false, 'a finished Job is not queued');
  });
});
