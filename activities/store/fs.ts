// The fs backend: a store in a local directory, the embedded default. Object `a/b/c` is the
// file <root>/a/b/c. Writes go through a temporary file in the same directory (fsync + rename,
// local-file.ts), so a reader never sees half an object; listings skip those temporary files.
// Deleting removes directories that become empty, as S3 has no directories to leave behind.
import { createReadStream } from 'node:fs';
import { readdir, readFile, rmdir, stat, unlink } from 'node:fs/promises';
import { join, resolve, sep } from 'node:path';
import type { Readable } from 'node:stream';
import { errorCode, errorText, StoreAuthError, StoreError, StoreNotFoundError } from './errors.js';
import { checkKey, checkPrefix } from './keys.js';
import { isPartialFile, writeFileAtomically } from './local-file.js';
import { mappedStream } from './streams.js';
import type { ListedObject, ObjectBody, ObjectInfo, ObjectStore } from './types.js';

// Errors that mean "there is no object at this key" when reading.
const missingCodes = ['ENOENT', 'ENOTDIR', 'EISDIR'];

export class FsStore implements ObjectStore {
  readonly root: string;

  private readonly staleAfterMs: number;

  /**
   * `staleAfterMs`: a temporary file untouched this long was left by a writer that died
   * (killed mid-put); deletePrefix removes such files under its prefix. Default 15 minutes.
   */
  constructor(root: string, opts: { staleAfterMs?: number } = {}) {
    this.root = resolve(root);
    this.staleAfterMs = opts.staleAfterMs ?? 15 * 60_000;
  }

  describe(): string {
    return `fs:${this.root}`;
  }

  async put(key: string, body: ObjectBody): Promise<void> {
    const path = this.path(key);
    const content = typeof body === 'string' ? Buffer.from(body) : body;
    try {
      await writeFileAtomically(path, content);
    } catch (err) {
      throw this.writeError(key, err);
    }
  }

  async putFile(key: string, localPath: string): Promise<void> {
    const path = this.path(key);
    try {
      await writeFileAtomically(path, createReadStream(localPath));
    } catch (err) {
      // A missing or unreadable source file is the caller's local problem, not the store's.
      if ((err as { path?: unknown }).path === localPath) throw err;
      throw this.writeError(key, err);
    }
  }

  async get(key: string): Promise<Buffer> {
    const path = this.path(key);
    try {
      return await readFile(path);
    } catch (err) {
      throw this.readError(key, err);
    }
  }

  getStream(key: string): Readable {
    const path = this.path(key);
    return mappedStream(
      () => createReadStream(path),
      (err) => this.readError(key, err),
    );
  }

  async getFile(key: string, localPath: string): Promise<void> {
    await writeFileAtomically(localPath, this.getStream(key));
  }

  async head(key: string): Promise<ObjectInfo | null> {
    const path = this.path(key);
    try {
      const info = await stat(path);
      return info.isFile() ? { bytes: info.size } : null;
    } catch (err) {
      if (missingCodes.includes(errorCode(err) ?? '')) return null;
      throw this.readError(key, err);
    }
  }

  async *list(prefix: string): AsyncIterable<ListedObject> {
    checkPrefix(this.describe(), prefix);
    // Walk from the deepest directory the prefix fully names, then filter by the rest.
    const slash = prefix.lastIndexOf('/');
    const base = slash < 0 ? '' : prefix.slice(0, slash);
    const found: ListedObject[] = [];
    try {
      await this.walk(base, prefix, found);
    } catch (err) {
      throw this.otherError(prefix || undefined, err);
    }
    // Byte order of the UTF-8 keys, as S3 lists them.
    found.sort((a, b) => Buffer.compare(Buffer.from(a.key), Buffer.from(b.key)));
    yield* found;
  }

  async delete(key: string): Promise<void> {
    const path = this.path(key);
    try {
      await unlink(path);
    } catch (err) {
      if (missingCodes.includes(errorCode(err) ?? '')) return; // no object here
      throw this.writeError(key, err);
    }
    await this.pruneEmptyDirectories(key);
  }

