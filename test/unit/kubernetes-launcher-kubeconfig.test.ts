// Where a worker's Kubernetes credentials come from: the files KUBECONFIG names, else (outside a
// cluster) ~/.kube/config; none at all is a clear, non-retryable failure.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { ApplicationFailure } from '@temporalio/common';
import { kubeConfigFromEnvironment } from '../../activities/launch/kubernetes.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-kubeconfig-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function kubeconfig(path: string, server: string): string {
  writeFileSync(
    path,
    [
      'apiVersion: v1',
      'kind: Config',
      `clusters: [{ name: c, cluster: { server: "${server}" } }]`,
      'users: [{ name: u, user: { token: t } }]',
      'contexts: [{ name: x, context: { cluster: c, user: u } }]',
      'current-context: x',
    ].join('\n'),
  );
  return path;
}

describe('kubernetes launcher credentials', () => {
  it('reads the kubeconfig KUBECONFIG names', () => {
    const file = kubeconfig(join(dir, 'a.yaml'), 'https://127.0.0.1:6443');
    const config = kubeConfigFromEnvironment({ KUBECONFIG: file, KUBERNETES_SERVICE_HOST: '10.0.0.1' });
    assert.equal(config.getCurrentCluster()?.server, 'https://127.0.0.1:6443');
  });

  it('reads ~/.kube/config without KUBECONFIG outside a cluster', () => {
    const home = join(dir, 'home');
    mkdirSync(join(home, '.kube'), { recursive: true });
    kubeconfig(join(home, '.kube', 'config'), 'https://127.0.0.1:7443');
    assert.equal(
      kubeConfigFromEnvironment({ HOME: home }).getCurrentCluster()?.server,
      'https://127.0.0.1:7443',
    );
  });

  it('fails without retries, saying what to set, when there are no credentials', () => {
    const home = join(dir, 'empty');
    mkdirSync(home);
    assert.throws(
      () => kubeConfigFromEnvironment({ HOME: home }),
      (err) => {
        assert.ok(err instanceof ApplicationFailure);
        assert.equal(err.nonRetryable, true);
        assert.match(
          err.message,
          /set KUBECONFIG, write .*empty\/\.kube\/config, or run the worker in the cluster/,
        );
        return true;
      },
    );
  });
});
