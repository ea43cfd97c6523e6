// The `model: { huggingFace }` and `rewards` sections of the spec: a model folder named like a
// dataset (a store key prefix or s3://), the combinations a campaign cannot run refused with
// their field, an SFT warm start only with the dataset's completion field named, the rewards
// map's forms checked (a regex that does not compile, a Python function named twice), and every
// problem reported at once.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { rewardFunctionsSpec } from '../../activities/reward.js';
import { parseCampaignSpec } from '../../workflows/spec.js';
import { isHfModel, parseModelRef } from '../../workflows/spec-model.js';
import { datasetTaskDoc, hfSpecDoc, specProblems, validSpecDoc } from '../support/spec-docs.js';

const problems = specProblems;

describe('spec: Hugging Face models', () => {
  it('takes a folder of the store or of an S3 bucket, a trailing slash allowed', () => {
    const spec = parseCampaignSpec(hfSpecDoc());
    assert.ok(isHfModel(spec.model));
    assert.equal(spec.model.huggingFace, 'models/qwen3-moe');
    assert.deepEqual(parseModelRef('s3://weights/Qwen3-30B-A3B/'), {
      kind: 's3',
      bucket: 'weights',
      key: 'Qwen3-30B-A3B',
    });
    const withContext = parseCampaignSpec({
      ...hfSpecDoc(),
      model: { huggingFace: 'm/', contextLength: 2048 },
    });
    assert.deepEqual(withContext.model, { huggingFace: 'm/', contextLength: 2048 });
  });

  it('refuses a local path, a URL other than s3:// and shape fields beside it', () => {
    assert.match(
      problems({ ...hfSpecDoc(), model: { huggingFace: '/home/me/qwen' } })[0]!,
      /model\.huggingFace.*relative to the store/,
    );
    assert.match(problems({ ...hfSpecDoc(), model: { huggingFace: 'https://hub/x' } })[0]!, /only s3:\/\//);
    const mixed = problems({ ...hfSpecDoc(), model: { huggingFace: 'm', experts: 8 } });
    assert.ok(
      mixed.some((p) => /unknown field.*"experts"/.test(p)),
      mixed.join('\n'),
    );
  });

  it('trains on a dataset, with rewards', () => {
    const found = problems({
      ...validSpecDoc(),
      model: { huggingFace: 'models/q' },
      rewards: { default: { kind: 'math' } },
    });
    assert.ok(
      found.some((p) => p.startsWith('task:') && /trains on a dataset/.test(p)),
      found.join('\n'),
    );
    assert.ok(
      found.some((p) => p.startsWith('rewards:') && /for dataset tasks/.test(p)),
      found.join('\n'),
    );
  });

  it("warms up with SFT on the dataset's own completions: only when the spec names their field", () => {
    const sft = (dataset: Record<string, unknown>) => ({
      ...hfSpecDoc(),
      task: { dataset: { ...(datasetTaskDoc().dataset as object), ...dataset } },
      sftWarmStartSteps: 10,
    });
    const spec = parseCampaignSpec(sft({ responseKey: 'extra_info.answer' }));
    assert.equal(spec.sftWarmStartSteps, 10);
    assert.ok('dataset' in spec.task && spec.task.dataset.responseKey === 'extra_info.answer');
    assert.match(
      problems(sft({}))[0]!,
      /^task\.dataset\.responseKey: got missing; the SFT warm start learns .*extra_info\.answer/,
    );
    assert.match(
      problems(sft({ responseKey: 'extra info' }))[0]!,
      /^task\.dataset\.responseKey: .*dotted path/,
    );
    // Without a warm start the field is optional, and nothing needs it.
    const rl = parseCampaignSpec(hfSpecDoc());
    assert.ok('dataset' in rl.task && rl.task.dataset.responseKey === undefined);
  });

  it("a dataset needs a model's chat template and its rewards (or an http reward model)", () => {
    const native = problems({ ...hfSpecDoc(), model: validSpecDoc().model });
    assert.ok(
      native.some((p) => p.startsWith('task.dataset:') && /huggingFace/.test(p)),
      native.join('\n'),
    );
    const { rewards: _, ...noRewards } = hfSpecDoc();
    assert.match(problems(noRewards)[0]!, /^rewards: .*needs its rewards/);
    const http = parseCampaignSpec({
      ...noRewards,
      reward: { kind: 'http', url: 'https://rm.example/score' },
    });
    assert.equal(http.reward.kind, 'http');
  });
});

describe('spec: exports of every committed checkpoint', () => {
  it('takes a folder, every iteration by default, and refuses it for a native model', () => {
    const spec = parseCampaignSpec({ ...hfSpecDoc(), export: { to: 's3://serving/policies/' } });
    assert.deepEqual(spec.export, { to: 's3://serving/policies/', everyIterations: 1 });
    assert.match(
      problems({ ...hfSpecDoc(), export: { to: '../up', everyIterations: 0 } }).join('\n'),
      /export\.to[\s\S]*export\.everyIterations/,
    );
    const native = problems({ ...validSpecDoc(), export: { to: 'exports' } });
    assert.ok(
      native.some((p) => p.startsWith('export:') && /huggingFace/.test(p)),
      native.join('\n'),
    );
  });
});

describe('spec: rewards by data_source', () => {
  const withRewards = (rewards: unknown) => ({ ...hfSpecDoc(), rewards });

  it('takes every kind, with a format reward on any', () => {
    const spec = parseCampaignSpec(
      withRewards({
        default: { kind: 'math', format: { pattern: '^<think>', weight: 0.1 } },
        bySource: {
          mmlu: { kind: 'choice', letters: 'ABCD' },
          exact: { kind: 'match', normalise: false },
          re: { kind: 'regex', pattern: 'answer: (\\d+)', flags: 'i' },
          tools: { kind: 'json-schema', schema: { type: 'object' } },
          mine: { kind: 'python', module: 'my_rewards.scoring:compute_score', path: ['/opt/rewards'] },
          file: { kind: 'python', file: '/opt/rewards/score.py', function: 'score' },
          js: { kind: 'js', file: '/opt/rewards/score.mjs' },
        },
      }),
    );
    assert.equal(Object.keys(spec.rewards?.bySource ?? {}).length, 7);
    // What the reward library gets: a Python function by module or by file, nothing else.
    const lib = rewardFunctionsSpec(spec.rewards!);
    assert.deepEqual(lib.bySource?.mine, {
      kind: 'python',
      module: 'my_rewards.scoring:compute_score',
      path: ['/opt/rewards'],
    });
    assert.deepEqual(lib.bySource?.file, {
      kind: 'python',
      file: '/opt/rewards/score.py',
      function: 'score',
    });
    assert.deepEqual(lib.default, { kind: 'math', format: { pattern: '^<think>', weight: 0.1 } });
  });

  it('reports each malformed reward with its field', () => {
    const found = problems(
      withRewards({
        bySource: {
          a: { kind: 'regex', pattern: '(unclosed' },
          b: { kind: 'python', module: 'pkg:f', file: '/x.py' },
          c: { kind: 'python', file: '/x.py', path: ['/y'] },
          d: { kind: 'math', format: { pattern: '[', weight: 1 } },
          e: { kind: 'vibes' },
          f: { kind: 'choice', letters: 'A' },
        },
      }),
    );
    const field = (f: string) => found.some((p) => p.startsWith(`${f}:`));
    for (const f of [
      'rewards.bySource.a.pattern',
      'rewards.bySource.b',
      'rewards.bySource.c.path',
      'rewards.bySource.d.format.pattern',
      'rewards.bySource.e.kind',
      'rewards.bySource.f.letters',
    ])
      assert.ok(field(f), `${f} in:\n${found.join('\n')}`);
  });

  it('needs a default or a map', () => {
    assert.match(problems(withRewards({}))[0]!, /^rewards: .*needs a default, bySource entries, or both/);
  });
});
