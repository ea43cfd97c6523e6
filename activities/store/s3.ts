// The s3 backend: objects in s3://<bucket>/<prefix>/<key> on AWS S3 or any S3-compatible
// server (custom endpoint, path-style addressing). Credentials come from the AWS SDK's
// standard chain (environment, shared config and credentials files, SSO, web identity for
// EKS pods, instance metadata) unless given explicitly; they are never logged and never leave
// this process. Large bodies go up as multipart uploads, aborted when anything fails.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import type { Readable } from 'node:stream';
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  UploadPartCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  ListMultipartUploadsCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  type CompletedPart,
  type S3ClientConfig,
} from '@aws-sdk/client-s3';
import { StoreError, StoreNotFoundError } from './errors.js';
import { checkKey, checkPrefix } from './keys.js';
import { writeFileAtomically } from './local-file.js';
import { mapS3Error } from './s3-errors.js';
import { fixedSizeParts, mappedStream } from './streams.js';
import type { ListedObject, ObjectBody, ObjectInfo, ObjectStore, PutOptions } from './types.js';

export interface S3Location {
  bucket: string;
  /** Key prefix inside the bucket ('' = the bucket root); leading and trailing '/' are ignored. */
  prefix: string;
  region: string;
  /** Custom endpoint URL for S3-compatible servers; AWS's own endpoints when absent. */
  endpoint?: string;
  /** Path-style URLs (endpoint/bucket/key), which most S3-compatible servers need. */
  forcePathStyle: boolean;
}

export interface S3StoreOptions {
  /** Explicit credentials (tests); the SDK's default provider chain when absent. */
  credentials?: S3ClientConfig['credentials'];
  /** Attempts per request, first try included, by the SDK's standard retry strategy; default 3. */
  maxAttempts?: number;
  /** Limit on establishing a connection; default 5000 ms. */
  connectTimeoutMs?: number;
  /** Limit on a connection being silent mid-request, body included; default 60000 ms. */
  idleTimeoutMs?: number;
  /**
   * Limit on waiting for the answer to a request (its status and headers), per attempt; default
   * 120000 ms. With the idle limit on the body and the attempts, every read has a deadline, even
   * from a server that accepts a request and then holds it without a byte.
   */
  answerTimeoutMs?: number;
  /** Bodies larger than this go up as multipart uploads of parts this size; default 16 MiB, at least 5 MiB. */
  partSize?: number;
  /** Parts uploaded at once (memory: this many parts); default 4. */
  uploadConcurrency?: number;
  /** Keys per ListObjectsV2 page; default 1000 (the S3 maximum). */
  listPageSize?: number;
  /**
   * A multipart upload of a key begun this long ago and neither completed nor aborted was left
   * by a writer that died (killed mid-upload, no abort): a new upload of the key aborts it, so
   * its invisible parts stop taking space. Default 15 minutes, as the fs backend's temporaries.
   */
  staleUploadMs?: number;
}

const MiB = 1024 * 1024;
/** S3's minimum size of every part but the last. */
export const minPartSize = 5 * MiB;
// DeleteObjects takes at most 1000 keys per request.
const maxDeleteBatch = 1000;

export class S3Store implements ObjectStore {
  private readonly client: S3Client;
  private readonly bucket: string;
  private readonly prefix: string;
  private readonly description: string;
  private readonly partSize: number;
  private readonly uploadConcurrency: number;
  private readonly listPageSize: number;
  private readonly staleUploadMs: number;

