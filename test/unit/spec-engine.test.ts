// The spec's engine section: the trainer engine and its default, errors naming the field.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseCampaignSpec } from '../../workflows/spec.js';
import type { CampaignSpec } from '../../workflows/spec.js';
import { trainerEngine } from '../../workflows/spec-engine.js';
import { hfSpecDoc, specProblems, validSpecDoc } from '../support/spec-docs.js';

describe('spec: engine', () => {
  it('trains natively by default, and with the PyTorch trainer when asked, on a Hugging Face model', () => {
    assert.deepEqual(parseCampaignSpec(hfSpecDoc()).engine, { trainer: 'native' });
    const spec = parseCampaignSpec({ ...hfSpecDoc(), engine: { trainer: 'pytorch' } });
    assert.equal(trainerEngine(spec), 'pytorch');
  });

  it('reads a spec written before the field as native', () => {
    const { engine: _, ...old } = parseCampaignSpec(hfSpecDoc());
    assert.equal(trainerEngine(old as Partial<CampaignSpec>), 'native');
  });

  it('refuses the PyTorch trainer on moerl’s own model, an unknown trainer and unknown fields, naming them', () => {
    assert.deepEqual(specProblems({ ...validSpecDoc(), engine: { trainer: 'pytorch' } }), [
      'engine.trainer: got "pytorch"; pytorch trains a Hugging Face model (model.huggingFace); the native model trains with native',
    ]);
    const [unknown] = specProblems({ ...hfSpecDoc(), engine: { trainer: 'megatron' } });
    assert.match(unknown!, /^engine\.trainer: got "megatron"; .*"native".*"pytorch"/);
    assert.deepEqual(specProblems({ ...hfSpecDoc(), engine: { rollout: 'openai' } }), [
      'engine: unknown field(s) "rollout"',
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
