// Opens the object store a campaign spec names. Everything a caller needs is re-exported here.
import { isAbsolute, resolve } from 'node:path';
import type { StoreLocation } from '../types.js';
import { FsStore } from './fs.js';
import { S3Store, type S3StoreOptions } from './s3.js';
import type { ObjectStore } from './types.js';

export interface OpenStoreOptions {
  /** Folder a relative fs path is resolved against; default the current working directory. */
  baseDir?: string;
  /** Client settings for an s3 store (timeouts, retries, part size; explicit credentials in tests). */
  s3?: S3StoreOptions;
}

export function openStore(location: StoreLocation, opts: OpenStoreOptions = {}): ObjectStore {
  switch (location.kind) {
    case 'fs': {
      const base = opts.baseDir ?? process.cwd();
      return new FsStore(isAbsolute(location.path) ? location.path : resolve(base, location.path));
    }
    case 's3':
      return new S3Store(location, opts.s3);
  }
}

export { FsStore } from './fs.js';
export { S3Store, minPartSize, type S3Location, type S3StoreOptions } from './s3.js';
export {
  StoreAuthError,
  StoreError,
  StoreKeyError,
  StoreNotFoundError,
  StoreUnavailableError,
} from './errors.js';
export type { ListedObject, ObjectBody, ObjectInfo, ObjectStore, PutOptions } from './types.js';
