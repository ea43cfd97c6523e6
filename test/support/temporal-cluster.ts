// A production-shaped Temporal cluster for the tests and benchmarks: PostgreSQL (Debian's
// packages) in a data directory of its own on a loopback port, run as an unprivileged user (it
// refuses root); the schemas made by the server's own SQL tool; and the server's services as
// separate processes — 1 frontend, 2 history hosts splitting the shards, 1 matching, 1 worker —
// with SQL visibility on PostgreSQL and the campaign search attributes registered. Binaries
// come from scripts/tools.sh (temporal-server, pinned to the dev server's server version), the
// database from `scripts/setup.sh temporal-cluster`. Every process can be killed, stopped with
// SIGSTOP and started again on its own ports: the fault trials of the cluster tier.
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  readFileSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Connection, Client } from '@temporalio/client';
import { msToTs } from '@temporalio/common/lib/time.js';
import { createServer } from 'node:net';
import { freePort, findOnPath, logTail } from '../../cli/dev-server.js';
import { spawnGroup, type GroupProcess } from './process-group.js';
import { resolveTool } from '../../cli/temporal-tools.js';
import { campaignNameKey, campaignSearchAttributes } from '../../workflows/search-attributes.js';

export type ClusterService = 'frontend' | 'history-1' | 'history-2' | 'matching' | 'worker';
export type ClusterProcess = ClusterService | 'postgres';
export const clusterServices: readonly ClusterService[] = [
  'history-1',
  'history-2',
  'matching',
  'frontend',
  'worker',
];

export interface TemporalCluster {
  /** The frontend's gRPC address, `127.0.0.1:<port>`. */
  address: string;
  namespace: string;
  numHistoryShards: number;
  client: Client;
  connection: Connection;
  /** Each history host's identity as the shards record their owner (`127.0.0.1:<grpc port>`). */
  historyHosts: Record<'history-1' | 'history-2', string>;
  /** Signals a process's group and waits for it to exit (SIGKILL, or SIGINT: PostgreSQL's fast shutdown). */
  kill(target: ClusterProcess, signal?: NodeJS.Signals): Promise<void>;
  /** Starts a killed process again on the same ports and data; resolves once it serves. */
  start(target: ClusterProcess): Promise<void>;
  /** SIGSTOP on every process of the target's group for `ms`, then SIGCONT. */
  stall(target: ClusterProcess, ms: number): Promise<void>;
  /** Shard id → the history host that owns it now (read from the database). */
  shardOwners(): Promise<Map<number, string>>;
  /** Resolves once the running history hosts own every shard between them, each some. */
  shardsSettled(): Promise<void>;
  /** The history host that owns the shard of a workflow's current run. */
  historyHostOf(workflowId: string): Promise<'history-1' | 'history-2'>;
  /** Runs SQL on the cluster's database `db`; the rows as tab-separated lines. */
  sql(db: 'temporal' | 'temporal_visibility', query: string): string[];
  /** The tail of every process's log, for a failure message. */
  logs(): string;
  stop(): Promise<void>;
}

export interface TemporalClusterOptions {
  namespace?: string;
  /** Shards of the history service, split between the two hosts (default 8). */
  numHistoryShards?: number;
  /** Server dynamic config (`frontend.x: value`). */
  dynamicConfig?: Record<string, string | number | boolean>;
  /**
   * TLS on the frontend, client certificates required and checked against `ca` (PEM files);
   * the server's certificate must name `localhost`. `client` is the harness's own client and
   * the worker service's, towards the frontend.
   */
  tls?: { ca: string; server: PemPair; client: PemPair };
}

export interface PemPair {
  cert: string;
  key: string;
}

/** The PostgreSQL server binaries of the newest version installed (Debian's layout). */
function postgresBin(): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => existsSync(join(root, v, 'bin', 'postgres')))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (!versions[0])
    throw new Error(
      `PostgreSQL is not installed (no ${root}/*/bin/postgres): run bash scripts/setup.sh temporal-cluster`,
    );
  return join(root, versions[0], 'bin');
}

