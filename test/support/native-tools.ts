// The native tools for tests that run them directly: found where the activities find them
// (activities/native.ts), with a skip reason when they are not built.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { nativeBinDir } from '../../activities/native.js';
import type { NativeTool } from '../../activities/native.js';

/** How a skip for missing native tools starts; scripts/test.sh matches these exact words. */
export const nativeSkipReason = 'native tools not built';

export function nativeTools(needed: NativeTool[]) {
  const bin = (name: NativeTool) => join(nativeBinDir(), name);
  const missing = needed.filter((t) => !existsSync(bin(t)));
  return {
    bin,
    /**
     * For describe(..., { skip }): false when every needed tool is built. scripts/test.sh finds
     * this reason by its first words and, with CI=true, counts the skip as a failure.
     */
    skip:
      missing.length > 0
        ? `${nativeSkipReason} (bash scripts/setup.sh native): missing ${missing.join(', ')}`
        : (false as const),
    run: promisify(execFile),
    // One BLAS thread: small and reproducible, and polite to other work on the machine.
    env: { ...process.env, OPENBLAS_NUM_THREADS: '1' },
  };
}
