// Reaching a versitygw (support/versitygw.ts) the way the chaos suite and bench do: the store a
// campaign names (through a fault proxy when given its endpoint), and, straight to the server,
// the store and plain S3 client that check what a reader sees, and its credentials as AWS env.
import { S3Client } from '@aws-sdk/client-s3';
import { S3Store, type S3Location } from '../../activities/store/index.js';
import type { Versitygw } from './versitygw.js';

/** Bucket `bucket` at its root, path-style, reached at `endpoint` (the server's own by default). */
export function s3Location(
  gw: Versitygw,
  bucket: string,
  endpoint = gw.endpoint,
): S3Location & { kind: 's3' } {
  return { kind: 's3', bucket, prefix: '', region: gw.region, endpoint, forcePathStyle: true };
}

const credentials = (gw: Versitygw) => ({ accessKeyId: gw.accessKey, secretAccessKey: gw.secretKey });

/** The store of `bucket`, straight from the server (no proxy, no faults). */
export function directStore(gw: Versitygw, bucket: string): S3Store {
  return new S3Store(s3Location(gw, bucket), { credentials: credentials(gw) });
}

/** A plain S3 client straight to the server, with the store's deadlines; the caller destroys it. */
export function directClient(gw: Versitygw): S3Client {
  return new S3Client({
    region: gw.region,
    endpoint: gw.endpoint,
    forcePathStyle: true,
    credentials: credentials(gw),
    requestHandler: {
      connectionTimeout: 5_000,
      socketTimeout: 60_000,
      requestTimeout: 120_000,
      throwOnRequestTimeout: true,
    },
  });
}

/** The server's credentials as the environment of a process that reaches it. */
export function awsEnv(gw: Versitygw): Record<string, string> {
  return { AWS_ACCESS_KEY_ID: gw.accessKey, AWS_SECRET_ACCESS_KEY: gw.secretKey, AWS_REGION: gw.region };
}
