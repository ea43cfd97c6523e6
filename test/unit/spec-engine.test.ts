// The spec's engine section: the trainer and rollout engines and their defaults, errors naming the field.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseCampaignSpec } from '../../workflows/spec.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import { rolloutEngine, trainerEngine } from '../../workflows/spec-engine.js';
import { hfSpecDoc, specProblems, validSpecDoc } from '../support/spec-docs.js';

describe('spec: engine', () => {
  it('trains natively by default, and with the PyTorch trainer when asked, on a Hugging Face model', () => {
    assert.deepEqual(parseCampaignSpec(hfSpecDoc()).engine, { trainer: 'native', rollout: 'native' });
    const spec = parseCampaignSpec({ ...hfSpecDoc(), engine: { trainer: 'pytorch' } });
    assert.equal(trainerEngine(spec), 'pytorch');
    assert.equal(rolloutEngine(spec), 'native');
  });

  it('samples with an OpenAI-compatible server when asked, with either trainer', () => {
    for (const trainer of ['native', 'pytorch'] as const) {
      const spec = parseCampaignSpec({ ...hfSpecDoc(), engine: { trainer, rollout: 'openai' } });
      assert.deepEqual(spec.engine, { trainer, rollout: 'openai' });
      assert.equal(rolloutEngine(spec), 'openai');
    }
  });

  it('reads a spec written before the fields as native', () => {
    const { engine: _, ...old } = parseCampaignSpec(hfSpecDoc());
    assert.equal(trainerEngine(old as Partial<CampaignSpec>), 'native');
    assert.equal(rolloutEngine(old as Partial<CampaignSpec>), 'native');
    assert.equal(rolloutEngine({ engine: { trainer: 'pytorch' } } as Partial<CampaignSpec>), 'native');
  });

  it('refuses the PyTorch trainer and the openai rollout on moerl’s own model, unknown engines and unknown fields, naming them', () => {
    assert.deepEqual(specProblems({ ...validSpecDoc(), engine: { trainer: 'pytorch' } }), [
      'engine.trainer: got "pytorch"; pytorch trains a Hugging Face model (model.huggingFace); the native model trains with native',
    ]);
    const [unknown] = specProblems({ ...hfSpecDoc(), engine: { trainer: 'megatron' } });
    assert.match(unknown!, /^engine\.trainer: got "megatron"; .*"native".*"pytorch"/);
    assert.deepEqual(specProblems({ ...validSpecDoc(), engine: { rollout: 'openai' } }), [
      'engine.rollout: got "openai"; openai samples a Hugging Face model (model.huggingFace); the native model samples with native',
    ]);
    const [rollout] = specProblems({ ...hfSpecDoc(), engine: { rollout: 'vllm' } });
    assert.match(rollout!, /^engine\.rollout: got "vllm"; .*"native".*"openai"/);
    assert.deepEqual(specProblems({ ...hfSpecDoc(), engine: { server: 'http://x' } }), [
      'engine: unknown field(s) "server"',
    ]);
  });

  it("takes the trainer's interpreter from the operator, never from the spec: a pod's MOERL_ variables are refused", () => {
    const doc = {
      ...hfSpecDoc(),
      engine: { trainer: 'pytorch' },
      launcher: {
        kind: 'kubernetes',
        namespace: 'moerl',
        image: 'registry.example/moerl:0.1.0-pytorch',
        env: { MOERL_PYTORCH_PYTHON: '/usr/bin/python3' },
      },
      store: { kind: 's3', bucket: 'campaigns' },
    };
    assert.deepEqual(specProblems(doc), [
      'launcher.env.MOERL_PYTORCH_PYTHON: got "/usr/bin/python3"; the key starts with MOERL_: those are set by the launcher (rank contract)',
    ]);
  });
});
