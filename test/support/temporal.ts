// Test harness for integration tests: a real Temporal dev server (the pinned CLI from
// scripts/tools.sh) on free loopback ports, with the campaign search attributes registered.
// One environment per suite; workers per test with `worker.runUntil(...)`.
import type { Client, Connection } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime, makeTelemetryFilterString } from '@temporalio/worker';
import type { NativeConnection } from '@temporalio/worker';
import { resolveTool } from '../../cli/temporal-tools.js';
import { campaignSearchAttributes } from '../../workflows/search-attributes.js';

export interface TestEnvironment {
  env: TestWorkflowEnvironment;
  client: Client;
  /** Connection for `client`; gives the raw workflow and operator services. */
  connection: Connection;
  /** Connection for workers: `Worker.create({ connection: nativeConnection, ... })`. */
  nativeConnection: NativeConnection;
  namespace: string;
  /** Frontend address, `127.0.0.1:<port>`. */
  address: string;
  teardown(): Promise<void>;
}

export interface TestEnvironmentOptions {
  /** Namespace created at start; default "default". */
  namespace?: string;
  /** SQLite file for persistence across restarts; in-memory when absent. */
  dbFile?: string;
  /** Server dynamic config, e.g. `{ 'matching.wv.VersionDrainageStatusRefreshInterval': '1s' }`. */
  dynamicConfig?: Record<string, string | number | boolean>;
}

/**
 * Test output shows SDK errors only: worker state changes and the activity failures that tests
 * provoke on purpose would bury the results. Must run before anything creates the runtime.
 */
function quietRuntime(): void {
  try {
    Runtime.install({
      logger: new DefaultLogger('ERROR'),
      telemetryOptions: { logging: { filter: makeTelemetryFilterString({ core: 'ERROR' }) } },
    });
  } catch {
    // Already installed in this process.
  }
}

/**
 * The SDK gives the dev server 5 s to listen, a limit of its native code: on a loaded 2-core
 * machine the server sometimes needs longer. Two more tries before the test fails.
 */
async function startingServer<T>(start: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start();
    } catch (err) {
      if (attempt >= 3 || !/Failed to start ephemeral server/.test(String(err))) throw err;
    }
  }
}

export async function startTestEnvironment(opts: TestEnvironmentOptions = {}): Promise<TestEnvironment> {
  quietRuntime();
  const namespace = opts.namespace ?? 'default';
  const temporal = await resolveTool('temporal');
  const env = await startingServer(() =>
    TestWorkflowEnvironment.createLocal({
      server: {
        executable: { type: 'existing-path', path: temporal },
        ip: '127.0.0.1',
        namespace,
        searchAttributes: campaignSearchAttributes,
        ui: false,
        log: { format: 'pretty', level: 'warn' },
        ...(opts.dbFile ? { dbFilename: opts.dbFile } : {}),
        extraArgs: Object.entries(opts.dynamicConfig ?? {}).flatMap(([key, value]) => [
          '--dynamic-config-value',
          `${key}=${JSON.stringify(value)}`,
        ]),
      },
    }),
  );
  return {
    env,
    client: env.client,
    connection: env.connection,
    nativeConnection: env.nativeConnection,
    namespace,
    address: env.address,
    teardown: () => env.teardown(),
  };
}