/** The user PostgreSQL runs as: this one, or an unprivileged one when this is root. */
function databaseUser(): { name: string; uid: number; gid: number } | undefined {
  if (process.getuid?.() !== 0) return undefined;
  for (const name of ['postgres', 'nobody']) {
    const id = spawnSync('id', ['-u', name], { encoding: 'utf8' });
    const gid = spawnSync('id', ['-g', name], { encoding: 'utf8' });
    if (id.status === 0 && gid.status === 0) return { name, uid: Number(id.stdout), gid: Number(gid.stdout) };
  }
  throw new Error('running as root, and neither a postgres nor a nobody user exists to run PostgreSQL as');
}

async function waitUntil(
  what: string,
  timeoutMs: number,
  ready: () => Promise<boolean | string>,
  logs: () => string,
) {
  const deadline = Date.now() + timeoutMs;
  let last: boolean | string = false;
  while (Date.now() < deadline) {
    try {
      last = await ready();
      if (last === true) return;
    } catch (err) {
      last = err instanceof Error ? err.message : String(err);
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`${what} not ready after ${timeoutMs} ms (last: ${String(last)})\n${logs()}`);
}

/**
 * A free loopback port below 32768: the server's SQL schema keeps membership ports in a SMALLINT
 * column (cluster_membership.rpc_port), so a port from the ephemeral range fails every heartbeat.
 */
async function freeMembershipPort(): Promise<number> {
  for (;;) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    const free = await new Promise<boolean>((resolve) => {
      const probe = createServer();
      probe.once('error', () => resolve(false));
      probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
    });
    if (free) return port;
  }
}

/** The config of mTLS on the frontend: its serving pair, and the worker service's client pair. */
function frontendTls(tls: NonNullable<TemporalClusterOptions['tls']>): string {
  return `  tls:
    frontend:
      server:
        certFile: ${tls.server.cert}
        keyFile: ${tls.server.key}
        requireClientAuth: true
        clientCaFiles: [${tls.ca}]
      client:
        serverName: localhost
        rootCaFiles: [${tls.ca}]
    systemWorker:
      certFile: ${tls.client.cert}
      keyFile: ${tls.client.key}
      client:
        serverName: localhost
        rootCaFiles: [${tls.ca}]
`;
}

const grpcTypeName: Record<string, number> = {
  KEYWORD: 2,
  INT: 3,
  DOUBLE: 4,
  BOOL: 5,
  DATETIME: 6,
  TEXT: 1,
  KEYWORD_LIST: 7,
};

