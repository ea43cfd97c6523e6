// Whole-file writes on a local filesystem: a temporary file in the target's own directory,
// fsync, then rename (or link, for create-if-absent) into place, then fsync the directory.
// A reader never sees a half-written file and a crash leaves the old file or the new one.
// Used by the fs backend for objects and by both backends' getFile.
import { randomBytes } from 'node:crypto';
import { link, mkdir, open, rename, rm, type FileHandle } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { Readable } from 'node:stream';
import { errorCode } from './errors.js';
import { reservedSegmentPrefix } from './keys.js';

/** Name prefix of the temporary files; listings skip them. */
export const partialFilePrefix = `${reservedSegmentPrefix}partial-`;

export function isPartialFile(name: string): boolean {
  return name.startsWith(partialFilePrefix);
}

/**
 * Writes `body` to `path` atomically, creating parent directories. mode 'replace' overwrites
 * an existing file; 'create' leaves an existing file untouched and returns false.
 */
export async function writeFileAtomically(
  path: string,
  body: Buffer | Readable,
  mode: 'replace' | 'create' = 'replace',
): Promise<boolean> {
  const dir = dirname(path);
  // The source may fail (a missing file) while the temporary file is being opened, before
  // anything reads it: an 'error' event with no listener would crash the process. The error
  // stays on the stream and is thrown by the read loop below.
  const ignore = (): void => undefined;
  if (!Buffer.isBuffer(body)) body.on('error', ignore);
  let opened: { handle: FileHandle; tmp: string };
  try {
    opened = await openTemporary(dir);
  } catch (err) {
    if (!Buffer.isBuffer(body)) body.destroy();
    throw err;
  }
  const { handle, tmp } = opened;
  try {
    try {
      if (Buffer.isBuffer(body)) {
        await handle.writeFile(body);
      } else {
        for await (const chunk of body as AsyncIterable<Buffer | string>)
          await handle.write(typeof chunk === 'string' ? Buffer.from(chunk) : chunk);
      }
      await handle.sync();
    } finally {
      await handle.close();
    }
    if (mode === 'create') {
      try {
        await link(tmp, path);
      } catch (err) {
        if (errorCode(err) === 'EEXIST') return false;
        throw err;
      }
    } else {
      await rename(tmp, path);
    }
    await syncDirectory(dir);
    return true;
  } finally {
    if (!Buffer.isBuffer(body)) body.off('error', ignore);
    // After a rename the temporary name is gone already; after a link or a failure it is not.
    await rm(tmp, { force: true });
  }
}

// A fresh temporary file in `dir`. A concurrent delete may prune the directory between the
// mkdir and the open (the fs store removes empty directories), so that race is retried.
async function openTemporary(dir: string): Promise<{ handle: FileHandle; tmp: string }> {
  for (let attempt = 1; ; attempt++) {
    await mkdir(dir, { recursive: true });
    const tmp = join(dir, `${partialFilePrefix}${randomBytes(8).toString('hex')}`);
    try {
      return { handle: await open(tmp, 'wx'), tmp };
    } catch (err) {
      if (errorCode(err) !== 'ENOENT' || attempt >= 5) throw err;
    }
  }
}

// Makes the rename itself durable. Some filesystems refuse fsync on a directory; the rename is
// still atomic there, only its durability across a power cut is the filesystem's business.
async function syncDirectory(dir: string): Promise<void> {
  let handle: FileHandle | undefined;
  try {
    handle = await open(dir, 'r');
    await handle.sync();
  } catch (err) {
    // ENOENT: a concurrent delete already removed the object and pruned its directory.
    if (!['EINVAL', 'EISDIR', 'EPERM', 'EACCES', 'ENOENT'].includes(errorCode(err) ?? '')) throw err;
  } finally {
    await handle?.close();
  }
}
