// Campaign spec files: the examples validate, malformed specs fail with messages that name the
// file, the field, the bad value and what is allowed (all problems at once), `--set` overrides
// apply before validation, and the JSON Schema export describes the spec.
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { stringify } from 'yaml';
import { repoRoot } from '../../cli/temporal-tools.js';
import { UsageError } from '../../cli/errors.js';
import { applyOverrides, loadSpecFile, parseOverride, parseSpecText } from '../../cli/spec-file.js';
import {
  SpecError,
  campaignSpecJsonSchema,
  defaultHyperparameters,
  parseCampaignSpec,
  validateHyperparameterChange,
} from '../../workflows/spec.js';
import { isHfModel } from '../../workflows/spec-model.js';
import { validSpecDoc } from '../support/spec-docs.js';

const examplesDir = join(repoRoot(), 'examples');

const validDoc = validSpecDoc;

function problemsOf(text: string, file = 'bad.yaml'): string[] {
  try {
    parseSpecText(text, file);
  } catch (err) {
    assert.ok(err instanceof SpecError, `expected SpecError, got ${String(err)}`);
    assert.match(err.message, new RegExp(`^${file.replace('.', '\\.')} is invalid:`));
    return err.problems;
  }
  assert.fail('the spec was accepted');
}

/** Problems for the valid document changed by `edit`. */
function problemsAfter(edit: (doc: Record<string, unknown>) => void): string[] {
  const doc = validDoc();
  edit(doc);
  return problemsOf(stringify(doc));
}

function assertOneProblem(problems: string[], ...patterns: RegExp[]): void {
  assert.equal(problems.length, 1, `expected one problem, got:\n${problems.join('\n')}`);
  for (const pattern of patterns) assert.match(problems[0] as string, pattern);
}

describe('example specs', () => {
  const examples = readdirSync(examplesDir).filter((f) => f.endsWith('.yaml'));

  it('ships demo, eks and off-policy', () => {
    for (const name of ['demo.yaml', 'eks.yaml', 'off-policy.yaml']) assert.ok(examples.includes(name), name);
  });

  for (const file of examples) {
    it(`${file} validates`, () => {
      const spec = loadSpecFile(join(examplesDir, file));
      assert.match(spec.name, /^[a-z0-9-]+$/);
      if (!isHfModel(spec.model)) assert.equal(spec.model.experts % spec.epWorldSize, 0);
    });
  }

  it('demo is the small local campaign', () => {
    const spec = loadSpecFile(join(examplesDir, 'demo.yaml'));
    assert.deepEqual(spec.task, { builtin: 'reverse' });
    assert.deepEqual(spec.model, {
      layers: 2,
      hidden: 128,
      heads: 4,
      experts: 8,
      topK: 2,
      contextLength: 32,
    });
    assert.equal(spec.iterations, 20);
    assert.equal(spec.promptsPerIteration, 128);
    assert.equal(spec.groupSize, 8);
    assert.equal(spec.rolloutShards, 2);
    assert.equal(spec.chunkSize, 16);
    assert.equal(spec.epWorldSize, 2);
    assert.equal(spec.staleness, 0);
    assert.ok(spec.sftWarmStartSteps > 0);
    assert.deepEqual(spec.launcher, { kind: 'local' });
    assert.deepEqual(spec.store, { kind: 'fs', path: '.moerl/store' });
  });

  it('eks runs on kubernetes with s3 and one-step off-policy', () => {
    const spec = loadSpecFile(join(examplesDir, 'eks.yaml'));
    assert.equal(spec.launcher.kind, 'kubernetes');
    assert.equal(spec.store.kind, 's3');
    assert.equal(spec.staleness, 1);
    assert.ok(!isHfModel(spec.model) && spec.model.experts > 8);
  });

  it('off-policy has staleness 1', () => {
    assert.equal(loadSpecFile(join(examplesDir, 'off-policy.yaml')).staleness, 1);
  });
});

describe('spec defaults', () => {
  it('fills launcher, store, hyperparameters, retention and orchestration', () => {
    const spec = parseSpecText(stringify(validDoc()), 'ok.yaml');
    assert.deepEqual(spec.launcher, { kind: 'local' });
    assert.deepEqual(spec.store, { kind: 'fs', path: '.moerl/store' });
    assert.deepEqual(spec.hyperparameters, defaultHyperparameters);
    assert.equal(spec.staleness, 0);
    assert.equal(spec.retention.keepLast, 3);
    assert.equal(spec.orchestration.continueAsNewEvery, 50);
  });

  it('merges partial hyperparameters over the defaults', () => {
    const spec = parseSpecText(stringify({ ...validDoc(), hyperparameters: { lr: 0.01 } }), 'ok.yaml');
    assert.equal(spec.hyperparameters.lr, 0.01);
    assert.equal(spec.hyperparameters.clipEps, defaultHyperparameters.clipEps);
  });
});

