// The cluster tier: campaigns on a production-shaped Temporal cluster (separate frontend, two
// history hosts, matching and worker services on PostgreSQL, SQL visibility), and one seeded
// trial per fault kind while a campaign runs — a history host SIGKILLed (its shards move to the
// other), matching restarted, PostgreSQL restarted (fast shutdown) and stalled with SIGSTOP for
// 20 s, the frontend SIGKILLed. Each trial must find work in flight when it strikes and end with
// the fault-free run's checkpoint, file by file. The full matrix is bench/temporal_cluster.ts.
// Then mTLS on a frontend with TLS on, certificates made by the test (OpenSSL).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { openStore } from '../../activities/store/index.js';
import { campaignStatusKey } from '../../workflows/search-attributes.js';
import { connectClient, temporalOptionsFrom, tlsHandshakeFailure } from '../../workers/temporal-options.js';
import { spawnWatchedWorker, waitFor } from '../support/campaign-harness.js';
import {
  chaosSpec,
  checkpointDigests,
  clusterTemporal,
  runTrial,
  startChaosStack,
  type ChaosStack,
  type TrialOutcome,
} from '../support/chaos.js';
import { clusterFaultKinds, clusterFaultTrial } from '../support/cluster-faults.js';
import { createCa, issueCert, issueExpiredClientCert, type CertPair } from '../support/kube-pki.js';
import { nativeTools } from '../support/native-tools.js';
import { startTemporalCluster, type TemporalCluster } from '../support/temporal-cluster.js';

const tools = nativeTools(['moe_train', 'moe_generate']);
const seed = Number(process.env.MOERL_CLUSTER_SEED ?? 3);

let dir: string;
let cluster: TemporalCluster;
let stack: ChaosStack;
let reference: TrialOutcome;
let want: Record<string, string>;

describe(
  'a Temporal cluster of separate services on PostgreSQL',
  { skip: tools.skip, timeout: 900_000 },
  () => {
    before(async () => {
      dir = mkdtempSync(join(tmpdir(), 'moerl-cluster-'));
      cluster = await startTemporalCluster(join(dir, 'temporal'));
      stack = await startChaosStack(join(dir, 'stack'), {}, clusterTemporal(cluster));
    });
    after(async () => {
      await stack?.stop();
      rmSync(dir, { recursive: true, force: true });
    });

    test('a campaign completes on it, with the shards split between the two history hosts', async () => {
      const owners = new Set((await cluster.shardOwners()).values());
      assert.deepEqual(
        [...owners].sort(),
        Object.values(cluster.historyHosts).sort(),
        'both history hosts own shards',
      );
      reference = await runTrial(stack, chaosSpec('cluster-reference', dir), [], 240_000);
      assert.equal(reference.state.committedIteration, 4, 'the campaign commits all 4 iterations');
      want = await checkpointDigests(openStore(chaosSpec('x', dir).store), reference.campaignId, 4);
      // SQL visibility serves moerl's search attributes.
      const listed = [];
      for await (const w of cluster.client.workflow.list({
        query: `WorkflowId = "${reference.campaignId}" AND ${campaignStatusKey.name} = "completed"`,
      }))
        listed.push(w.workflowId);
      assert.ok(listed.length >= 1, 'the completed campaign is listed by its search attributes');
      console.log(
        `cluster reference: ${reference.wallMs} ms, runs ${reference.runs}, lost ${JSON.stringify(reference.lost)}`,
      );
    });

    for (const kind of clusterFaultKinds)
      test(`${kind}: the campaign ends with the fault-free checkpoint`, async (t) => {
        if (!reference) return t.skip('the fault-free campaign did not complete');
        const trial = await clusterFaultTrial(stack, kind, seed, reference, dir);
        console.log(`cluster fault ${kind} (seed ${seed}): ${trial.summary}`);
        assert.deepEqual(stack.unexpectedExits, [], 'no worker exited unless told to');
        assert.ok(
          trial.fault.inFlight.length > 0,
          `work was in flight when ${kind} struck: ${trial.summary}`,
        );
        assert.equal(trial.outcome.state.committedIteration, 4);
        assert.deepEqual(
          await checkpointDigests(openStore(chaosSpec('x', dir).store), trial.outcome.campaignId, 4),
          want,
          `${kind}: the final checkpoint's files equal the fault-free run's`,
        );
        if (kind === 'history SIGKILL') {
          assert.ok(
            trial.servedWhileDown > 0,
            `the surviving history host served the campaign: ${trial.summary}`,
          );
        }
      });
  },
);