export async function startTemporalCluster(
  dir: string,
  opts: TemporalClusterOptions = {},
): Promise<TemporalCluster> {
  const namespace = opts.namespace ?? 'default';
  const numHistoryShards = opts.numHistoryShards ?? 8;
  const [server, sqlTool, schema] = await Promise.all([
    resolveTool('temporal-server'),
    resolveTool('temporal-sql-tool'),
    resolveTool('temporal-server-schema'),
  ]);
  const bin = postgresBin();
  mkdirSync(dir, { recursive: true });
  const configDir = join(dir, 'config');
  mkdirSync(configDir, { recursive: true });

  // ---- PostgreSQL: its own folder (the test's may not be reachable by its user) ----
  const owner = databaseUser();
  const pgDir = mkdtempSync(join(tmpdir(), 'moerl-pg-'));
  chmodSync(pgDir, 0o755);
  const pgData = join(pgDir, 'data');
  const pgLog = join(dir, 'postgres.log');
  writeFileSync(pgLog, '');
  if (owner) {
    chownSync(pgDir, owner.uid, owner.gid);
    chownSync(pgLog, owner.uid, owner.gid);
  }
  const setpriv = findOnPath('setpriv');
  const asOwner = (command: string, args: string[]): [string, string[]] =>
    owner
      ? [
          setpriv ?? 'setpriv',
          [`--reuid=${owner.uid}`, `--regid=${owner.gid}`, '--clear-groups', '--', command, ...args],
        ]
      : [command, args];
  const run = (command: string, args: string[], what: string) => {
    const [file, argv] = asOwner(command, args);
    const out = spawnSync(file, argv, { encoding: 'utf8', cwd: pgDir });
    if (out.status !== 0)
      throw new Error(`${what} failed (${file} ${argv.join(' ')}):\n${out.stdout}${out.stderr}`);
    return out.stdout;
  };
  run(
    join(bin, 'initdb'),
    ['-D', pgData, '-U', 'temporal', '--auth=trust', '-E', 'UTF8', '--no-sync'],
    'initdb',
  );
  const pgPort = await freePort();
  let postgres: GroupProcess | undefined;
  const startPostgres = async () => {
    // fsync off: a test database on a loaded machine; the faults are of processes, not of the disk.
    const [file, argv] = asOwner(join(bin, 'postgres'), [
      '-D',
      pgData,
      '-p',
      String(pgPort),
      '-c',
      'listen_addresses=127.0.0.1',
      '-c',
      `unix_socket_directories=${pgDir}`,
      '-c',
      'fsync=off',
      '-c',
      'synchronous_commit=off',
      '-c',
      'max_connections=200',
    ]);
    postgres = spawnGroup('postgres', file, argv, pgLog);
    await waitUntil(
      'PostgreSQL',
      60_000,
      async () => {
        const out = spawnSync(
          join(bin, 'pg_isready'),
          ['-h', '127.0.0.1', '-p', String(pgPort), '-U', 'temporal'],
          { encoding: 'utf8' },
        );
        return out.status === 0 || out.stdout.trim();
      },
      () => logTail(pgLog, 0),
    );
  };
  await startPostgres();
  const sql = (db: 'temporal' | 'temporal_visibility', query: string): string[] => {
    const out = spawnSync(
      join(bin, 'psql'),
      ['-h', '127.0.0.1', '-p', String(pgPort), '-U', 'temporal', '-d', db, '-At', '-F', '\t', '-c', query],
      { encoding: 'utf8' },
    );
    if (out.status !== 0) throw new Error(`psql ${db}: ${query}: ${out.stderr.trim()}`);
    return out.stdout.split('\n').filter(Boolean);
  };

  // ---- schemas, by the server's own tool and its module's schema files ----
  for (const [db, folder] of [
    ['temporal', 'temporal'],
    ['temporal_visibility', 'visibility'],
  ] as const) {
    const tool = (...args: string[]) => {
      const out = spawnSync(
        sqlTool,
        [
          '--plugin',
          'postgres12',
          '--ep',
          '127.0.0.1',
          '-p',
          String(pgPort),
          '-u',
          'temporal',
          '--db',
          db,
          ...args,
        ],
        { encoding: 'utf8' },
      );
      if (out.status !== 0)
        throw new Error(`temporal-sql-tool ${args.join(' ')} on ${db} failed:\n${out.stdout}${out.stderr}`);
    };
    tool('create-database');
    tool('setup-schema', '-v', '0.0');
    tool('update-schema', '-d', join(schema, folder, 'versioned'));
  }

  // ---- the services' config: one base, one file per process for its own ports ----
  const ports = async () => ({ grpc: await freePort(), membership: await freeMembershipPort() });
  const servicePorts = {
    frontend: { ...(await ports()), http: await freePort() },
    'history-1': await ports(),
    'history-2': await ports(),
    matching: await ports(),
    worker: await ports(),
  };
  const rpc = (p: { grpc: number; membership: number; http?: number }) =>
    `rpc:\n      grpcPort: ${p.grpc}\n      membershipPort: ${p.membership}\n      bindOnLocalHost: true${p.http ? `\n      httpPort: ${p.http}` : ''}`;
  const address = `127.0.0.1:${servicePorts.frontend.grpc}`;
  const datastore = (db: string, conns: number) => `      sql:
        pluginName: postgres12
        databaseName: ${db}
        connectAddr: "127.0.0.1:${pgPort}"
        connectProtocol: tcp
        user: temporal
        password: ""
        maxConns: ${conns}
        maxIdleConns: ${conns}
        maxConnLifetime: 1h`;
  writeFileSync(
    join(configDir, 'base.yaml'),
    `log:
  stdout: true
  level: warn
persistence:
  defaultStore: default
  visibilityStore: visibility
  numHistoryShards: ${numHistoryShards}
  datastores:
    default:
${datastore('temporal', 10)}
    visibility:
${datastore('temporal_visibility', 4)}
global:
  membership:
    maxJoinDuration: 30s
    broadcastAddress: 127.0.0.1
${opts.tls ? frontendTls(opts.tls) : ''}services:
  frontend:
    ${rpc(servicePorts.frontend)}
  history:
    ${rpc(servicePorts['history-1'])}
  matching:
    ${rpc(servicePorts.matching)}
  worker:
    ${rpc(servicePorts.worker)}
clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: active
  currentClusterName: active
  clusterInformation:
    active:
      enabled: true
      initialFailoverVersion: 1
      rpcName: frontend
      rpcAddress: ${address}
dcRedirectionPolicy:
  policy: noop
dynamicConfigClient:
  filepath: ${join(configDir, 'dynamicconfig.yaml')}
  pollInterval: 10s
`,
  );
  // The second history host differs from the base in its ports only.
  writeFileSync(
    join(configDir, 'history-2.yaml'),
    `services:\n  history:\n    ${rpc(servicePorts['history-2'])}\n`,
  );
  for (const service of clusterServices)
    if (service !== 'history-2') writeFileSync(join(configDir, `${service}.yaml`), '{}\n');
  writeFileSync(
    join(configDir, 'dynamicconfig.yaml'),
    Object.entries(opts.dynamicConfig ?? {})
      .map(([key, value]) => `${key}:\n  - value: ${JSON.stringify(value)}\n`)
      .join('') || '{}\n',
  );

  const running = new Map<ClusterProcess, GroupProcess>();
  const logFile = (target: ClusterProcess) => (target === 'postgres' ? pgLog : join(dir, `${target}.log`));
  const logs = () => [...clusterServices, 'postgres' as const].map((t) => logTail(logFile(t), 0)).join('\n');
  const startService = (service: ClusterService) => {
    const role = service.startsWith('history') ? 'history' : service;
    running.set(
      service,
      spawnGroup(
        service,
        server,
        ['-r', dir, '-c', 'config', '-e', service, '--allow-no-auth', 'start', '--service', role],
        logFile(service),
      ),
    );
  };
  running.set('postgres', postgres!);
  // The first service to start writes the cluster's metadata into the empty database; services
  // started beside it race it for that row, and the losers exit ("failed to initialize current
  // cluster metadata"). One first, then the rest.
  const [first, ...rest] = clusterServices;
  startService(first!);
  await waitUntil(
    'the cluster metadata',
    120_000,
    async () => sql('temporal', 'SELECT cluster_name FROM cluster_metadata_info').length > 0,
    logs,
  );
  for (const service of rest) startService(service);

  // The frontend serves once it answers; the namespace and search attributes are then made as
  // an operator would (the dev server's flags do this for the other tests).
  let connection: Connection | undefined;
  await waitUntil(
    'the frontend',
    120_000,
    async () => {
      connection ??= await Connection.connect({
        address,
        connectTimeout: 2_000,
        ...(opts.tls
          ? {
              tls: {
                serverNameOverride: 'localhost',
                serverRootCACertificate: readFileSync(opts.tls.ca),
                clientCertPair: {
                  crt: readFileSync(opts.tls.client.cert),
                  key: readFileSync(opts.tls.client.key),
                },
              },
            }
          : {}),
      });
      await connection.workflowService.getSystemInfo({});
      return true;
    },
    logs,
  );
  const conn = connection!;
  try {
    await conn.workflowService.registerNamespace({
      namespace,
      workflowExecutionRetentionPeriod: msToTs('1 day'),
    });
  } catch (err) {
    if (!/already exists/i.test(String(err))) throw err;
  }
  await waitUntil(
    'the namespace',
    60_000,
    async () => {
      await conn.workflowService.describeNamespace({ namespace });
      return true;
    },
    logs,
  );
  await conn.operatorService.addSearchAttributes({
    namespace,
    searchAttributes: Object.fromEntries(
      campaignSearchAttributes.map((k) => [k.name, grpcTypeName[k.type]!]),
    ),
  });
  const client = new Client({ connection: conn, namespace });
  // The frontend learns of new search attributes when its namespace cache refreshes (every 10 s
  // by default): a workflow that sets one is refused until then. A probe, started and ended.
  await waitUntil(
    'the search attributes',
    60_000,
    async () => {
      const probe = await client.workflow.start('searchAttributesProbe', {
        taskQueue: 'cluster-probe',
        workflowId: `search-attributes-probe-${Date.now()}`,
        typedSearchAttributes: [{ key: campaignNameKey, value: 'probe' }],
      });
      await probe.terminate('probe');
      return true;
    },
    logs,
  );

  const historyHosts = {
    'history-1': `127.0.0.1:${servicePorts['history-1'].grpc}`,
    'history-2': `127.0.0.1:${servicePorts['history-2'].grpc}`,
  };
  // A shard's owner is in its record (the ShardInfo blob): the host's identity, in clear text.
  const shardOwners = async () => {
    const owners = new Map<number, string>();
    for (const line of sql(
      'temporal',
      "SELECT shard_id, encode(data, 'escape') FROM shards ORDER BY shard_id",
    )) {
      const [id, data] = line.split('\t');
      const host = Object.values(historyHosts).find((h) => data?.includes(h));
      if (host) owners.set(Number(id), host);
    }
    return owners;
  };
  const shardsSettled = () =>
    waitUntil(
      'the history shards',
      120_000,
      async () => {
        const hosts = (['history-1', 'history-2'] as const)
          .filter((h) => running.has(h))
          .map((h) => historyHosts[h]);
        const owners = [...(await shardOwners()).values()];
        const settled =
          owners.filter((h) => hosts.includes(h)).length === numHistoryShards &&
          hosts.every((h) => owners.includes(h));
        return settled || `owners ${JSON.stringify(owners)}, running hosts ${hosts.join(', ')}`;
      },
      logs,
    );
  await shardsSettled();

  const kill = async (target: ClusterProcess, signal: NodeJS.Signals = 'SIGKILL') => {
    const proc = running.get(target);
    if (!proc) return;
    proc.signal('SIGCONT');
    proc.signal(signal);
    const timer = setTimeout(() => proc.signal('SIGKILL'), 20_000);
    await proc.exited;
    clearTimeout(timer);
    running.delete(target);
  };

  return {
    address,
    namespace,
    numHistoryShards,
    client,
    connection: conn,
    historyHosts,
    kill,
    async start(target) {
      if (running.has(target)) return;
      if (target === 'postgres') {
        await startPostgres();
        running.set('postgres', postgres!);
        return;
      }
      startService(target);
      if (target === 'frontend')
        await waitUntil(
          'the frontend',
          60_000,
          async () => {
            await conn.workflowService.describeNamespace({ namespace });
            return true;
          },
          logs,
        );
      if (target.startsWith('history')) await shardsSettled();
    },
    async stall(target, ms) {
      const proc = running.get(target);
      if (!proc) return;
      proc.signal('SIGSTOP');
      await new Promise((resolve) => setTimeout(resolve, ms));
      proc.signal('SIGCONT');
    },
    shardOwners,
    shardsSettled,
    async historyHostOf(workflowId) {
      const [shard] = sql(
        'temporal',
        `SELECT shard_id FROM current_executions WHERE workflow_id = '${workflowId.replace(/'/g, "''")}'`,
      );
      const owner = shard === undefined ? undefined : (await shardOwners()).get(Number(shard));
      const host = (['history-1', 'history-2'] as const).find((h) => historyHosts[h] === owner);
      if (!host)
        throw new Error(`no history host owns workflow ${workflowId}'s shard (${shard ?? 'no current run'})`);
      return host;
    },
    sql,
    logs,
    async stop() {
      await conn.close().catch(() => undefined);
      for (const service of [...clusterServices].reverse()) await kill(service, 'SIGTERM');
      await kill('postgres', 'SIGINT');
      rmSync(pgDir, { recursive: true, force: true });
    },
  };
}
