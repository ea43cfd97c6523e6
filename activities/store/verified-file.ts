// A file of a worker's cache is used only while it holds what was put there: its size is checked
// at every use, and its sha256 once per process, then again whenever its size, inode or ctime
// changed (a cache directory is shared with whatever else runs as the worker's user, and a file
// overwritten or cut short there must not be read as the checkpoint or dataset it was). The
// ctime, not the mtime: a writer can set the mtime back, never the ctime.
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { sha256OfStream } from './streams.js';

/** Path → the stat and hash it was last found with. */
const verified = new Map<string, string>();

const statKey = (info: { size: number; ctimeMs: number; ino: number }, sha256: string) =>
  `${info.size} ${info.ctimeMs} ${info.ino} ${sha256}`;

/** Whether the file at `path` is `bytes` long and hashes to `sha256`. */
export async function hasContent(path: string, bytes: number, sha256: string): Promise<boolean> {
  const before = await stat(path).catch(() => null);
  if (!before?.isFile() || before.size !== bytes) return false;
  if (verified.get(path) === statKey(before, sha256)) return true;
  verified.delete(path);
  const got = await sha256OfStream(createReadStream(path));
  if (got.sha256 !== sha256 || got.bytes !== bytes) return false;
  // Changed while it was hashed: not known to hold what was hashed.
  const after = await stat(path).catch(() => null);
  if (!after || statKey(after, sha256) !== statKey(before, sha256)) return false;
  verified.set(path, statKey(after, sha256));
  return true;
}

/**
 * Records that the file at `path` holds `sha256`, as its writer checked while writing it, so
 * that its first use in this process does not hash it again.
 */
export async function rememberContent(path: string, sha256: string): Promise<void> {
  const info = await stat(path).catch(() => null);
  if (info?.isFile()) verified.set(path, statKey(info, sha256));
  else verified.delete(path);
}
