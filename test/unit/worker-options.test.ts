// Worker entrypoint options and the Temporal connection options shared with the CLI.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseWorkerArgs } from '../../workers/main.js';
import { taskQueuesFrom, temporalOptionsFrom } from '../../workers/temporal-options.js';
import { expandRoles } from '../../workers/worker.js';

describe('worker options', () => {
  test('roles come from flags, else MOERL_WORKER_ROLES, else all', () => {
    assert.deepEqual(parseWorkerArgs(['--role', 'rollout', '--role', 'train'], {}).roles, [
      'rollout',
      'train',
    ]);
    assert.deepEqual(parseWorkerArgs([], { MOERL_WORKER_ROLES: 'control, rollout' }).roles, [
      'control',
      'rollout',
    ]);
    assert.deepEqual(parseWorkerArgs([], {}).roles, ['all']);
    assert.deepEqual(expandRoles(['all', 'train']).sort(), ['control', 'rollout', 'train']);
  });

  test('bad roles and grace periods are rejected with the value named', () => {
    assert.throws(
      () => parseWorkerArgs(['--role', 'trainer'], {}),
      /unknown role "trainer"; allowed: control, rollout, train, all/,
    );
    assert.throws(() => parseWorkerArgs(['--shutdown-grace-seconds', 'soon'], {}), /got "soon"/);
    assert.equal(parseWorkerArgs([], { MOERL_SHUTDOWN_GRACE_SECONDS: '7.5' }).shutdownGraceMs, 7500);
  });

  test('connection options: flags win over the environment; an API key implies TLS', () => {
    const env = { TEMPORAL_ADDRESS: 'temporal:7233', TEMPORAL_NAMESPACE: 'rl', TEMPORAL_API_KEY: 'k' };
    const fromEnv = temporalOptionsFrom({}, env);
    assert.equal(fromEnv.address, 'temporal:7233');
    assert.equal(fromEnv.namespace, 'rl');
    assert.equal(fromEnv.apiKey, 'k');
    assert.ok(fromEnv.tls);
    assert.equal(temporalOptionsFrom({ address: 'x:1' }, env).address, 'x:1');
    assert.deepEqual(temporalOptionsFrom({}, {}), { address: '127.0.0.1:7233', namespace: 'default' });
    assert.throws(
      () => temporalOptionsFrom({ tlsCert: 'c.pem' }, {}),
      /both a client certificate and its key/,
    );
    assert.throws(
      () => temporalOptionsFrom({ tlsCa: 'no-such-ca.pem' }, {}),
      /cannot read TLS CA certificate no-such-ca.pem/,
    );
  });

  test('task queues take the deployment prefix', () => {
    assert.deepEqual(taskQueuesFrom({ MOERL_TASK_QUEUE_PREFIX: 'exp7-' }), {
      control: 'exp7-control',
      rollout: 'exp7-rollout',
      train: 'exp7-train',
    });
  });
});
