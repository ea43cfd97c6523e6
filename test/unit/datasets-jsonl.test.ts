// JSONL lines streamed whatever the chunking: lines, CRLF ends and multi-byte characters split
// across chunks, a final line without a newline, and a line past the limit dropped (its row
// still counted) without holding it.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { jsonlLines, parseJsonlLine } from '../../activities/datasets/jsonl.js';

async function linesOf(text: string, chunkBytes: number, maxLineBytes?: number) {
  const bytes = Buffer.from(text, 'utf8');
  async function* chunks() {
    for (let i = 0; i < bytes.length; i += chunkBytes) yield bytes.subarray(i, i + chunkBytes);
  }
  const out = [];
  for await (const line of jsonlLines(chunks(), maxLineBytes)) out.push(line);
  return out;
}

describe('datasets: JSONL lines', () => {
  const text = '{"a":"é€😀"}\r\n\n{"b":2}\n{"c":3}';
  for (const chunkBytes of [1, 2, 3, 7, 1024])
    it(`the same lines in chunks of ${chunkBytes} bytes`, async () => {
      assert.deepEqual(await linesOf(text, chunkBytes), [
        { row: 0, text: '{"a":"é€😀"}' },
        { row: 1, text: '' },
        { row: 2, text: '{"b":2}' },
        { row: 3, text: '{"c":3}' },
      ]);
    });

  it('no line after a final newline, none in an empty stream', async () => {
    assert.deepEqual(await linesOf('{"a":1}\n', 3), [{ row: 0, text: '{"a":1}' }]);
    assert.deepEqual(await linesOf('', 3), []);
  });

  it('a line past the limit is dropped, its row counted', async () => {
    const lines = await linesOf(`{"a":1}\n{"long":"${'x'.repeat(100)}"}\n{"b":2}\n`, 5, 32);
    assert.deepEqual(lines, [
      { row: 0, text: '{"a":1}' },
      { row: 1, text: null },
      { row: 2, text: '{"b":2}' },
    ]);
    assert.deepEqual(parseJsonlLine(lines[1] as never, 32), { problem: 'longer than 32 bytes' });
  });
});