describe('malformed specs', () => {
  it('1. a misspelled top-level field is rejected with its name and line', () => {
    const text = stringify(validDoc()).replace('iterations:', 'iteratons:');
    const problems = problemsOf(text);
    assert.ok(
      problems.some((p) => /"iteratons"/.test(p) && /unknown field/.test(p)),
      problems.join('\n'),
    );
    assert.ok(
      problems.some((p) => /iterations: got missing/.test(p)),
      problems.join('\n'),
    );
    const line = text.split('\n').findIndex((l) => l.startsWith('iteratons:')) + 1;
    assert.ok(
      problems.some((p) => p.startsWith(`bad.yaml:${line}:1: `) && /iteratons/.test(p)),
      problems.join('\n'),
    );
  });

  it('2. an unknown nested field names its section', () => {
    assertOneProblem(
      problemsAfter((d) => ((d.model as Record<string, unknown>).expert = 4)),
      /model: unknown field\(s\) "expert"/,
    );
  });

  it('3. a string where a number belongs names the field, the value and the type', () => {
    assertOneProblem(
      problemsAfter((d) => (d.iterations = 'ten')),
      /iterations: got "ten"/,
      /expected number/,
    );
  });

  it('4. a fractional count is rejected', () => {
    assertOneProblem(
      problemsAfter((d) => (d.promptsPerIteration = 16.5)),
      /promptsPerIteration: got 16\.5/,
      /int/,
    );
  });

  it('5. an out-of-range learning rate names the limit', () => {
    assertOneProblem(
      problemsAfter((d) => (d.hyperparameters = { lr: 5 })),
      /hyperparameters\.lr: got 5/,
      /<=\s*1|at most 1|too big/i,
    );
  });

  it('6. a negative learning rate is rejected', () => {
    assertOneProblem(
      problemsAfter((d) => (d.hyperparameters = { lr: -0.001 })),
      /hyperparameters\.lr: got -0\.001/,
      />\s*0|too small/i,
    );
  });

  it('6b. a TIS cap below 1 is rejected (it would scale every token down): 0 turns it off', () => {
    assertOneProblem(
      problemsAfter((d) => (d.hyperparameters = { tisClip: 0.5 })),
      /hyperparameters\.tisClip: got 0\.5/,
      /must be 0 \(off\) or at least 1/,
    );
    assert.deepEqual(validateHyperparameterChange({ tisClip: 2 }, parseCampaignSpec(validSpecDoc())), {
      tisClip: 2,
    });
  });

  it('7. hidden not divisible by heads', () => {
    assertOneProblem(
      problemsAfter((d) => ((d.model as Record<string, unknown>).hidden = 66)),
      /model\.hidden: got 66/,
      /divisible by heads \(4\)/,
    );
  });

  it('8. topK greater than experts', () => {
    assertOneProblem(
      problemsAfter((d) => ((d.model as Record<string, unknown>).topK = 9)),
      /model\.topK: got 9/,
      /at most experts \(8\)/,
    );
  });

  it('9. experts not divisible by epWorldSize', () => {
    assertOneProblem(
      problemsAfter((d) => (d.epWorldSize = 3)),
      /epWorldSize: got 3/,
      /experts \(8\) must be divisible by epWorldSize \(3\)/,
    );
  });

  it('10. a group size of 1 (GRPO needs two samples per prompt)', () => {
    assertOneProblem(
      problemsAfter((d) => (d.groupSize = 1)),
      /groupSize: got 1/,
      />=\s*2|too small/i,
    );
  });

  it('11. a name with capitals and spaces', () => {
    assertOneProblem(
      problemsAfter((d) => (d.name = 'My Campaign')),
      /name: got "My Campaign"/,
      /lowercase letters, digits and dashes/,
    );
  });

  it('12. a kubernetes image on the latest tag', () => {
    assertOneProblem(
      problemsAfter((d) => {
        d.launcher = { kind: 'kubernetes', namespace: 'moerl', image: 'moerl/moerl:latest' };
        d.store = { kind: 's3', bucket: 'moerl-campaigns' };
      }),
      /launcher\.image: got "moerl\/moerl:latest"/,
      /pinned tag/,
    );
  });

  it('13. an invalid S3 bucket name', () => {
    assertOneProblem(
      problemsAfter((d) => (d.store = { kind: 's3', bucket: 'My_Bucket' })),
      /store\.bucket: got "My_Bucket"/,
      /valid S3 bucket name/,
    );
  });

  it('14. an unknown built-in task lists the allowed ones', () => {
    assertOneProblem(
      problemsAfter((d) => (d.task = { builtin: 'chess' })),
      /task\.builtin: got "chess"/,
      /"add"\|"sort"\|"reverse"/,
    );
  });

  it('15. staleness past 8 or not a whole number', () => {
    for (const [staleness, problem] of [
      [9, /staleness: got 9; .*<=8/],
      [1.5, /staleness: got 1\.5; .*int/],
    ] as const)
      assertOneProblem(
        problemsAfter((d) => {
          d.staleness = staleness;
          d.retention = { keepLast: 10 };
        }),
        problem,
      );
  });

  it('15b. a staleness change is checked as the spec is: range, keepLast and the pending-activity limit', () => {
    const spec = parseCampaignSpec({
      ...validDoc(),
      retention: { keepLast: 5 },
      promptsPerIteration: 400,
      rolloutShards: 300,
    });
    assert.throws(() => validateHyperparameterChange({ staleness: 9 }, spec), /staleness: got 9; .*<=8/);
    assert.throws(
      () => validateHyperparameterChange({ staleness: 5 }, spec),
      /staleness 5: the spec's retention\.keepLast: keepLast \(5\) must be at least 6/,
    );
    assert.throws(
      () =>
        validateHyperparameterChange(
          { staleness: 6 },
          { ...spec, retention: { keepLast: 7, keepBest: true } },
        ),
      /staleness 6: the spec's rolloutShards: .* use at most 285 shards/,
    );
    assert.deepEqual(validateHyperparameterChange({ staleness: 4, lr: 1e-4 }, spec), {
      staleness: 4,
      lr: 1e-4,
    });
  });

  it('16. an unknown launcher kind lists the allowed kinds', () => {
    assertOneProblem(
      problemsAfter((d) => (d.launcher = { kind: 'slurm' })),
      /launcher\.kind: got "slurm"/,
      /local.*kubernetes/,
    );
  });

  it('17. more rollout shards than prompts', () => {
    assertOneProblem(
      problemsAfter((d) => (d.rolloutShards = 32)),
      /rolloutShards: got 32/,
      /at most promptsPerIteration \(16\)/,
    );
  });

  it('18. a missing required field', () => {
    assertOneProblem(
      problemsAfter((d) => delete d.seed),
      /seed: got missing/,
    );
  });

  it('19. a YAML syntax error gives file:line:col', () => {
    const text = ['name: unit', 'task:', '  builtin: add', 'model: {layers: 2, hidden: 64', 'seed: 1'].join(
      '\n',
    );
    const problems = problemsOf(text, 'broken.yaml');
    assert.ok(problems.length >= 1);
    assert.match(problems[0] as string, /^broken\.yaml:\d+:\d+: YAML syntax error: /);
  });

  it('20. a duplicated key is a syntax error with its line', () => {
    const text = stringify(validDoc()) + 'seed: 2\n';
    const line = text.trimEnd().split('\n').length;
    const problems = problemsOf(text);
    assert.match(
      problems[0] as string,
      new RegExp(`^bad\\.yaml:${line}:\\d+: YAML syntax error: .*unique`, 'i'),
    );
  });

  it('21. several problems are reported at once, each with its line', () => {
    const problems = problemsAfter((d) => {
      d.name = 'Bad Name';
      d.groupSize = 1;
      (d.model as Record<string, unknown>).topK = 99;
      d.hyperparameters = { temperature: 0, lr: 'fast' };
    });
    for (const field of [
      'name',
      'groupSize',
      'model.topK',
      'hyperparameters.temperature',
      'hyperparameters.lr',
    ]) {
      assert.ok(
        problems.some((p) => new RegExp(`^bad\\.yaml:\\d+:\\d+: ${field.replace('.', '\\.')}: got `).test(p)),
        `${field} in:\n${problems.join('\n')}`,
      );
    }
  });

  it('22. a document that is not a mapping', () => {
    const problems = problemsOf('- just\n- a list\n');
    assertOneProblem(problems, /^bad\.yaml:1:1: the spec must be a mapping .*got a list/);
    assertOneProblem(problemsOf(''), /got an empty document/);
  });
});

