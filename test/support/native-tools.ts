// The native tools for tests that run them directly: found where the activities find them
// (activities/native.ts), with a skip reason when they are not built.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { nativeBinDir } from '../../activities/native.js';
import type { NativeTool } from '../../activities/native.js';

export function nativeTools(needed: NativeTool[]) {
  const bin = (name: NativeTool) => join(nativeBinDir(), name);
  const missing = needed.filter((t) => !existsSync(bin(t)));
  return {
    bin,
    /** For describe(..., { skip }): false when every needed tool is built. */
    skip:
      missing.length > 0
        ? `native tools not built (ninja -C native/build): missing ${missing.join(', ')}`
        : (false as const),
    run: promisify(execFile),
    // One BLAS thread: small and reproducible, and polite to other work on the machine.
    env: { ...process.env, OPENBLAS_NUM_THREADS: '1' },
  };
}