  constructor(location: S3Location, opts: S3StoreOptions = {}) {
    this.bucket = location.bucket;
    this.prefix = location.prefix.replace(/^\/+|\/+$/g, '');
    this.description = describeLocation(location, this.prefix);
    if (this.prefix) checkKey(this.description, this.prefix);
    this.partSize = opts.partSize ?? 16 * MiB;
    if (this.partSize < minPartSize)
      throw new RangeError(`partSize must be at least ${minPartSize} bytes (5 MiB)`);
    this.uploadConcurrency = Math.max(1, opts.uploadConcurrency ?? 4);
    this.listPageSize = Math.min(1000, Math.max(1, opts.listPageSize ?? 1000));
    this.staleUploadMs = Math.max(0, opts.staleUploadMs ?? 15 * 60_000);
    this.client = new S3Client({
      region: location.region,
      ...(location.endpoint ? { endpoint: location.endpoint } : {}),
      forcePathStyle: location.forcePathStyle,
      ...(opts.credentials ? { credentials: opts.credentials } : {}),
      maxAttempts: opts.maxAttempts ?? 3,
      requestHandler: {
        connectionTimeout: opts.connectTimeoutMs ?? 5_000,
        socketTimeout: opts.idleTimeoutMs ?? 60_000,
        requestTimeout: opts.answerTimeoutMs ?? 120_000,
        throwOnRequestTimeout: true,
      },
      // Integrity comes from Content-MD5 on every upload, which S3-compatible servers all
      // check; the SDK's newer default checksums (CRC on every request) are not universal.
      requestChecksumCalculation: 'WHEN_REQUIRED',
    });
  }

  describe(): string {
    return this.description;
  }

  async put(key: string, body: ObjectBody, opts: PutOptions = {}): Promise<void> {
    const fullKey = this.fullKey(key);
    if (typeof body === 'string' || Buffer.isBuffer(body)) {
      const bytes = typeof body === 'string' ? Buffer.from(body) : body;
      if (bytes.length <= this.partSize) return this.putSingle(key, fullKey, bytes, opts);
      return this.upload(key, fullKey, oneChunk(bytes), opts);
    }
    return this.upload(key, fullKey, body, opts);
  }

  async putFile(key: string, localPath: string, opts: PutOptions = {}): Promise<void> {
    const fullKey = this.fullKey(key);
    await this.upload(key, fullKey, createReadStream(localPath), opts);
  }

  async get(key: string): Promise<Buffer> {
    return Buffer.concat(await this.getStream(key).toArray());
  }

