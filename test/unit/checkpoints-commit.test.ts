// The checkpoint commit suite (test/support/checkpoint-commit-suite.ts) on the fs store.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import { FsStore } from '../../activities/store/index.js';
import { checkpointCommitSuite } from '../support/checkpoint-commit-suite.js';

const roots: string[] = [];
after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

checkpointCommitSuite(
  'fs',
  async () => {
    const root = mkdtempSync(join(tmpdir(), 'moerl-ckpt-store-'));
    roots.push(root);
    return new FsStore(root);
  },
  { atomicCreate: true },
);