describe('--set overrides', () => {
  it('parses numbers, booleans, JSON and strings', () => {
    assert.deepEqual(parseOverride('hyperparameters.lr=1e-4'), {
      path: ['hyperparameters', 'lr'],
      value: 1e-4,
      text: 'hyperparameters.lr=1e-4',
    });
    assert.equal(parseOverride('retention.keepBest=false').value, false);
    assert.equal(parseOverride('name=other').value, 'other');
    assert.deepEqual(parseOverride('launcher.nodeSelector={"a":"b"}').value, { a: 'b' });
  });

  it('rejects malformed overrides as usage errors', () => {
    assert.throws(() => parseOverride('lr'), UsageError);
    assert.throws(() => parseOverride('=3'), UsageError);
    assert.throws(() => parseOverride('a..b=3'), UsageError);
    assert.throws(() => parseOverride('a={bad'), UsageError);
    assert.throws(
      () => applyOverrides(validDoc(), [parseOverride('iterations.x=1')]),
      /iterations is a value/,
    );
  });

  it('applies before validation, creating sections, without touching the input', () => {
    const doc = validDoc();
    const out = applyOverrides(doc, [
      parseOverride('iterations=7'),
      parseOverride('hyperparameters.lr=0.01'),
    ]);
    assert.deepEqual((out as Record<string, unknown>).hyperparameters, { lr: 0.01 });
    assert.equal((out as Record<string, unknown>).iterations, 7);
    assert.equal(doc.iterations, 5);
    const spec = parseSpecText(stringify(doc), 'ok.yaml', [parseOverride('hyperparameters.lr=0.01')]);
    assert.equal(spec.hyperparameters.lr, 0.01);
  });

  it('an override that breaks the spec is named in the problem', () => {
    assert.throws(
      () => parseSpecText(stringify(validDoc()), 'ok.yaml', [parseOverride('hyperparameters.lr=7')]),
      (err: unknown) =>
        err instanceof SpecError && err.problems.some((p) => p.startsWith('--set hyperparameters.lr=7: ')),
    );
    assert.throws(
      () => parseSpecText(stringify(validDoc()), 'ok.yaml', [parseOverride('hyperparameter.lr=0.1')]),
      (err: unknown) =>
        err instanceof SpecError && /--set hyperparameter\.lr=0\.1: unknown field/.test(err.message),
    );
  });

  it('a missing file is a usage error naming it', () => {
    assert.throws(() => loadSpecFile('no-such-spec.yaml'), /spec file no-such-spec\.yaml does not exist/);
  });
});

