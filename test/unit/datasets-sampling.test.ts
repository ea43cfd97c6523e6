// Dataset sampling: the per-epoch shuffle against golden values from an independent reference
// (a Python transcription of the algorithm in activities/datasets/sampling.ts), epochs rolling
// over mid-iteration, exact resumption at and inside epoch boundaries (verl #7401: a resume at
// an epoch boundary trained zero steps), a change of promptsPerIteration mid-epoch, and shards
// that together draw exactly the iteration's prompts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  SplitMix64,
  advancePosition,
  drawPrompts,
  epochPermutation,
  fnv1a32,
  shardPrompts,
  startPosition,
  type DatasetPosition,
  type DrawnPrompt,
} from '../../activities/datasets/sampling.js';
import { parseCampaignSpec } from '../../workflows/spec.js';
import { splitPrompts } from '../../workflows/state.js';
import { validSpecDoc } from '../support/spec-docs.js';

describe('dataset sampling: the shuffle', () => {
  it('splitmix64 from state 0 gives the reference sequence', () => {
    const g = new SplitMix64(0n);
    assert.deepEqual(
      [g.next(), g.next(), g.next()],
      [0xe220a8397b1dcdafn, 0x6e789e6aa1b965f4n, 0x06c45d188009454fn],
    );
  });

  it('fnv1a32 matches docs/tasks.md', () => {
    assert.equal(fnv1a32(''), 2166136261);
    assert.equal(fnv1a32('a'), 0xe40c292c);
  });

  it('epoch permutations equal the Python reference', () => {
    assert.deepEqual([...epochPermutation({ seed: 7, rows: 10 }, 0)], [5, 3, 4, 1, 0, 6, 9, 8, 7, 2]);
    assert.deepEqual([...epochPermutation({ seed: 7, rows: 10 }, 1)], [5, 2, 9, 3, 8, 4, 6, 7, 1, 0]);
    assert.deepEqual([...epochPermutation({ seed: 7, rows: 10 }, 3)], [6, 7, 4, 8, 1, 0, 3, 2, 9, 5]);
    assert.deepEqual(
      [...epochPermutation({ seed: 2 ** 31 - 1, rows: 12 }, 5)],
      [5, 4, 2, 3, 11, 6, 1, 7, 0, 9, 10, 8],
    );
  });

  it('every epoch is a permutation of all rows, different per epoch and per seed', () => {
    const rows = 1000;
    const a = epochPermutation({ seed: 1, rows }, 0);
    assert.deepEqual(
      [...a].sort((x, y) => x - y),
      [...Array(rows).keys()],
    );
    const b = [...epochPermutation({ seed: 1, rows }, 1)];
    const c = [...epochPermutation({ seed: 2, rows }, 0)];
    assert.notDeepEqual([...epochPermutation({ seed: 1, rows }, 0)], b);
    assert.notDeepEqual([...epochPermutation({ seed: 1, rows }, 0)], c);
  });

  it('a one-row dataset always draws row 0', () => {
    const { prompts, next } = drawPrompts({ seed: 3, rows: 1 }, startPosition, 3);
    assert.deepEqual(prompts, [
      { epoch: 0, row: 0 },
      { epoch: 1, row: 0 },
      { epoch: 2, row: 0 },
    ]);
    assert.deepEqual(next, { epoch: 3, offset: 0 });
  });
});

/** The prompts of `iterations` iterations of the given sizes, from the start, and each iteration's start. */
function campaign(
  rows: number,
  sizes: number[],
  seed = 11,
): { iterations: DrawnPrompt[][]; starts: DatasetPosition[] } {
  const iterations: DrawnPrompt[][] = [];
  const starts: DatasetPosition[] = [];
  let at = startPosition;
  for (const size of sizes) {
    starts.push(at);
    const { prompts, next } = drawPrompts({ seed, rows }, at, size);
    iterations.push(prompts);
    at = next;
  }
  return { iterations, starts };
}

