// The worker's Worker Versioning options: unversioned by default, both names or neither.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseWorkerArgs } from '../../workers/main.js';

describe('worker versioning options', () => {
  test('unversioned without a deployment name and build id', () => {
    assert.equal(parseWorkerArgs([], {}).deployment, undefined);
  });

  test('flags win over the environment', () => {
    const env = { TEMPORAL_DEPLOYMENT_NAME: 'moerl', TEMPORAL_WORKER_BUILD_ID: '0.1.0' };
    assert.deepEqual(parseWorkerArgs([], env).deployment, { deploymentName: 'moerl', buildId: '0.1.0' });
    assert.deepEqual(parseWorkerArgs(['--build-id', '0.2.0'], env).deployment, {
      deploymentName: 'moerl',
      buildId: '0.2.0',
    });
  });

  test('one without the other, or a malformed name, is an error naming the option', () => {
    assert.throws(() => parseWorkerArgs(['--build-id', '0.2.0'], {}), /needs both --deployment-name/);
    assert.throws(
      () => parseWorkerArgs([], { TEMPORAL_DEPLOYMENT_NAME: 'moerl' }),
      /--build-id \(TEMPORAL_WORKER_BUILD_ID\)/,
    );
    assert.throws(
      () => parseWorkerArgs(['--deployment-name', 'moerl:prod', '--build-id', '1'], {}),
      /--deployment-name must be .*got "moerl:prod"/,
    );
    assert.throws(
      () => parseWorkerArgs(['--deployment-name', 'moerl', '--build-id', '0.2 rc'], {}),
      /--build-id must be .*got "0.2 rc"/,
    );
  });
});
