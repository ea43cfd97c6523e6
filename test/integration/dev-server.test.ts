// The real Temporal dev server, started both ways the project starts it: startDevServer (the
// `moerl dev` path, with SQLite persistence) and the test harness (TestWorkflowEnvironment).
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Client, Connection, WorkflowNotFoundError } from '@temporalio/client';
import { DevServerError, freePort, startDevServer, type DevServer } from '../../cli/dev-server.js';
import { campaignSearchAttributes } from '../../workflows/search-attributes.js';
import { startTestEnvironment, type TestEnvironment } from '../support/temporal.js';

// temporal.api.enums.v1.IndexedValueType, by wire number.
const indexedValueTypes = [
  'UNSPECIFIED',
  'TEXT',
  'KEYWORD',
  'INT',
  'DOUBLE',
  'BOOL',
  'DATETIME',
  'KEYWORD_LIST',
];

// The custom search attributes the server reports, as name → type name (e.g. 'KEYWORD').
async function customSearchAttributes(
  connection: Connection,
  namespace: string,
): Promise<Map<string, string>> {
  const response = await connection.operatorService.listSearchAttributes({ namespace });
  const types = new Map<string, string>();
  for (const [name, type] of Object.entries(response.customAttributes ?? {})) {
    types.set(name, indexedValueTypes[Number(type)] ?? `unknown type ${type}`);
  }
  return types;
}

function assertCampaignSearchAttributes(registered: Map<string, string>): void {
  for (const key of campaignSearchAttributes) {
    assert.equal(registered.get(key.name), key.type, `search attribute ${key.name}`);
  }
}

describe('startDevServer', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-dev-server-test-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('serves on loopback with the campaign search attributes and keeps workflows in its db file', async () => {
    const dbFile = join(dir, 'temporal.db');
    const logFile = join(dir, 'temporal.log');
    const namespace = 'moerl-test';
    const workflowId = `dev-server-persistence-${process.pid}-${Date.now()}`;

    let server: DevServer = await startDevServer({ dbFile, logFile, namespace });
    try {
      assert.match(server.address, /^127\.0\.0\.1:\d+$/);
      assert.match(server.uiUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
      assert.equal(server.namespace, namespace);
      const connection = await Connection.connect({ address: server.address });
      try {
        assertCampaignSearchAttributes(await customSearchAttributes(connection, namespace));
        // No worker polls this queue: the workflow stays running, which is all we need.
        const client = new Client({ connection, namespace });
        await client.workflow.start('campaign', { taskQueue: 'no-worker', workflowId, args: [] });
      } finally {
        await connection.close();
      }
    } finally {
      await server.stop();
    }
    assert.ok(existsSync(dbFile), 'the db file exists after stop');

    server = await startDevServer({ dbFile, logFile, namespace });
    try {
      const connection = await Connection.connect({ address: server.address });
      try {
        const client = new Client({ connection, namespace });
        const description = await client.workflow.getHandle(workflowId).describe();
        assert.equal(description.status.name, 'RUNNING');
        assert.equal(description.type, 'campaign');
        await client.workflow.getHandle(workflowId).terminate('test done');
      } finally {
        await connection.close();
      }
    } finally {
      await server.stop();
    }
  });

  it('forgets workflows without a db file', async () => {
    const server = await startDevServer();
    try {
      const connection = await Connection.connect({ address: server.address });
      try {
        const client = new Client({ connection });
        await assert.rejects(client.workflow.getHandle('never-started').describe(), WorkflowNotFoundError);
      } finally {
        await connection.close();
      }
    } finally {
      await server.stop();
    }
    assert.ok(!existsSync(server.logFile), 'the temporary log is removed by stop');
  });

  it('fails with the log tail when the server cannot start', async () => {
    const logFile = join(dir, 'bad.log');
    await assert.rejects(
      startDevServer({ logFile, dbFile: join(dir, 'no-such-dir', 'x.db'), startTimeoutMs: 30_000 }),
      (err: Error) => {
        assert.equal(err.name, 'DevServerError');
        assert.match(err.message, /exited with code/);
        assert.match(err.message, /bad\.log \(tail\)/);
        return true;
      },
    );
    assert.ok(readFileSync(logFile, 'utf8').length > 0);
  });

  it('starts again on other ports when a start panics on a port taken meanwhile (fake temporal binary)', async () => {
    // A start that lost one of its internal ports to another process: a Go panic whose cause
    // comes first and whose stack fills more than the log tail quoted in errors.
    const fake = join(dir, 'fake-temporal');
    const starts = join(dir, 'starts');
    writeFileSync(
      fake,
      `#!/bin/sh\necho start >> '${starts}'\necho 'panic: listen tcp 127.0.0.1:40001: bind: address already in use'\n` +
        `i=0; while [ $i -lt 200 ]; do echo "\tgo.uber.org/dig.paramList.BuildList frame $i"; i=$((i+1)); done\nexit 2\n`,
      { mode: 0o755 },
    );
    await assert.rejects(
      startDevServer({ temporalPath: fake, logFile: join(dir, 'panic.log') }),
      (err: Error) => {
        assert.ok(err instanceof DevServerError && err.addressInUse, String(err));
        assert.match(err.message, /exited with code 2/);
        assert.match(err.message, /\npanic: listen tcp 127\.0\.0\.1:40001: bind: address already in use\n/);
        return true;
      },
    );
    assert.equal(
      readFileSync(starts, 'utf8').split('\n').filter(Boolean).length,
      3,
      'three starts, each on new ports',
    );
  });

  it('a port it picks, held back from port-0 binds by TIME_WAIT, can still be listened on', async () => {
    const port = await freePort();
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', resolve);
    });
    await new Promise((resolve) => server.close(resolve));
  });
});

describe('startTestEnvironment', () => {
  let testEnv: TestEnvironment;
  before(async () => {
    testEnv = await startTestEnvironment();
  });
  after(async () => {
    await testEnv?.teardown();
  });

  it('runs a local dev server with the campaign search attributes', async () => {
    assert.match(testEnv.address, /^127\.0\.0\.1:\d+$/);
    assertCampaignSearchAttributes(await customSearchAttributes(testEnv.connection, testEnv.namespace));
    const workflowId = `test-env-${process.pid}-${Date.now()}`;
    const handle = await testEnv.client.workflow.start('campaign', {
      taskQueue: 'no-worker',
      workflowId,
      args: [],
    });
    assert.equal((await handle.describe()).status.name, 'RUNNING');
    await handle.terminate('test done');
  });
});