  async deletePrefix(prefix: string): Promise<number> {
    checkPrefix(this.describe(), prefix);
    if (prefix === '')
      throw new StoreError(this.describe(), undefined, 'refusing to delete the whole store (empty prefix)', {
        retryable: false,
      });
    let count = 0;
    for await (const object of this.list(prefix)) {
      await this.delete(object.key);
      count++;
    }
    await this.removeStaleDebris(prefix);
    return count;
  }

  async createIfAbsent(key: string, body: Buffer | string): Promise<boolean> {
    const path = this.path(key);
    try {
      return await writeFileAtomically(path, typeof body === 'string' ? Buffer.from(body) : body, 'create');
    } catch (err) {
      throw this.writeError(key, err);
    }
  }

  private path(key: string): string {
    return join(this.root, ...checkKey(this.describe(), key).split('/'));
  }

  // Removes temporary files of dead writers in directories wholly under `prefix`, then the
  // directories that leaves empty.
  private async removeStaleDebris(prefix: string): Promise<void> {
    const debris: string[] = [];
    const slash = prefix.lastIndexOf('/');
    await this.walk(slash < 0 ? '' : prefix.slice(0, slash), prefix, [], debris);
    const staleBefore = Date.now() - this.staleAfterMs;
    for (const name of debris) {
      const path = join(this.root, ...name.split('/'));
      const info = await stat(path).catch(() => undefined);
      if (!info || info.mtimeMs > staleBefore) continue;
      await unlink(path).catch(() => undefined);
      await this.pruneEmptyDirectories(name);
    }
  }

  // Collects the files under directory `dir` (a key path, '' = root) whose keys start with
  // `prefix`, and into `debris` the temporary files in directories wholly under the prefix.
  private async walk(dir: string, prefix: string, found: ListedObject[], debris?: string[]): Promise<void> {
    let entries;
    try {
      entries = await readdir(dir ? join(this.root, ...dir.split('/')) : this.root, { withFileTypes: true });
    } catch (err) {
      // No such directory (or it vanished under a concurrent delete): nothing listed from it.
      if (missingCodes.includes(errorCode(err) ?? '')) return;
      throw err;
    }
    for (const entry of entries) {
      const key = dir ? `${dir}/${entry.name}` : entry.name;
      if (isPartialFile(entry.name)) {
        if (debris && dir && `${dir}/`.startsWith(prefix)) debris.push(key);
        continue;
      }
      if (entry.isDirectory()) {
        // Descend only where keys below can still match the prefix.
        if (`${key}/`.startsWith(prefix) || prefix.startsWith(`${key}/`))
          await this.walk(key, prefix, found, debris);
      } else if (entry.isFile() && key.startsWith(prefix)) {
        const info = await stat(join(this.root, ...key.split('/'))).catch(() => undefined);
        if (info) found.push({ key, bytes: info.size });
      }
    }
  }

  // Removes the key's parent directories that are now empty, up to (not including) the root.
  private async pruneEmptyDirectories(key: string): Promise<void> {
    const segments = key.split('/').slice(0, -1);
    while (segments.length > 0) {
      try {
        await rmdir(join(this.root, ...segments));
      } catch {
        return; // not empty (or already gone): stop here
      }
      segments.pop();
    }
  }

  private readError(key: string, err: unknown): StoreError {
    if (err instanceof StoreError) return err;
    const code = errorCode(err);
    if (missingCodes.includes(code ?? '')) return new StoreNotFoundError(this.describe(), key, err);
    return this.otherError(key, err);
  }

  private writeError(key: string, err: unknown): StoreError {
    if (err instanceof StoreError) return err;
    const code = errorCode(err);
    if (code === 'EISDIR' || code === 'ENOTDIR' || code === 'EEXIST')
      return new StoreError(
        this.describe(),
        key,
        `conflicts with another key's directory or file (${code})`,
        {
          retryable: false,
          cause: err,
        },
      );
    return this.otherError(key, err);
  }

  private otherError(key: string | undefined, err: unknown): StoreError {
    const code = errorCode(err);
    if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS')
      return new StoreAuthError(this.describe(), key, `permission denied (${code})`, err);
    // Out of space, I/O errors and the like: worth another try later, maybe elsewhere.
    return new StoreError(this.describe(), key, errorText(err).replaceAll(this.root + sep, ''), {
      retryable: true,
      cause: err,
    });
  }
}
