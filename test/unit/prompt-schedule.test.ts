// Prompts per iteration as a schedule: `set promptsPerIteration` from the next rollout on, the
// global prompt ids and dataset positions that follow, and a fork's schedule.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseCampaignSpec, validateHyperparameterChange } from '../../workflows/spec.js';
import {
  applyHyperparameterChange,
  forkHyperparameters,
  forkPromptSchedule,
  initialState,
  iterationDataset,
  iterationPrompts,
  promptSchedule,
} from '../../workflows/state.js';
import { hfSpecDoc, validSpecDoc } from '../support/spec-docs.js';
import type { HyperparameterChange } from '../../workflows/types.js';

const queues = { control: 'c', rollout: 'r', train: 't' };

describe('prompt schedule', () => {
  test('iteration prompts follow one another across segments', () => {
    const schedule = [
      { fromIteration: 1, promptsPerIteration: 16 },
      { fromIteration: 4, promptsPerIteration: 8 },
      { fromIteration: 6, promptsPerIteration: 32 },
    ];
    const firsts = [1, 2, 3, 4, 5, 6, 7].map((i) => iterationPrompts(schedule, i));
    assert.deepEqual(firsts, [
      { first: 0, count: 16 },
      { first: 16, count: 16 },
      { first: 32, count: 16 },
      { first: 48, count: 8 },
      { first: 56, count: 8 },
      { first: 64, count: 32 },
      { first: 96, count: 32 },
    ]);
    // One segment: the formula every campaign used before the schedule.
    const one = [{ fromIteration: 1, promptsPerIteration: 16 }];
    for (const i of [1, 2, 17])
      assert.deepEqual(iterationPrompts(one, i), { first: (i - 1) * 16, count: 16 });
  });

  test('a set applies from the next iteration whose rollout has not started; hyperparameters are unaffected', () => {
    const spec = parseCampaignSpec({ ...validSpecDoc(), promptsPerIteration: 16 });
    const state = initialState({ campaignId: 'c', spec, taskQueues: queues });
    state.nextIteration = 3;
    const changes = validateHyperparameterChange({ promptsPerIteration: 4, lr: 1e-4 }, spec);
    const change = applyHyperparameterChange(state, spec, { changes }, changes, new Date(0));
    assert.equal(change.iteration, 3);
    assert.equal(state.hyperparameters.lr, 1e-4);
    assert.ok(!('promptsPerIteration' in state.hyperparameters), 'not a hyperparameter of the rollout');
    assert.deepEqual(iterationPrompts(promptSchedule(state, spec), 3), { first: 32, count: 4 });
    // A later set for the same iteration replaces it; one for a later iteration adds a segment.
    const again = validateHyperparameterChange({ promptsPerIteration: 5 }, spec);
    applyHyperparameterChange(state, spec, { changes: again }, again, new Date(0));
    state.nextIteration = 5;
    applyHyperparameterChange(
      state,
      spec,
      { changes: again },
      validateHyperparameterChange({ promptsPerIteration: 7 }, spec),
      new Date(0),
    );
    assert.deepEqual(promptSchedule(state, spec), [
      { fromIteration: 1, promptsPerIteration: 16 },
      { fromIteration: 3, promptsPerIteration: 5 },
      { fromIteration: 5, promptsPerIteration: 7 },
    ]);
    assert.deepEqual(iterationPrompts(promptSchedule(state, spec), 6), { first: 32 + 10 + 7, count: 7 });
    assert.throws(
      () => validateHyperparameterChange({ promptsPerIteration: 0 }, spec),
      /promptsPerIteration/,
    );
  });

  test('a state from before the schedule reads as the spec’s count throughout', () => {
    const spec = parseCampaignSpec({ ...validSpecDoc(), promptsPerIteration: 12 });
    const state = initialState({ campaignId: 'c', spec, taskQueues: queues });
    delete state.promptSchedule;
    assert.deepEqual(iterationPrompts(promptSchedule(state, spec), 4), { first: 36, count: 12 });
  });

  test('dataset positions continue from where the last iteration stopped, across epochs', () => {
    const spec = parseCampaignSpec(hfSpecDoc());
    const state = initialState({ campaignId: 'c', spec, taskQueues: queues });
    state.dataset = { sha256: 'a'.repeat(64), bytes: 1, rows: 10 };
    const schedule = [
      { fromIteration: 1, promptsPerIteration: 4 },
      { fromIteration: 3, promptsPerIteration: 7 },
    ];
    const position = (i: number) => {
      const d = iterationDataset(state, iterationPrompts(schedule, i));
      return 'dataset' in d ? d.dataset.position : undefined;
    };
    assert.deepEqual(position(3), { epoch: 0, offset: 8 });
    assert.deepEqual(position(4), { epoch: 1, offset: 5 }, '8 + 7 prompts: 15 = one epoch of 10 and 5');
  });

  test('a fork continues its parent’s schedule to the fork, then its own count if it asks for one', () => {
    const parent = [
      { fromIteration: 1, promptsPerIteration: 16 },
      { fromIteration: 4, promptsPerIteration: 8 },
      { fromIteration: 9, promptsPerIteration: 2 },
    ];
    const kept = forkPromptSchedule(parent, 5, undefined);
    assert.deepEqual(kept, parent.slice(0, 2), "the parent's later change is not the fork's");
    assert.deepEqual(
      iterationPrompts(kept, 6),
      iterationPrompts(parent, 6),
      "the parent's iteration 6 prompts",
    );
    const own = forkPromptSchedule(parent, 5, 32);
    assert.deepEqual(iterationPrompts(own, 6), { first: 16 * 3 + 8 * 2, count: 32 });
    assert.deepEqual(iterationPrompts(own, 7), { first: 16 * 3 + 8 * 2 + 32, count: 32 });
    // Forking at 3 keeps the parent's change from iteration 4: the fork's iteration 4 is the parent's.
    assert.deepEqual(forkPromptSchedule(parent, 3, undefined), parent.slice(0, 2));
  });

  test("a fork's hyperparameters: the parent's spec with the set changes up to the iteration after the fork", () => {
    const spec = parseCampaignSpec({ ...validSpecDoc(), promptsPerIteration: 16 });
    const change = (iteration: number, changes: HyperparameterChange['changes']): HyperparameterChange => ({
      iteration,
      changes,
      reason: '',
      at: new Date(0).toISOString(),
    });
    const changes = [change(3, { lr: 1e-4, promptsPerIteration: 4 }), change(6, { lr: 5e-5, clipEps: 0.3 })];
    assert.deepEqual(forkHyperparameters(spec, changes, 1), spec.hyperparameters, 'before any change');
    const at2 = forkHyperparameters(spec, changes, 2);
    assert.deepEqual(at2, { ...spec.hyperparameters, lr: 1e-4 }, "iteration 3's change is the fork's first");
    assert.ok(!('promptsPerIteration' in at2), 'the prompt count belongs to the schedule');
    assert.deepEqual(forkHyperparameters(spec, changes, 9), {
      ...spec.hyperparameters,
      lr: 5e-5,
      clipEps: 0.3,
    });
  });
});
