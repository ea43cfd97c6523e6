// Store keys: `/`-separated relative paths such as campaigns/<id>/spec.json. Both backends
// check them the same way, so a key that works on a laptop's fs store works on S3 and back.
import { StoreKeyError } from './errors.js';

/** File names starting with this are a store's temporary files; no key segment may. */
export const reservedSegmentPrefix = '.moerl-';

// S3 allows 1024 bytes per key; the store's own prefix takes part of that.
const maxKeyBytes = 900;

/** Returns `key` when it is a valid store key, else throws StoreKeyError naming it. */
export function checkKey(store: string, key: string): string {
  const problem = keyProblem(key);
  if (problem) throw new StoreKeyError(store, key, problem);
  return key;
}

/**
 * Returns `prefix` when it is a valid list/delete prefix: '' (everything), or a key, or a key
 * followed by '/'. A prefix need not end at a segment boundary: 'rollouts/00001' matches
 * 'rollouts/000012/shard-0/chunk-0.jsonl'.
 */
export function checkPrefix(store: string, prefix: string): string {
  if (prefix === '') return prefix;
  const problem = keyProblem(prefix.endsWith('/') ? prefix.slice(0, -1) : prefix);
  if (problem) throw new StoreKeyError(store, prefix, problem);
  return prefix;
}

function keyProblem(key: string): string | undefined {
  if (typeof key !== 'string') return 'not a string';
  if (key === '') return 'empty';
  if (key.startsWith('/')) return 'must be relative (no leading /)';
  if (key.includes('//')) return 'empty path segment (//)';
  if (key.endsWith('/')) return 'must name an object (no trailing /)';
  if (Buffer.byteLength(key) > maxKeyBytes) return `longer than ${maxKeyBytes} bytes`;
  // eslint-disable-next-line no-control-regex -- control characters are exactly what is refused
  if (/[\u0000-\u001f\u007f\\]/.test(key)) return 'contains a control character or a backslash';
  for (const segment of key.split('/')) {
    if (segment === '.' || segment === '..') return `"${segment}" segment`;
    if (segment.startsWith(reservedSegmentPrefix))
      return `segments starting with "${reservedSegmentPrefix}" are reserved for temporary files`;
  }
  return undefined;
}
