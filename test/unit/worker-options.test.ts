// Worker entrypoint options and the Temporal connection options shared with the CLI.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { parseWorkerArgs } from '../../workers/main.js';
import { apiKeyFlagWarning, taskQueuesFrom, temporalOptionsFrom } from '../../workers/temporal-options.js';
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

  test("the worker's own pod: both Downward API values or neither", () => {
    assert.equal(parseWorkerArgs([], {}).pod, undefined);
    assert.deepEqual(parseWorkerArgs([], { MOERL_POD_NAME: 'p-1', MOERL_POD_NAMESPACE: 'moerl' }).pod, {
      name: 'p-1',
      namespace: 'moerl',
    });
    assert.throws(
      () => parseWorkerArgs([], { MOERL_POD_NAME: 'p-1' }),
      /MOERL_POD_NAME and MOERL_POD_NAMESPACE go together/,
    );
  });

  test('the rollout demand interval: 10 s by default, a bad value named', () => {
    assert.equal(parseWorkerArgs([], {}).metrics.demandIntervalMs, 10_000);
    assert.equal(
      parseWorkerArgs([], { MOERL_DEMAND_INTERVAL_SECONDS: '2.5' }).metrics.demandIntervalMs,
      2500,
    );
    assert.throws(
      () => parseWorkerArgs([], { MOERL_DEMAND_INTERVAL_SECONDS: '0' }),
      /MOERL_DEMAND_INTERVAL_SECONDS must be seconds from 0.1 to 3600, got "0"/,
    );
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

  test('item 11b: the API key comes from --api-key-file or TEMPORAL_API_KEY_FILE; --api-key warns', () => {
    const dir = mkdtempSync(join(tmpdir(), 'moerl-api-key-'));
    try {
      const file = join(dir, 'key');
      writeFileSync(file, 'file-key\n');
      const fromFile = parseWorkerArgs(['--api-key-file', file], {});
      assert.equal(fromFile.temporal.apiKey, 'file-key');
      assert.ok(fromFile.temporal.tls, 'an API key implies TLS');
      assert.deepEqual(fromFile.warnings, []);
      assert.equal(parseWorkerArgs([], { TEMPORAL_API_KEY_FILE: file }).temporal.apiKey, 'file-key');
      // Flags before the environment, the key itself before a key file.
      assert.equal(
        temporalOptionsFrom({}, { TEMPORAL_API_KEY: 'env', TEMPORAL_API_KEY_FILE: file }).apiKey,
        'env',
      );
      assert.equal(temporalOptionsFrom({ apiKeyFile: file }, { TEMPORAL_API_KEY: 'env' }).apiKey, 'file-key');

      const flag = parseWorkerArgs(['--api-key', 'visible'], {});
      assert.equal(flag.temporal.apiKey, 'visible');
      assert.deepEqual(flag.warnings, [apiKeyFlagWarning]);
      assert.match(
        apiKeyFlagWarning,
        /--api-key shows the key .*\(ps, \/proc\); use TEMPORAL_API_KEY, --api-key-file FILE/,
      );

      assert.throws(
        () => parseWorkerArgs(['--api-key', 'a', '--api-key-file', file], {}),
        /--api-key or --api-key-file, not both/,
      );
      assert.throws(
        () => temporalOptionsFrom({ apiKeyFile: join(dir, 'missing') }, {}),
        /cannot read API key file .*missing/,
      );
      writeFileSync(file, 'two\nlines\n');
      assert.throws(
        () => temporalOptionsFrom({ apiKeyFile: file }, {}),
        (err: unknown) =>
          /is empty or holds more than one line/.test(String(err)) && !String(err).includes('two'),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('task queues take the deployment prefix', () => {
    assert.deepEqual(taskQueuesFrom({ MOERL_TASK_QUEUE_PREFIX: 'exp7-' }), {
      control: 'exp7-control',
      rollout: 'exp7-rollout',
      train: 'exp7-train',
    });
  });
});
