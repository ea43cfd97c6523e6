// The pure pieces of validation: the spec section, which checkpoints are validated, how the
// prompts split over shards, and mean reward / pass@k from scored samples.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { validationScores } from '../../activities/validation.js';
import { parseCampaignSpec } from '../../workflows/spec.js';
import {
  campaignValidation,
  validatesCheckpoint,
  validationPromptCount,
  validationSchema,
} from '../../workflows/spec-validation.js';
import { splitPrompts } from '../../workflows/state.js';
import { hfSpecDoc, specProblems } from '../support/spec-docs.js';

function withValidationFile(doc: Record<string, unknown>) {
  const dataset = (doc.task as { dataset: Record<string, unknown> }).dataset;
  return { ...doc, task: { dataset: { ...dataset, validation: 'datasets/arith/validation.parquet' } } };
}

describe('validation spec', () => {
  test('a validation section needs a validation file; its fields are checked', () => {
    assert.deepEqual(specProblems({ ...hfSpecDoc(), validation: { everyIterations: 5 } }), [
      'validation: got {"everyIterations":5}; schedules the validation of task.dataset.validation: name that file too',
    ]);
    const problems = specProblems({
      ...withValidationFile(hfSpecDoc()),
      validation: { everyIterations: 0, samples: 2, temperature: -1, shards: 1.5, every: 3 },
    });
    assert.equal(problems.length, 4, problems.join('\n'));
    for (const field of ['everyIterations', 'temperature', 'shards'])
      assert.ok(
        problems.some((p) => p.startsWith(`validation.${field}:`)),
        `${field} named in:\n${problems.join('\n')}`,
      );
    assert.ok(
      problems.some((p) => /every/.test(p) && /unrecognized|unknown/i.test(p)),
      problems.join('\n'),
    );
  });

  test('a validation file alone is validated with the defaults: greedy, one sample, every 10', () => {
    const spec = parseCampaignSpec(withValidationFile(hfSpecDoc()));
    assert.deepEqual(campaignValidation(spec), validationSchema.parse({}));
    assert.deepEqual(campaignValidation(spec), {
      everyIterations: 10,
      samples: 1,
      temperature: 0,
      topP: 1,
      shards: 1,
    });
    assert.equal(campaignValidation(parseCampaignSpec(hfSpecDoc())), undefined, 'no file, no validation');
  });

  test('the initial policy, every N-th checkpoint and the last are validated', () => {
    const v = validationSchema.parse({ everyIterations: 3 });
    const validated = Array.from({ length: 9 }, (_, i) => i).filter((i) => validatesCheckpoint(v, i, 8));
    assert.deepEqual(validated, [0, 3, 6, 8]);
  });

  test('prompts: the first maxPrompts rows, split over at most as many shards as prompts', () => {
    assert.equal(validationPromptCount(validationSchema.parse({ maxPrompts: 3 }), 10), 3);
    assert.equal(validationPromptCount(validationSchema.parse({ maxPrompts: 30 }), 10), 10);
    assert.deepEqual(
      splitPrompts(7, 3).map((r) => [r.shard, r.promptStart, r.promptCount]),
      [
        [0, 0, 3],
        [1, 3, 2],
        [2, 5, 2],
      ],
    );
    assert.deepEqual(
      splitPrompts(2, 8).map((r) => [r.promptStart, r.promptCount]),
      [
        [0, 1],
        [1, 1],
      ],
    );
  });
});

describe('validation scores', () => {
  // Three prompts with k = 2: prompt 0 passes once, prompt 1 never, prompt 2 twice.
  const scored = [
    { prompt_id: 0, sample_index: 0, reward: 1 },
    { prompt_id: 0, sample_index: 1, reward: 0 },
    { prompt_id: 1, sample_index: 0, reward: 0.25 },
    { prompt_id: 1, sample_index: 1, reward: 0 },
    { prompt_id: 2, sample_index: 0, reward: 0.75 },
    { prompt_id: 2, sample_index: 1, reward: 1 },
  ];

  test('pass@k counts prompts with any passing sample; the mean is over samples', () => {
    const all = validationScores(scored, () => true, 'continuous');
    assert.equal(all.prompts, 3);
    assert.equal(all.meanReward, 3 / 6);
    assert.equal(all.passAtK, 2 / 3);
    // Binary rewards pass only at 1: prompt 2's 0.75 does not, its 1 does.
    assert.equal(validationScores(scored, () => true, 'binary').passAtK, 2 / 3);
    const some = validationScores(scored, (id) => id !== 0, 'continuous');
    assert.deepEqual(some, { prompts: 2, meanReward: 2 / 4, passAtK: 1 / 2 });
    assert.deepEqual(
      validationScores([], () => true, 'continuous'),
      {
        prompts: 0,
        meanReward: 0,
        passAtK: 0,
      },
    );
  });
});
