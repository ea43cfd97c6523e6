// rolloutEpWorldSize: moe_generate ranks per rollout shard, one unless set, dividing the experts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { stringify } from 'yaml';
import { parseSpecText } from '../../cli/spec-file.js';
import { SpecError } from '../../workflows/spec.js';
import { validSpecDoc } from '../support/spec-docs.js';

function parse(edit: (doc: Record<string, unknown>) => void) {
  const doc = validSpecDoc();
  edit(doc);
  return parseSpecText(stringify(doc), 'rollout-ep.yaml');
}

describe('rolloutEpWorldSize', () => {
  it('is 1 when not set, so a spec without it rolls out on one rank as before', () => {
    assert.equal(parse(() => undefined).rolloutEpWorldSize, 1);
  });

  it('is kept when it divides the experts', () => {
    assert.equal(parse((d) => (d.rolloutEpWorldSize = 4)).rolloutEpWorldSize, 4);
  });

  it('must divide model.experts: the error names both', () => {
    assert.throws(
      () => parse((d) => (d.rolloutEpWorldSize = 3)),
      (err: unknown) => {
        assert.ok(err instanceof SpecError);
        assert.equal(err.problems.length, 1, err.problems.join('\n'));
        assert.match(err.problems[0]!, /rolloutEpWorldSize/);
        assert.match(err.problems[0]!, /model\.experts \(8\) must be divisible by rolloutEpWorldSize \(3\)/);
        return true;
      },
    );
  });
});
