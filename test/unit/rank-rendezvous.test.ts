// The rendezvous part of the rank contract as the launchers set it: the deadlines from the spec
// (start-up defaulting to the launcher's pending timeout, exchange to 60 s), validated and in
// the JSON Schema; a trainer pod's token from the job's own Secret (never a value in the Job),
// rank 0 listening on its pod IP; the Secret owned by the Job; fresh tokens per job.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { stringify } from 'yaml';
import { parseSpecText } from '../../cli/spec-file.js';
import {
  jobManifest,
  ownerLabels,
  tokenSecretManifest,
  tokenSecretName,
} from '../../activities/launch/kubernetes/manifests.js';
import { newJobToken } from '../../activities/launch/rendezvous.js';
import { emptyTrainJob } from '../support/train-job-spec.js';
import { kubernetesLauncherSchema } from '../../workflows/spec-kubernetes.js';
import { rankDeadlines } from '../../workflows/spec-rendezvous.js';
import { SpecError, campaignSpecJsonSchema } from '../../workflows/spec.js';
import { validSpecDoc } from '../support/spec-docs.js';

const minimal = { kind: 'kubernetes', namespace: 'moerl', image: 'moerl/moerl:0.1.0' };
const s3 = { kind: 's3', bucket: 'moerl-campaigns', region: 'us-west-2' };

function problemsWith(launcher: Record<string, unknown>): string[] {
  const doc = { ...validSpecDoc(), launcher, store: launcher.kind === 'kubernetes' ? s3 : undefined };
  if (doc.store === undefined) delete doc.store;
  try {
    parseSpecText(stringify(doc), 'spec.yaml');
    return [];
  } catch (err) {
    assert.ok(err instanceof SpecError, String(err));
    return err.problems;
  }
}

const spec = emptyTrainJob('grpo-u3-1a2b3c4d', 2, { campaignId: 'c1', iteration: 3, attempt: 1 });

function podEnv(launcher: Record<string, unknown>) {
  const job = jobManifest(spec, kubernetesLauncherSchema.parse({ ...minimal, ...launcher }));
  return { job, env: job.spec!.template.spec!.containers[0]!.env! };
}

describe('rank deadlines in the spec', () => {
  it('default to the launcher’s pending timeout (start-up) and 60 s (each exchange)', () => {
    assert.deepEqual(rankDeadlines({ kind: 'local' }), {
      startupTimeoutSeconds: 600,
      exchangeTimeoutSeconds: 60,
    });
    const k8s = kubernetesLauncherSchema.parse({ ...minimal, unschedulableTimeoutSeconds: 900 });
    assert.deepEqual(rankDeadlines(k8s), { startupTimeoutSeconds: 900, exchangeTimeoutSeconds: 60 });
    assert.deepEqual(rankDeadlines({ ...k8s, startupTimeoutSeconds: 1800, exchangeTimeoutSeconds: 120 }), {
      startupTimeoutSeconds: 1800,
      exchangeTimeoutSeconds: 120,
    });
  });

  it('are accepted on either launcher and checked, each problem naming the field', () => {
    assert.deepEqual(
      problemsWith({ kind: 'local', startupTimeoutSeconds: 1200, exchangeTimeoutSeconds: 90 }),
      [],
    );
    assert.deepEqual(problemsWith({ ...minimal, startupTimeoutSeconds: 1200 }), []);
    const problems = problemsWith({ kind: 'local', startupTimeoutSeconds: 0, exchangeTimeoutSeconds: 1.5 });
    assert.equal(problems.length, 2, problems.join('\n'));
    assert.match(problems.join('\n'), /launcher\.startupTimeoutSeconds/);
    assert.match(problems.join('\n'), /launcher\.exchangeTimeoutSeconds/);
    assert.match(
      problemsWith({ ...minimal, startupTimeoutSeconds: 8 * 24 * 3600 }).join('\n'),
      /startupTimeoutSeconds/,
    );
  });

  it('are described in the JSON Schema of both launcher kinds', () => {
    const text = JSON.stringify(campaignSpecJsonSchema());
    assert.equal(text.split('"startupTimeoutSeconds"').length - 1, 2, 'local and kubernetes');
    assert.equal(text.split('"exchangeTimeoutSeconds"').length - 1, 2, 'local and kubernetes');
    assert.match(text, /MOERL_STARTUP_TIMEOUT_S/);
  });

  it('reach every trainer pod as MOERL_STARTUP_TIMEOUT_S and MOERL_TIMEOUT_S', () => {
    const value = (env: ReturnType<typeof podEnv>['env'], name: string) =>
      env.find((e) => e.name === name)?.value;
    const defaults = podEnv({}).env;
    assert.equal(value(defaults, 'MOERL_STARTUP_TIMEOUT_S'), '600');
    assert.equal(value(defaults, 'MOERL_TIMEOUT_S'), '60');
    const set = podEnv({ startupTimeoutSeconds: 1500, exchangeTimeoutSeconds: 45 }).env;
    assert.equal(value(set, 'MOERL_STARTUP_TIMEOUT_S'), '1500');
    assert.equal(value(set, 'MOERL_TIMEOUT_S'), '45');
  });
});

describe('job token and bind address on Kubernetes', () => {
  it('gives each pod the token from the job’s Secret and its pod IP to listen on, no literal token', () => {
    const { job, env } = podEnv({});
    const token = env.find((e) => e.name === 'MOERL_JOB_TOKEN');
    assert.deepEqual(token, {
      name: 'MOERL_JOB_TOKEN',
      valueFrom: { secretKeyRef: { name: `${spec.name}-token`, key: 'token' } },
    });
    assert.deepEqual(
      env.find((e) => e.name === 'MOERL_BIND_ADDRESS'),
      {
        name: 'MOERL_BIND_ADDRESS',
        valueFrom: { fieldRef: { fieldPath: 'status.podIP' } },
      },
    );
    assert.equal(env.filter((e) => e.name.startsWith('MOERL_JOB_TOKEN')).length, 1);
    assert.doesNotMatch(JSON.stringify(job), /stringData|"data"/);
  });

  it('keeps the token in a Secret owned by the Job, with the job’s owner labels', () => {
    const settings = kubernetesLauncherSchema.parse(minimal);
    const token = newJobToken();
    const secret = tokenSecretManifest(spec, settings, { name: spec.name, uid: 'uid-7' }, token);
    assert.equal(secret.metadata?.name, tokenSecretName(spec.name));
    assert.equal(secret.metadata?.namespace, 'moerl');
    assert.deepEqual(secret.metadata?.ownerReferences, [
      { apiVersion: 'batch/v1', kind: 'Job', name: spec.name, uid: 'uid-7' },
    ]);
    assert.deepEqual(secret.metadata?.labels, ownerLabels(spec));
    assert.deepEqual(secret.stringData, { token });
    assert.equal(secret.immutable, true);
  });

  it('makes a fresh 256-bit token for every job', () => {
    const tokens = new Set(Array.from({ length: 100 }, () => newJobToken()));
    assert.equal(tokens.size, 100);
    for (const t of tokens) assert.match(t, /^[A-Za-z0-9_-]{43}$/);
  });
});
