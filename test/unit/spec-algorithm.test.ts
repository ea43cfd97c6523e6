// The algorithm section: each recipe's trainer flags and defaults, the hyperparameters that
// override them (clipHigh, lossNormTokens, also through `moerl set`), Dr.GRPO's constant from
// the campaign's longest completion, and bad names refused with the allowed ones.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseCampaignSpec, SpecError, validateHyperparameterChange } from '../../workflows/spec.js';
import { algorithmFlags, overlongShaping } from '../../workflows/spec-algorithm.js';
import { validSpecDoc } from '../support/spec-docs.js';

const spec = (extra: Record<string, unknown>) => parseCampaignSpec({ ...validSpecDoc(), ...extra });
const flags = (extra: Record<string, unknown>) => {
  const s = spec(extra);
  const f = algorithmFlags(s, s.hyperparameters);
  return Object.fromEntries(f.flatMap((x, i) => (x.startsWith('--') ? [[x.slice(2), f[i + 1]]] : [])));
};

describe('algorithm (spec)', () => {
  it('the KL goes in the loss by default, or on the rewards (only while klCoef > 0)', () => {
    const list = (extra: Record<string, unknown>) => {
      const s = spec(extra);
      return algorithmFlags(s, s.hyperparameters);
    };
    assert.ok(!list({ hyperparameters: { klCoef: 0.05 } }).includes('--kl-in-reward'));
    assert.ok(
      list({ algorithm: { klPenalty: 'reward' }, hyperparameters: { klCoef: 0.05 } }).includes(
        '--kl-in-reward',
      ),
    );
    assert.ok(
      !list({ algorithm: { klPenalty: 'reward' }, hyperparameters: { klCoef: 0 } }).includes(
        '--kl-in-reward',
      ),
    );
    assert.throws(() => spec({ algorithm: { klPenalty: 'advantage' } }), /klPenalty/);
  });

  it("DAPO's overlong handling: the penalty's window per iteration, filtering as a trainer flag", () => {
    const s = spec({
      algorithm: { loss: 'dapo', overlong: { bufferTokens: 8, filter: true } },
      hyperparameters: { maxNewTokens: 24 },
    });
    assert.deepEqual(overlongShaping(s, s.hyperparameters), { maxTokens: 24, bufferTokens: 8, penalty: 1 });
    // maxNewTokens is a hyperparameter: the window follows a `moerl set`
    assert.equal(overlongShaping(s, { ...s.hyperparameters, maxNewTokens: 40 })?.maxTokens, 40);
    assert.ok(algorithmFlags(s, s.hyperparameters).includes('--mask-truncated'));
    const penaltyOnly = spec({ algorithm: { loss: 'dapo', overlong: { bufferTokens: 4, penalty: 0.5 } } });
    assert.ok(!algorithmFlags(penaltyOnly, penaltyOnly.hyperparameters).includes('--mask-truncated'));
    assert.equal(overlongShaping(penaltyOnly, penaltyOnly.hyperparameters)?.penalty, 0.5);
    assert.equal(overlongShaping(spec({}), spec({}).hyperparameters), undefined);
    assert.throws(
      () => spec({ algorithm: { loss: 'dapo', overlong: {} } }),
      (e: unknown) => e instanceof SpecError && /algorithm\.overlong.*bufferTokens.*filter/s.test(e.message),
    );
  });

  it("a spec without the section, or one of a campaign started before it, trains today's GRPO", () => {
    const want = {
      'policy-loss': 'ppo-clip',
      advantage: 'group-norm',
      aggregation: 'token-mean',
      'kl-estimator': 'k3',
      'clip-eps': '0.2',
      'clip-high': '0.2',
    };
    assert.deepEqual(flags({}), want);
    assert.deepEqual(flags({ algorithm: { loss: 'grpo' } }), want);
  });

  it("each recipe's defaults: Dr.GRPO's unbiased mean and constant norm, DAPO's clip-higher, GSPO, CISPO", () => {
    const drGrpo = flags({ algorithm: { loss: 'dr_grpo' }, hyperparameters: { maxNewTokens: 24 } });
    assert.equal(drGrpo.advantage, 'group-mean');
    assert.equal(drGrpo.aggregation, 'seq-mean-token-sum-norm');
    assert.equal(drGrpo['norm-tokens'], '24');
    assert.equal(flags({ algorithm: { loss: 'dapo' } })['clip-high'], '0.28');
    const gspo = flags({ algorithm: { loss: 'gspo' }, hyperparameters: { clipEps: 3e-4, clipHigh: 4e-4 } });
    assert.deepEqual([gspo['policy-loss'], gspo.aggregation], ['gspo', 'seq-mean-token-mean']);
    assert.deepEqual([gspo['clip-eps'], gspo['clip-high']], ['0.0003', '0.0004']);
    assert.equal(flags({ algorithm: { loss: 'cispo' } })['policy-loss'], 'cispo');
  });

  it('the section and the hyperparameters override the recipe', () => {
    const f = flags({
      algorithm: {
        loss: 'dapo',
        advantage: 'rloo',
        aggregation: 'seq-mean-token-sum-norm',
        klEstimator: 'k2',
      },
      hyperparameters: { clipHigh: 0.35, lossNormTokens: 100 },
    });
    assert.deepEqual(
      [f.advantage, f.aggregation, f['kl-estimator'], f['clip-high'], f['norm-tokens']],
      ['rloo', 'seq-mean-token-sum-norm', 'k2', '0.35', '100'],
    );
    assert.deepEqual(validateHyperparameterChange({ clipHigh: 0.3, lossNormTokens: 64 }, spec({})), {
      clipHigh: 0.3,
      lossNormTokens: 64,
    });
  });

  it("an agent's longest completion is its turns' tokens, bounded by maxEpisodeTokens", () => {
    const s = spec({ algorithm: { loss: 'dr_grpo' }, hyperparameters: { maxNewTokens: 16 } });
    const norm = (agent: Record<string, unknown>) =>
      algorithmFlags({ ...s, agent: { ...agent } as never }, s.hyperparameters).at(-1);
    assert.equal(norm({ maxTurns: 4 }), '64');
    assert.equal(norm({ maxTurns: 4, maxEpisodeTokens: 40 }), '40');
  });

  it('bad names fail naming the field and what is allowed', () => {
    assert.throws(
      () => spec({ algorithm: { loss: 'ppo2' } }),
      (err: unknown) =>
        err instanceof SpecError && /algorithm\.loss/.test(err.message) && /dr_grpo/.test(err.message),
    );
    assert.throws(() => spec({ algorithm: { loss: 'grpo', klEstimator: 'k4' } }), /algorithm\.klEstimator/);
    assert.throws(() => validateHyperparameterChange({ clipHigh: 0 }, spec({})), /clipHigh/);
  });
});
