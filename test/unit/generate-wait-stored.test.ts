// moe_generate --wait-stored under runGenerateRanks, real ranks: no chunk starts before the
// chunk before it is answered "stored", so a worker lost mid-shard loses the chunk in flight
// and no more, however slow its uploads (skipped when the native tools are not built).
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { runGenerateRanks } from '../../activities/rollout-ranks.js';
import { nativeTools } from '../support/native-tools.js';

const { bin, skip, run, env } = nativeTools(['moe_train', 'moe_generate']);

describe('moe_generate --wait-stored (native ranks)', { skip }, () => {
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'moerl-wait-stored-'));
    await run(bin('moe_train'), ['init', '--out', join(dir, 'init'), '--seed', '5'], { env });
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  const chunks = 4;
  /** Generates 4 chunks on 2 ranks; each chunk's upload takes 300 ms. What the uploads saw. */
  async function generate(out: string, waitStored: boolean) {
    const ahead: number[] = []; // chunk files beyond chunk k when chunk k's upload ended
    const run = await runGenerateRanks(
      bin('moe_generate'),
      ['--checkpoint', join(dir, 'init'), '--task', 'add', '--out-dir', out].concat(
        ['--num-prompts', String(chunks), '--chunk-size', '1', '--samples', '2', '--max-new-tokens', '4'],
        waitStored ? ['--wait-stored'] : [],
      ),
      {
        worldSize: 2,
        what: 'moe_generate',
        env: { OPENBLAS_NUM_THREADS: '1' },
        onRecord: async (rec) => {
          if (rec.done !== true || typeof rec.chunk !== 'number') return;
          await sleep(300); // the upload
          const k = rec.chunk;
          ahead.push(
            readdirSync(out).filter((f) => /^chunk-\d+\.jsonl$/.test(f) && Number(f.slice(6, -6)) > k).length,
          );
          return 'stored';
        },
      },
    );
    assert.equal(run.code, 0, run.stderrTail);
    for (let k = 0; k < chunks; k++) assert.ok(existsSync(join(out, `chunk-${k}.jsonl`)));
    return ahead;
  }

  it('starts no chunk before the one before it is stored; without the flag the ranks run ahead', async () => {
    assert.deepEqual(await generate(join(dir, 'waiting'), true), [0, 0, 0, 0]);
    const ahead = await generate(join(dir, 'ahead'), false);
    assert.ok(Math.max(...ahead) > 0, `without --wait-stored, chunks written ahead of the uploads: ${ahead}`);
  });

  it('stops with an error naming the chunk when stdin closes before the answer', async () => {
    const generating = run(
      bin('moe_generate'),
      ['--checkpoint', join(dir, 'init'), '--task', 'add', '--out-dir', join(dir, 'closed')].concat(
        ['--num-prompts', '2', '--chunk-size', '1', '--samples', '1', '--max-new-tokens', '2'],
        ['--wait-stored'],
      ),
      { env },
    );
    generating.child.stdin?.end();
    await assert.rejects(generating, (err: { code?: number; stderr?: string }) => {
      assert.equal(err.code, 1);
      assert.match(err.stderr ?? '', /--wait-stored: stdin closed before chunk 0 was stored/);
      return true;
    });
    assert.ok(existsSync(join(dir, 'closed', 'chunk-0.jsonl')));
    assert.ok(!existsSync(join(dir, 'closed', 'chunk-1.jsonl')), 'chunk 1 was not started');
  });
});