describe('JSON Schema export', () => {
  it('describes every top-level field and rejects unknown ones', () => {
    const schema = campaignSpecJsonSchema() as {
      type: string;
      properties: Record<string, unknown>;
      required: string[];
      additionalProperties: boolean;
    };
    assert.equal(schema.type, 'object');
    assert.equal(schema.additionalProperties, false);
    for (const field of [
      'name',
      'task',
      'model',
      'iterations',
      'hyperparameters',
      'staleness',
      'store',
      'launcher',
    ]) {
      assert.ok(field in schema.properties, field);
    }
    assert.ok(schema.required.includes('seed'));
    assert.ok(
      !schema.required.includes('staleness'),
      'fields with defaults are optional in the input schema',
    );
    assert.doesNotThrow(() => JSON.stringify(schema));
  });
});

describe('retention and staleness', () => {
  it('staleness k needs keepLast ≥ 1 + k: rejects 4 with keepLast 4, takes keepLast 5', () => {
    assert.throws(
      () => parseCampaignSpec({ ...validSpecDoc(), staleness: 4, retention: { keepLast: 4 } }),
      (err: unknown) =>
        err instanceof SpecError &&
        err.problems.some((p) => /^retention\.keepLast: .*must be at least 5 with staleness 4/.test(p)),
    );
    assert.equal(
      parseCampaignSpec({ ...validSpecDoc(), staleness: 4, retention: { keepLast: 5 } }).staleness,
      4,
    );
  });

  it('rejects keepLast 1 with staleness 1, naming the field and why', () => {
    assert.throws(
      () => parseCampaignSpec({ ...validSpecDoc(), staleness: 1, retention: { keepLast: 1 } }),
      (err: unknown) =>
        err instanceof SpecError &&
        err.problems.some((p) => /^retention\.keepLast: .*must be at least 2 with staleness 1/.test(p)),
    );
    assert.equal(
      parseCampaignSpec({ ...validSpecDoc(), staleness: 1, retention: { keepLast: 2 } }).retention.keepLast,
      2,
    );
    assert.equal(parseCampaignSpec({ ...validSpecDoc(), retention: { keepLast: 1 } }).retention.keepLast, 1);
  });
});
