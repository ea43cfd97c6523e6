// What a reader of the bucket sees, checked with a plain S3 client (ListObjectsV2 straight to
// the server, not through the fault proxy or the store): no checkpoint manifest without every
// file it names at its size, no LATEST naming a checkpoint without a manifest, and no object
// listed at a size other than its whole one where the whole size is known.
import {
  GetObjectCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  type S3Client,
} from '@aws-sdk/client-s3';

export interface BucketSnapshot {
  /** Key → bytes of every object listed. */
  objects: Map<string, number>;
  /** Multipart uploads begun and neither completed nor aborted (invisible to readers). */
  openUploads: number;
}

export async function snapshot(client: S3Client, bucket: string): Promise<BucketSnapshot> {
  const objects = new Map<string, number>();
  let token: string | undefined;
  do {
    const page = await client.send(
      new ListObjectsV2Command({ Bucket: bucket, ...(token ? { ContinuationToken: token } : {}) }),
    );
    for (const o of page.Contents ?? []) if (o.Key) objects.set(o.Key, o.Size ?? 0);
    token = page.IsTruncated ? page.NextContinuationToken : undefined;
  } while (token);
  const uploads = await client.send(new ListMultipartUploadsCommand({ Bucket: bucket }));
  return { objects, openUploads: uploads.Uploads?.length ?? 0 };
}

const text = async (client: S3Client, bucket: string, key: string): Promise<string | null> => {
  try {
    const answer = await client.send(new GetObjectCommand({ Bucket: bucket, Key: key }));
    return (await answer.Body?.transformToString('utf8')) ?? null;
  } catch (err) {
    if ((err as { name?: string }).name === 'NoSuchKey') return null;
    throw err;
  }
};

const exists = async (client: S3Client, bucket: string, key: string) =>
  client.send(new HeadObjectCommand({ Bucket: bucket, Key: key })).then(
    () => true,
    (err: { name?: string }) => {
      if (err.name === 'NotFound' || err.name === 'NoSuchKey') return false;
      throw err;
    },
  );

/**
 * The problems a reader would meet in `snap`. A manifest whose files are missing is looked at
 * again before it counts: retention removes a manifest before its files, so a listing taken
 * during a removal can show both half gone, and only a manifest still there is a problem.
 */
export async function violations(
  client: S3Client,
  bucket: string,
  snap: BucketSnapshot,
  wholeSizes: ReadonlyMap<string, number> = new Map(),
): Promise<string[]> {
  const out: string[] = [];
  for (const [key, bytes] of snap.objects) {
    const name = key.slice(key.lastIndexOf('/') + 1);
    const whole = wholeSizes.get(name);
    if (whole !== undefined && bytes !== whole) out.push(`${key} is listed at ${bytes} of ${whole} bytes`);
    // A checkpoint's manifest (a training job's report of its staged files, also named
    // manifest.json, lives under jobs/ and names files staged elsewhere).
    if (/\/checkpoints\/\d{6}\/manifest\.json$/.test(key)) {
      const body = await text(client, bucket, key);
      if (body === null) continue; // removed by retention since the listing
      const dir = key.slice(0, -name.length);
      for (const f of (JSON.parse(body) as { files: { name: string; bytes: number }[] }).files) {
        const listed = snap.objects.get(dir + f.name);
        if (listed === f.bytes) continue;
        if (!(await exists(client, bucket, key))) continue;
        out.push(
          `${key} is visible but ${dir}${f.name} is ${listed === undefined ? 'missing' : `${listed} bytes, not ${f.bytes}`}`,
        );
      }
    }
    if (name === 'LATEST') {
      const body = await text(client, bucket, key);
      if (body === null) continue;
      const ref = JSON.parse(body) as { key: string };
      const prefix = key.slice(0, key.indexOf('/campaigns/') + 1);
      if (!(await exists(client, bucket, `${prefix}${ref.key}/manifest.json`)))
        out.push(`${key} names ${ref.key}, which has no manifest`);
    }
  }
  return out;
}

/** Lists the bucket over and over until stopped; every listing is checked. */
export function watchBucket(client: S3Client, bucket: string, wholeSizes?: ReadonlyMap<string, number>) {
  let stopped = false;
  const found: string[] = [];
  let listings = 0;
  let maxOpenUploads = 0;
  const loop = (async () => {
    while (!stopped) {
      const snap = await snapshot(client, bucket);
      listings++;
      maxOpenUploads = Math.max(maxOpenUploads, snap.openUploads);
      for (const v of await violations(client, bucket, snap, wholeSizes))
        if (!found.includes(v)) found.push(v);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      return { listings, violations: found, maxOpenUploads };
    },
  };
}