describe('dataset sampling: positions', () => {
  it('an epoch rolls over mid-iteration: the rest of one epoch, then the start of the next', () => {
    const input = { seed: 5, rows: 10 };
    const { prompts, next } = drawPrompts(input, { epoch: 0, offset: 7 }, 6);
    const e0 = epochPermutation(input, 0);
    const e1 = epochPermutation(input, 1);
    assert.deepEqual(prompts, [
      { epoch: 0, row: e0[7] },
      { epoch: 0, row: e0[8] },
      { epoch: 0, row: e0[9] },
      { epoch: 1, row: e1[0] },
      { epoch: 1, row: e1[1] },
      { epoch: 1, row: e1[2] },
    ]);
    assert.deepEqual(next, { epoch: 1, offset: 3 });
  });

  it('an iteration larger than the dataset spans several epochs, each whole', () => {
    const { prompts, next } = drawPrompts({ seed: 5, rows: 4 }, { epoch: 2, offset: 1 }, 10);
    assert.deepEqual(
      prompts.map((p) => p.epoch),
      [2, 2, 2, 3, 3, 3, 3, 4, 4, 4],
    );
    assert.deepEqual(next, { epoch: 4, offset: 3 });
  });

  it('an iteration that ends exactly at an epoch end leaves the next epoch at offset 0 (verl #7401)', () => {
    const { next } = drawPrompts({ seed: 5, rows: 8 }, startPosition, 8);
    assert.deepEqual(next, { epoch: 1, offset: 0 });
    const resumed = drawPrompts({ seed: 5, rows: 8 }, next, 4);
    assert.equal(resumed.prompts.length, 4, 'a resume at the boundary trains prompts, never zero');
    assert.ok(resumed.prompts.every((p) => p.epoch === 1));
  });

  it('a position saved as (epoch, rows) counts on into the next epoch', () => {
    const input = { seed: 5, rows: 8 };
    assert.deepEqual(
      drawPrompts(input, { epoch: 0, offset: 8 }, 3),
      drawPrompts(input, { epoch: 1, offset: 0 }, 3),
    );
    assert.deepEqual(advancePosition({ epoch: 0, offset: 8 }, 0, 8), { epoch: 1, offset: 0 });
  });

  it('resuming from any saved position trains exactly the prompts of an uninterrupted run', () => {
    const rows = 10;
    const sizes = [4, 4, 4, 4, 4, 4, 4];
    const whole = campaign(rows, sizes);
    // Resume before each iteration (mid-epoch and at the boundary after iteration 5: 20 = 2·10).
    for (let i = 0; i < sizes.length; i++) {
      let at = whole.starts[i] as DatasetPosition;
      // What a workflow would carry through continue-as-new: a JSON copy.
      at = JSON.parse(JSON.stringify(at)) as DatasetPosition;
      for (let k = i; k < sizes.length; k++) {
        const { prompts, next } = drawPrompts({ seed: 11, rows }, at, sizes[k] as number);
        assert.deepEqual(prompts, whole.iterations[k], `resumed before iteration ${i}, iteration ${k}`);
        at = next;
      }
    }
    assert.deepEqual(whole.starts[5], { epoch: 2, offset: 0 });
  });

  it('a change of promptsPerIteration mid-epoch continues the same order from the same place', () => {
    const rows = 10;
    const stream = drawPrompts({ seed: 11, rows }, startPosition, 40).prompts;
    const changed = campaign(rows, [3, 3, 7, 7, 7, 2]);
    assert.deepEqual(changed.iterations.flat(), stream.slice(0, 29));
    assert.deepEqual(changed.starts[2], { epoch: 0, offset: 6 });
    assert.deepEqual(changed.starts[3], { epoch: 1, offset: 3 });
  });

  it('no prompt of an epoch is drawn twice and none is skipped', () => {
    const rows = 37;
    const drawn = campaign(rows, [5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9]).iterations.flat();
    for (const epoch of [0, 1]) {
      const seen = drawn.filter((p) => p.epoch === epoch).map((p) => p.row);
      assert.equal(new Set(seen).size, rows, `epoch ${epoch}`);
    }
  });

  it('shards draw their own ranges and together give exactly the iteration', () => {
    const input = { seed: 9, rows: 23 };
    const spec = parseCampaignSpec({ ...validSpecDoc(), promptsPerIteration: 17, rolloutShards: 4 });
    const start = { epoch: 3, offset: 15 };
    const whole = drawPrompts(input, start, spec.promptsPerIteration).prompts;
    const byShard = splitPrompts(spec.promptsPerIteration, spec.rolloutShards).map((range) =>
      shardPrompts(input, start, range),
    );
    assert.deepEqual(byShard.flat(), whole);
    assert.deepEqual(
      byShard.map((s) => s.length),
      [5, 4, 4, 4],
    );
  });

  it('rejects malformed positions and counts', () => {
    assert.throws(() => drawPrompts({ seed: 1, rows: 4 }, { epoch: -1, offset: 0 }, 1), /position/);
    assert.throws(() => drawPrompts({ seed: 1, rows: 4 }, { epoch: 0, offset: 0.5 }, 1), /position/);
    assert.throws(() => drawPrompts({ seed: 1, rows: 0 }, startPosition, 1), /rows/);
    assert.throws(() => advancePosition(startPosition, -1, 4), /count/);
  });
});
