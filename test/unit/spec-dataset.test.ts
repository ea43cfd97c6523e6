// The `task: { dataset }` section of the spec: verl's column names by default, mapped names
// checked, dataset references that name a store key or an S3 object, every problem of the
// section reported at once with its field and value, and the section in the JSON Schema.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { campaignSpecJsonSchema, parseCampaignSpec } from '../../workflows/spec.js';
import { parseDatasetRef } from '../../workflows/spec-dataset.js';
import { hfSpecDoc, specProblems } from '../support/spec-docs.js';

function withDataset(dataset: unknown): unknown {
  return { ...hfSpecDoc(), task: { dataset } };
}

const problems = specProblems;

describe('spec: dataset tasks', () => {
  it("defaults to verl's column names", () => {
    const spec = parseCampaignSpec(hfSpecDoc());
    assert.ok('dataset' in spec.task);
    assert.deepEqual(spec.task.dataset, {
      train: 'datasets/arith/train.parquet',
      format: 'parquet',
      promptKey: 'prompt',
      dataSourceKey: 'data_source',
      groundTruthKey: 'reward_model.ground_truth',
      abilityKey: 'ability',
      extraInfoKey: 'extra_info',
    });
  });

  it('takes mapped column names, a validation set and an s3 URI', () => {
    const spec = parseCampaignSpec(
      withDataset({
        train: 's3://my-data/gsm8k/train.jsonl',
        validation: 'datasets/gsm8k/test.jsonl',
        format: 'jsonl',
        promptKey: 'question',
        groundTruthKey: 'answer',
        dataSourceKey: 'meta.source',
      }),
    );
    assert.ok('dataset' in spec.task);
    assert.equal(spec.task.dataset.promptKey, 'question');
    assert.equal(spec.task.dataset.dataSourceKey, 'meta.source');
    assert.equal(spec.task.dataset.validation, 'datasets/gsm8k/test.jsonl');
  });

  it('reports every problem of the section at once, each naming its field and value', () => {
    const found = problems(
      withDataset({ train: '/home/me/train.parquet', format: 'csv', promptKey: 'a..b', prompt_key: 'x' }),
    );
    assert.equal(found.length, 4, found.join('\n'));
    assert.match(
      found[0] as string,
      /^task\.dataset\.train: got "\/home\/me\/train\.parquet"; .*relative to the store/,
    );
    assert.match(found[1] as string, /^task\.dataset\.format: got "csv"; .*"parquet"\|"jsonl"/);
    assert.match(found[2] as string, /^task\.dataset\.promptKey: got "a\.\.b"; must be a column name/);
    assert.match(found[3] as string, /^task\.dataset: unknown field\(s\) "prompt_key"/);
  });

  it('requires train and format', () => {
    const found = problems(withDataset({}));
    assert.deepEqual(
      found.map((p) => p.split(';')[0]),
      ['task.dataset.train: got missing', 'task.dataset.format: got missing'],
    );
  });

  it('refuses malformed references with the reason', () => {
    const found = problems(
      withDataset({ train: 's3://B/x', validation: 'https://host/v.jsonl', format: 'jsonl' }),
    );
    assert.match(
      found[0] as string,
      /task\.dataset\.train: got "s3:\/\/B\/x"; "B" is not a valid S3 bucket name/,
    );
    assert.match(
      found[1] as string,
      /task\.dataset\.validation: got "https:\/\/host\/v\.jsonl"; only s3:\/\/ URIs/,
    );
  });

  it('parses references', () => {
    assert.deepEqual(parseDatasetRef('s3://bucket-1/a/b.parquet'), {
      kind: 's3',
      bucket: 'bucket-1',
      key: 'a/b.parquet',
    });
    assert.deepEqual(parseDatasetRef('datasets/a.jsonl'), { kind: 'store', key: 'datasets/a.jsonl' });
    assert.match(parseDatasetRef('s3://bucket-1') as string, /key is empty/);
    assert.match(parseDatasetRef('s3://bucket-1/') as string, /key is empty/);
    assert.match(parseDatasetRef('a/../b') as string, /"\.\."/);
    assert.match(parseDatasetRef('dir/') as string, /trailing/);
  });

  it('the JSON Schema describes the section', () => {
    const text = JSON.stringify(campaignSpecJsonSchema());
    for (const word of ['promptKey', 'groundTruthKey', 'reward_model.ground_truth', '"parquet"', '"jsonl"'])
      assert.ok(text.includes(word), word);
  });
});
