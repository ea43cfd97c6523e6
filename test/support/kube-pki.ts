// Certificates and kubeconfigs for a test Kubernetes control plane, made with the openssl CLI:
// a CA, the apiserver's serving certificate, one client certificate per component identity,
// and the service-account token signing key pair. P-256 keys: quick to generate, and every
// component accepts them.
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface CertPair {
  certPath: string;
  keyPath: string;
}

export interface ClusterPki {
  ca: CertPair;
  /** Serving certificate of the apiserver (127.0.0.1, localhost, kubernetes.default.svc...). */
  apiserver: CertPair;
  /** Serving certificate for 127.0.0.1 shared by the controller manager and the scheduler. */
  loopbackServing: CertPair;
  /** Clients: kubernetes-admin (system:masters), the controller manager, the scheduler. */
  admin: CertPair;
  controllerManager: CertPair;
  scheduler: CertPair;
  /** The apiserver's client certificate towards kubelets (logs, exec). */
  apiserverKubeletClient: CertPair;
  /** The apiserver's client certificate towards aggregated API servers (KEDA's metrics server). */
  frontProxyClient: CertPair;
  /** Service-account token signing key (private, PEM) and its public key. */
  serviceAccountKey: string;
  serviceAccountPub: string;
}

/** DNS names of the `kubernetes` Service, for the apiserver certificate. */
export const apiserverServiceNames = [
  'kubernetes',
  'kubernetes.default',
  'kubernetes.default.svc',
  'kubernetes.default.svc.cluster.local',
];

/** The one name the apiserver's aggregation layer accepts as its front proxy. */
export const frontProxyClientName = 'front-proxy-client';

export interface CertRequest {
  /** Subject common name: the user name for client certificates. */
  cn: string;
  /** Subject organizations: the groups for client certificates. */
  orgs?: string[];
  /** 'both': a mutual-TLS peer that serves and connects with one certificate. */
  usage: 'client' | 'server' | 'both';
  dnsNames?: string[];
  ips?: string[];
  days?: number;
}

/**
 * Issues a certificate signed by `ca` into `<dir>/<name>.crt` and `.key`. Exported so that a
 * node harness can mint a kubelet's client certificate (CN system:node:<name>, O system:nodes).
 */
export async function issueCert(
  dir: string,
  name: string,
  ca: CertPair,
  req: CertRequest,
): Promise<CertPair> {
  for (const value of [req.cn, ...(req.orgs ?? []), ...(req.dnsNames ?? []), ...(req.ips ?? [])]) {
    // openssl's config syntax has no quoting; such a value would change the certificate.
    if (!/^[A-Za-z0-9.:_*@-]+$/.test(value))
      throw new Error(`issueCert(${name}): unsupported character in subject or name "${value}"`);
  }
  const pair = { certPath: join(dir, `${name}.crt`), keyPath: join(dir, `${name}.key`) };
  const config = join(dir, `${name}.cnf`);
  const subject = [...(req.orgs ?? []).map((org, i) => `${i}.O = ${org}`), `CN = ${req.cn}`];
  const altNames = [
    ...(req.dnsNames ?? []).map((dns) => `DNS:${dns}`),
    ...(req.ips ?? []).map((ip) => `IP:${ip}`),
  ];
  writeFileSync(
    config,
    [
      '[req]',
      'prompt = no',
      'distinguished_name = subject',
      'x509_extensions = ext',
      '[subject]',
      ...subject,
      '[ext]',
      'basicConstraints = critical,CA:FALSE',
      'keyUsage = critical,digitalSignature,keyEncipherment',
      `extendedKeyUsage = ${{ client: 'clientAuth', server: 'serverAuth', both: 'serverAuth,clientAuth' }[req.usage]}`,
      'subjectKeyIdentifier = hash',
      'authorityKeyIdentifier = keyid',
      ...(altNames.length ? [`subjectAltName = ${altNames.join(',')}`] : []),
      '',
    ].join('\n'),
  );
  await openssl([
    'req',
    '-x509',
    '-config',
    config,
    ...newKey(pair.keyPath),
    '-out',
    pair.certPath,
    '-days',
    String(req.days ?? 30),
    '-CA',
    ca.certPath,
    '-CAkey',
    ca.keyPath,
  ]);
  return pair;
}

/** A certificate authority: `<dir>/<name>.crt` and `.key`, valid 30 days. */
export async function createCa(dir: string, name: string, cn: string): Promise<CertPair> {
  const ca = { certPath: join(dir, `${name}.crt`), keyPath: join(dir, `${name}.key`) };
  const caConfig = join(dir, `${name}.cnf`);
  writeFileSync(
    caConfig,
    [
      '[req]',
      'prompt = no',
      'distinguished_name = subject',
      'x509_extensions = ext',
      '[subject]',
      `CN = ${cn}`,
      '[ext]',
      'basicConstraints = critical,CA:TRUE',
      'keyUsage = critical,keyCertSign,cRLSign,digitalSignature',
      'subjectKeyIdentifier = hash',
      '',
    ].join('\n'),
  );
  await openssl([
    'req',
    '-x509',
    '-config',
    caConfig,
    ...newKey(ca.keyPath),
    '-out',
    ca.certPath,
    '-days',
    '30',
  ]);
  return ca;
}