  getStream(key: string): Readable {
    const fullKey = this.fullKey(key);
    return mappedStream(
      async () => {
        const answer = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: fullKey }));
        if (!answer.Body)
          throw new StoreError(this.description, key, 'no body in the answer', { retryable: true });
        return answer.Body as Readable;
      },
      (err) => mapS3Error(this.description, key, err),
    );
  }

  async getFile(key: string, localPath: string): Promise<void> {
    await writeFileAtomically(localPath, this.getStream(key));
  }

  async head(key: string): Promise<ObjectInfo | null> {
    const fullKey = this.fullKey(key);
    try {
      const answer = await this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: fullKey }));
      const etag = answer.ETag?.replace(/"/g, '');
      return { bytes: answer.ContentLength ?? 0, ...(etag ? { etag } : {}) };
    } catch (err) {
      const mapped = mapS3Error(this.description, key, err);
      if (mapped instanceof StoreNotFoundError) return null;
      throw mapped;
    }
  }

  async *list(prefix: string): AsyncIterable<ListedObject> {
    checkPrefix(this.description, prefix);
    const skip = this.prefix ? this.prefix.length + 1 : 0;
    let token: string | undefined;
    do {
      const page = await this.send(prefix || undefined, () =>
        this.client.send(
          new ListObjectsV2Command({
            Bucket: this.bucket,
            Prefix: this.prefix ? `${this.prefix}/${prefix}` : prefix,
            MaxKeys: this.listPageSize,
            ...(token ? { ContinuationToken: token } : {}),
          }),
        ),
      );
      for (const object of page.Contents ?? []) {
        // "folder/" placeholder objects made by some tools are not objects of this store.
        if (!object.Key || object.Key.endsWith('/')) continue;
        yield { key: object.Key.slice(skip), bytes: object.Size ?? 0 };
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
  }

  async delete(key: string): Promise<void> {
    const fullKey = this.fullKey(key);
    await this.send(key, () =>
      this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: fullKey })),
    );
  }

  async deletePrefix(prefix: string): Promise<number> {
    checkPrefix(this.description, prefix);
    if (prefix === '')
      throw new StoreError(this.description, undefined, 'refusing to delete the whole store (empty prefix)', {
        retryable: false,
      });
    // Collect first: deleting while paging would shift the continuation tokens' ground.
    const keys: string[] = [];
    for await (const object of this.list(prefix)) keys.push(object.key);
    for (let start = 0; start < keys.length; start += maxDeleteBatch) {
      const batch = keys.slice(start, start + maxDeleteBatch);
      const answer = await this.send(prefix, () =>
        this.client.send(
          new DeleteObjectsCommand({
            Bucket: this.bucket,
            Delete: { Objects: batch.map((key) => ({ Key: this.fullKey(key) })), Quiet: true },
          }),
        ),
      );
      const failed = (answer.Errors ?? []).filter((e) => e.Code !== 'NoSuchKey');
      if (failed.length > 0) {
        const first = failed[0];
        throw mapS3Error(this.description, first?.Key?.slice(this.prefix ? this.prefix.length + 1 : 0), {
          name: first?.Code,
          message: `${first?.Message ?? 'delete failed'} (${failed.length} of ${batch.length} keys not deleted)`,
        });
      }
    }
    return keys.length;
  }

  async createIfAbsent(key: string, body: Buffer | string): Promise<boolean> {
    const fullKey = this.fullKey(key);
    const bytes = typeof body === 'string' ? Buffer.from(body) : body;
    // S3 answers 409 ConditionalRequestConflict while another conditional write of the same
    // key is in flight; the retry then sees the winner's object and gets 412.
    for (let attempt = 1; ; attempt++) {
      try {
        await this.client.send(
          new PutObjectCommand({
            Bucket: this.bucket,
            Key: fullKey,
            Body: bytes,
            ContentMD5: md5(bytes),
            IfNoneMatch: '*',
          }),
        );
        return true;
      } catch (err) {
        const name = (err as { name?: string }).name;
        if (name === 'PreconditionFailed') return false;
        if (name === 'ConditionalRequestConflict' && attempt < 5) {
          await new Promise((resolve) => setTimeout(resolve, 50 * attempt));
          continue;
        }
        throw mapS3Error(this.description, key, err);
      }
    }
  }

  private fullKey(key: string): string {
    checkKey(this.description, key);
    return this.prefix ? `${this.prefix}/${key}` : key;
  }

  // Runs one SDK call with the store's error mapping.
  private async send<T>(key: string | undefined, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (err) {
      throw mapS3Error(this.description, key, err);
    }
  }

  private putSingle(key: string, fullKey: string, bytes: Buffer, opts: PutOptions): Promise<void> {
    return this.send(key, () =>
      this.client.send(
        new PutObjectCommand({
          Bucket: this.bucket,
          Key: fullKey,
          Body: bytes,
          ContentMD5: md5(bytes),
          ...(opts.contentType ? { ContentType: opts.contentType } : {}),
        }),
      ),
    ).then(() => undefined);
  }

  // Uploads a body of unknown length: one PutObject when it fits in a part, else a multipart
  // upload with up to uploadConcurrency parts in flight. A failure (of the source or of S3)
  // aborts the upload, so no parts linger and the old object, if any, stays as it was.
  private async upload(
    key: string,
    fullKey: string,
    source: AsyncIterable<Buffer | string>,
    opts: PutOptions,
  ): Promise<void> {
    const parts = fixedSizeParts(source, this.partSize);
    try {
      await this.uploadParts(key, fullKey, parts, opts);
    } finally {
      // Closes the source (a file descriptor for putFile) when S3 failed before it was read out.
      await parts.return(undefined);
    }
  }

  private async uploadParts(
    key: string,
    fullKey: string,
    parts: AsyncGenerator<Buffer>,
    opts: PutOptions,
  ): Promise<void> {
    const first = await parts.next();
    const firstPart = first.done ? Buffer.alloc(0) : first.value;
    const second = first.done ? first : await parts.next();
    if (second.done) return this.putSingle(key, fullKey, firstPart, opts);

    await this.abortStaleUploads(fullKey);
    const created = await this.send(key, () =>
      this.client.send(
        new CreateMultipartUploadCommand({
          Bucket: this.bucket,
          Key: fullKey,
          ...(opts.contentType ? { ContentType: opts.contentType } : {}),
        }),
      ),
    );
    const uploadId = created.UploadId;
    if (!uploadId)
      throw new StoreError(this.description, key, 'no upload id in the answer', { retryable: true });
    const inFlight = new Set<Promise<void>>();
    try {
      const completed: CompletedPart[] = [];
      let failure: unknown;
      const uploadPart = (partNumber: number, body: Buffer): void => {
        const done: Promise<void> = this.send(key, () =>
          this.client.send(
            new UploadPartCommand({
              Bucket: this.bucket,
              Key: fullKey,
              UploadId: uploadId,
              PartNumber: partNumber,
              Body: body,
              ContentMD5: md5(body),
            }),
          ),
        ).then(
          (answer) => {
            completed[partNumber - 1] = { PartNumber: partNumber, ETag: answer.ETag };
            inFlight.delete(done);
          },
          (err: unknown) => {
            failure ??= err;
            inFlight.delete(done);
          },
        );
        inFlight.add(done);
      };
      let partNumber = 0;
      uploadPart(++partNumber, firstPart);
      uploadPart(++partNumber, second.value);
      for await (const body of parts) {
        while (inFlight.size >= this.uploadConcurrency && failure === undefined) await Promise.race(inFlight);
        if (failure !== undefined) break;
        uploadPart(++partNumber, body);
      }
      await Promise.all(inFlight);
      if (failure !== undefined) throw failure;
      await this.send(key, () =>
        this.client.send(
          new CompleteMultipartUploadCommand({
            Bucket: this.bucket,
            Key: fullKey,
            UploadId: uploadId,
            MultipartUpload: { Parts: completed },
          }),
        ),
      );
    } catch (err) {
      // Parts still uploading would otherwise land after the abort and be kept.
      await Promise.all(inFlight);
      await this.client
        .send(new AbortMultipartUploadCommand({ Bucket: this.bucket, Key: fullKey, UploadId: uploadId }))
        .catch(() => undefined);
      throw err;
    }
  }

  // Best effort: a failure here must not fail the write it precedes; the next upload tries again.
  private async abortStaleUploads(fullKey: string): Promise<void> {
    const before = Date.now() - this.staleUploadMs;
    try {
      const answer = await this.client.send(
        new ListMultipartUploadsCommand({ Bucket: this.bucket, Prefix: fullKey }),
      );
      for (const upload of answer.Uploads ?? [])
        if (upload.Key === fullKey && upload.UploadId && (upload.Initiated?.getTime() ?? 0) <= before)
          await this.client.send(
            new AbortMultipartUploadCommand({ Bucket: this.bucket, Key: fullKey, UploadId: upload.UploadId }),
          );
    } catch {
      // The stale upload stays for the next writer (or the bucket's lifecycle rule).
    }
  }
}

async function* oneChunk(bytes: Buffer): AsyncGenerator<Buffer> {
  yield bytes;
}

function md5(bytes: Buffer): string {
  return createHash('md5').update(bytes).digest('base64');
}

// "s3://bucket/prefix (region us-east-1, endpoint http://127.0.0.1:7070)", with any user
// info stripped from the endpoint URL.
function describeLocation(location: S3Location, prefix: string): string {
  const where = `s3://${location.bucket}/${prefix ? `${prefix}/` : ''}`;
  let endpoint = '';
  if (location.endpoint) {
    try {
      const url = new URL(location.endpoint);
      url.username = '';
      url.password = '';
      endpoint = `, endpoint ${url.origin}${url.pathname === '/' ? '' : url.pathname}`;
    } catch {
      endpoint = ', endpoint (not a valid URL)';
    }
  }
  return `${where} (region ${location.region}${endpoint})`;
}