describe('mTLS on the cluster frontend', { timeout: 300_000 }, () => {
  let tlsDir: string;
  let tlsCluster: TemporalCluster;
  let pki: { ca: CertPair; client: CertPair; otherCa: CertPair; expired: CertPair; stranger: CertPair };
  const optionsFor = (client: CertPair, ca: CertPair) =>
    temporalOptionsFrom(
      {},
      {
        TEMPORAL_ADDRESS: tlsCluster.address,
        TEMPORAL_TLS_CERT: client.certPath,
        TEMPORAL_TLS_KEY: client.keyPath,
        TEMPORAL_TLS_CA: ca.certPath,
        TEMPORAL_TLS_SERVER_NAME: 'localhost',
      },
    );
  before(async () => {
    tlsDir = mkdtempSync(join(tmpdir(), 'moerl-cluster-tls-'));
    const ca = await createCa(tlsDir, 'ca', 'moerl-test-temporal-ca');
    const otherCa = await createCa(tlsDir, 'other-ca', 'moerl-test-other-ca');
    const [server, client, stranger, expired] = await Promise.all([
      issueCert(tlsDir, 'frontend', ca, {
        cn: 'localhost',
        usage: 'server',
        dnsNames: ['localhost'],
        ips: ['127.0.0.1'],
      }),
      issueCert(tlsDir, 'client', ca, { cn: 'moerl-worker', usage: 'client' }),
      issueCert(tlsDir, 'stranger', otherCa, { cn: 'moerl-worker', usage: 'client' }),
      issueExpiredClientCert(tlsDir, 'expired', ca, 'moerl-worker'),
    ]);
    pki = { ca, client, otherCa, expired, stranger };
    const pem = (p: CertPair) => ({ cert: p.certPath, key: p.keyPath });
    tlsCluster = await startTemporalCluster(join(tlsDir, 'temporal'), {
      tls: { ca: ca.certPath, server: pem(server), client: pem(client) },
    });
  });
  after(async () => {
    await tlsCluster?.stop();
    rmSync(tlsDir, { recursive: true, force: true });
  });

  test("the workers' TLS options reach it, and a worker process polls through them", async () => {
    const opts = optionsFor(pki.client, pki.ca);
    const { connection } = await connectClient(opts);
    try {
      await connection.withDeadline(Date.now() + 10_000, () =>
        connection.workflowService.describeNamespace({ namespace: 'default' }),
      );
    } finally {
      await connection.close();
    }
    const { worker, log, exited } = spawnWatchedWorker('control', {
      TEMPORAL_ADDRESS: tlsCluster.address,
      TEMPORAL_TLS_CERT: pki.client.certPath,
      TEMPORAL_TLS_KEY: pki.client.keyPath,
      TEMPORAL_TLS_CA: pki.ca.certPath,
      TEMPORAL_TLS_SERVER_NAME: 'localhost',
      MOERL_TASK_QUEUE_PREFIX: 'tls-',
    });
    try {
      await waitFor(
        'the worker to poll',
        async () => (/roles control on/.test(log()) ? true : undefined),
        60_000,
      );
    } finally {
      worker.kill('SIGTERM');
    }
    assert.equal(await exited, 0, log());
  });

  test("a server certificate from another CA is refused, with the handshake's reason", async () => {
    const err = await connectClient(optionsFor(pki.client, pki.otherCa), 5_000).then(
      () => assert.fail('connected to a server its CA did not sign'),
      (e: unknown) => e as Error,
    );
    assert.match(
      String(err),
      new RegExp(
        `cannot connect to Temporal at ${tlsCluster.address}: the TLS handshake failed: .*certificate`,
      ),
    );
  });

  test("a client certificate the frontend's CA did not sign is refused by the server, with its reason", async () => {
    const err = await connectClient(optionsFor(pki.stranger, pki.ca), 5_000).then(
      () => assert.fail('a stranger certificate was accepted'),
      (e: unknown) => e as Error,
    );
    assert.match(String(err), /the TLS handshake failed: .*(alert|certificate)/);
  });

  test('an expired client certificate is named before any connection, and the server refuses it too', async () => {
    assert.throws(
      () => optionsFor(pki.expired, pki.ca),
      new RegExp(`TLS certificate ${pki.expired.certPath} expired on Jan  2 00:00:00 2020 GMT`),
    );
    // The server's own check, past the workers' own.
    const why = await tlsHandshakeFailure(tlsCluster.address, {
      serverNameOverride: 'localhost',
      serverRootCACertificate: readFileSync(pki.ca.certPath),
      clientCertPair: { crt: readFileSync(pki.expired.certPath), key: readFileSync(pki.expired.keyPath) },
    });
    assert.match(why ?? 'accepted', /alert|certificate/);
  });
});
