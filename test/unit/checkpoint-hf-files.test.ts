// A checkpoint of the PyTorch trainer: its Hugging Face directory's files beside the moerl files,
// named in the manifest's huggingFace.files, checked when the manifest is made and read.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { huggingFaceFiles, parseManifest, withHuggingFaceFiles } from '../../activities/checkpoints.js';
import type { CheckpointManifest } from '../../activities/types.js';

const sha = (c: string) => c.repeat(64);
const moerl: CheckpointManifest = {
  format: 'moerl-checkpoint',
  version: 1,
  world_size: 1,
  files: [
    { name: 'dense.safetensors', bytes: 10, sha256: sha('a') },
    { name: 'experts-rank0.safetensors', bytes: 20, sha256: sha('b') },
  ],
};
const hf = [
  { name: 'optimizer.moerl', bytes: 5, sha256: sha('c') },
  { name: 'config.json', bytes: 3, sha256: sha('d') },
  { name: 'model.safetensors', bytes: 30, sha256: sha('e') },
];

describe('checkpoint manifest: the Hugging Face directory beside the moerl files', () => {
  it('lists the directory once, sorted, and reads it back', () => {
    const m = withHuggingFaceFiles(moerl, hf, '/w/hf-out');
    assert.deepEqual(m.huggingFace, { files: ['config.json', 'model.safetensors', 'optimizer.moerl'] });
    const read = parseManifest(JSON.stringify(m), 'manifest.json');
    assert.deepEqual(
      huggingFaceFiles(read, 'manifest.json')?.map((f) => f.bytes),
      [3, 30, 5],
    );
    assert.equal(huggingFaceFiles(moerl, 'manifest.json'), null, "the native trainer's checkpoint has none");
  });

  it('refuses a directory without config.json, or with a file named as a moerl file', () => {
    assert.throws(
      () => withHuggingFaceFiles(moerl, hf.slice(2), '/w/hf-out'),
      /\/w\/hf-out has no config\.json/,
    );
    assert.throws(
      () =>
        withHuggingFaceFiles(
          moerl,
          [...hf, { name: 'dense.safetensors', bytes: 1, sha256: sha('f') }],
          '/w/hf-out',
        ),
      /\/w\/hf-out\/dense\.safetensors: a file of this name cannot join a moerl checkpoint/,
    );
  });

  it('refuses a manifest whose huggingFace.files names a file it does not list, or a moerl file', () => {
    for (const files of [['config.json', 'missing.safetensors'], ['dense.safetensors'], []])
      assert.throws(
        () => parseManifest(JSON.stringify({ ...moerl, huggingFace: { files } }), 'm.json'),
        /m\.json: huggingFace\.files/,
      );
  });
});
