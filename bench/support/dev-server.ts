// What the benches share: connections to the dev server they started.
import type { Client } from '@temporalio/client';
import type { NativeConnection } from '@temporalio/worker';
import type { DevServer } from '../../cli/dev-server.js';
import { connectClient, connectWorkerConnection } from '../../workers/temporal-options.js';

export interface DevServerConnections {
  client: Client;
  /** What the bench's workers poll through. */
  workerConnection: NativeConnection;
  /** Closes the client's connection and the workers'. */
  close(): Promise<void>;
}

/** A client and a worker connection to `server`, in its namespace. */
export async function connectDevServer(server: DevServer): Promise<DevServerConnections> {
  const opts = { address: server.address, namespace: server.namespace };
  const { client, connection } = await connectClient(opts);
  const workerConnection = await connectWorkerConnection(opts);
  return {
    client,
    workerConnection,
    close: async () => {
      await connection.close();
      await workerConnection.close();
    },
  };
}