/**
 * A client certificate signed by `ca` that was valid for one day in 2020 (`openssl ca`: the one
 * command that sets both dates), for the tests of an expired certificate.
 */
export async function issueExpiredClientCert(
  dir: string,
  name: string,
  ca: CertPair,
  cn: string,
): Promise<CertPair> {
  const pair = { certPath: join(dir, `${name}.crt`), keyPath: join(dir, `${name}.key`) };
  const db = join(dir, `${name}-ca`);
  mkdirSync(db, { recursive: true });
  writeFileSync(join(db, 'index.txt'), '');
  writeFileSync(join(db, 'serial'), '01\n');
  const config = join(db, 'ca.cnf');
  writeFileSync(
    config,
    [
      '[ca]',
      'default_ca = test_ca',
      '[test_ca]',
      `database = ${join(db, 'index.txt')}`,
      `new_certs_dir = ${db}`,
      `serial = ${join(db, 'serial')}`,
      'default_md = sha256',
      'policy = any',
      'x509_extensions = ext',
      '[any]',
      'commonName = supplied',
      '[ext]',
      'basicConstraints = critical,CA:FALSE',
      'keyUsage = critical,digitalSignature,keyEncipherment',
      'extendedKeyUsage = clientAuth',
      '',
    ].join('\n'),
  );
  const csr = join(db, 'request.csr');
  await openssl(['req', '-new', ...newKey(pair.keyPath), '-subj', `/CN=${cn}`, '-out', csr]);
  await openssl([
    'ca',
    '-batch',
    '-config',
    config,
    '-cert',
    ca.certPath,
    '-keyfile',
    ca.keyPath,
    '-in',
    csr,
    '-out',
    pair.certPath,
    '-startdate',
    '20200101000000Z',
    '-enddate',
    '20200102000000Z',
    '-notext',
  ]);
  return pair;
}

export async function createClusterPki(dir: string): Promise<ClusterPki> {
  const ca = await createCa(dir, 'ca', 'moerl-test-cluster-ca');
  const serviceAccountKey = join(dir, 'sa.key');
  const serviceAccountPub = join(dir, 'sa.pub');
  const client = (name: string, cn: string, orgs: string[] = []) =>
    issueCert(dir, name, ca, { cn, orgs, usage: 'client' });
  const [
    apiserver,
    loopbackServing,
    admin,
    controllerManager,
    scheduler,
    apiserverKubeletClient,
    frontProxyClient,
  ] = await Promise.all([
    issueCert(dir, 'apiserver', ca, {
      cn: 'kube-apiserver',
      usage: 'server',
      dnsNames: ['localhost', ...apiserverServiceNames],
      ips: ['127.0.0.1', serviceIp(1)],
    }),
    issueCert(dir, 'loopback-serving', ca, {
      cn: 'localhost',
      usage: 'server',
      dnsNames: ['localhost'],
      ips: ['127.0.0.1'],
    }),
    client('admin', 'kubernetes-admin', ['system:masters']),
    client('controller-manager', 'system:kube-controller-manager'),
    client('scheduler', 'system:kube-scheduler'),
    client('apiserver-kubelet-client', 'kube-apiserver-kubelet-client', ['system:masters']),
    client('front-proxy-client', frontProxyClientName),
    openssl([
      'genpkey',
      '-algorithm',
      'EC',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-out',
      serviceAccountKey,
    ]),
  ]);
  await openssl(['pkey', '-in', serviceAccountKey, '-pubout', '-out', serviceAccountPub]);
  return {
    ca,
    apiserver,
    loopbackServing,
    admin,
    controllerManager,
    scheduler,
    apiserverKubeletClient,
    frontProxyClient,
    serviceAccountKey,
    serviceAccountPub,
  };
}

/** The service network (never routed: nothing sends traffic there) and its n-th address. */
export const serviceClusterIpRange = '10.96.0.0/24';
export function serviceIp(n: number): string {
  return `10.96.0.${n}`;
}

/** Writes a kubeconfig for `server` authenticating with `client`, all data embedded. */
export function writeKubeconfig(path: string, server: string, ca: CertPair, client: CertPair): void {
  const data = (file: string) => readFileSync(file).toString('base64');
  const config = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'moerl-test', cluster: { server, 'certificate-authority-data': data(ca.certPath) } }],
    users: [
      {
        name: 'moerl-test',
        user: {
          'client-certificate-data': data(client.certPath),
          'client-key-data': data(client.keyPath),
        },
      },
    ],
    contexts: [{ name: 'moerl-test', context: { cluster: 'moerl-test', user: 'moerl-test' } }],
    'current-context': 'moerl-test',
  };
  // JSON is YAML: every kubeconfig reader accepts it.
  writeFileSync(path, JSON.stringify(config, null, 2) + '\n', { mode: 0o600 });
}

function newKey(keyPath: string): string[] {
  return ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', keyPath];
}

async function openssl(args: string[]): Promise<void> {
  try {
    await run('openssl', args, { timeout: 30_000 });
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim();
    throw new Error(
      `openssl ${args.join(' ')} failed: ${stderr || (err instanceof Error ? err.message : String(err))}`,
    );
  }
}
