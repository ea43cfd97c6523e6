// Reward rises under every engine pairing (issue 21): the tiny Hugging Face campaign of
// hf-campaign.test.ts, with a reward the untrained model can learn within a few iterations (the
// share of the completion's characters that are spaces: GRPO moves probability to the tokens
// that start a word), trained three ways — native trainer and native rollouts, the PyTorch trainer and
// native rollouts, the PyTorch trainer and llama-server rollouts (the model converted to GGUF
// after each commit). Each run's mean training reward of its last two iterations must be well
// above its first iteration's: a trainer that ignored the batch, a sign error in the advantages, or
// log-probs of the wrong distribution fed to the importance ratio would each fail it.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { ActivityDeps } from '../../activities/deps.js';
import { workerActivityDeps } from '../../activities/deps.js';
import { findLlamaCpp, llamaCppMissingReason } from '../../activities/engines/llamacpp.js';
import { createActivities } from '../../activities/index.js';
import { openStore } from '../../activities/store/index.js';
import type { CampaignState } from '../../workflows/types.js';
import { artifacts, startCampaign, withWorkers } from '../support/campaign-harness.js';
import { hfCampaignSpec, writeHfCampaignFixture } from '../support/hf-campaign-fixtures.js';
import { nativeTools } from '../support/native-tools.js';
import { pytorchEngine } from '../support/pytorch-engine.js';
import { startTestEnvironment } from '../support/temporal.js';
import type { TestEnvironment } from '../support/temporal.js';

const engine = pytorchEngine();
const native = nativeTools(['moe_train', 'moe_generate', 'moe_hf']);
const llamacpp = await findLlamaCpp();
const llamacppSkip =
  'missing' in llamacpp ? `${llamaCppMissingReason} (bash scripts/llamacpp.sh): ${llamacpp.missing}` : false;

const iterations = 5;
/** The least rise of the mean reward, the last two iterations' over the first's, that counts. */
const RISE = 1.2;

// The share of the completion's characters that are spaces: about 0.1 for the untrained model
// (a third of the test tokenizer's tokens start a word, 2.7 characters a token on average).
const spacesReward = `
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return solution_str.count(" ") / max(len(solution_str), 1)
`;

describe('reward rises under each engine pairing', { skip: engine.skip || native.skip }, () => {
  let t: TestEnvironment;
  let dir: string;
  let store: ReturnType<typeof openStore>;
  const workers: ActivityDeps[] = [];

  before(async () => {
    t = await startTestEnvironment();
    dir = mkdtempSync(join(tmpdir(), 'moerl-engines-learning-'));
    store = openStore({ kind: 'fs', path: join(dir, 'store') });
    // The model in the shape llama.cpp runs, so one fixture serves all three pairings.
    await writeHfCampaignFixture(dir, engine.pyref, { publishedShape: true });
    writeFileSync(join(dir, 'spaces.py'), spacesReward);
  });
  after(async () => {
    for (const w of workers) await w.rolloutServer?.close();
    await t?.teardown();
    rmSync(dir, { recursive: true, force: true });
  });

  /** The mean training reward of each iteration, read from the rewards the campaign stored. */
  async function meanRewards(campaignId: string): Promise<number[]> {
    const sums = new Map<number, { sum: number; n: number }>();
    for (const [key, text] of await artifacts(store, campaignId)) {
      const m = /^rewards\/(\d+)\//.exec(key);
      if (!m) continue;
      const at = sums.get(Number(m[1])) ?? { sum: 0, n: 0 };
      for (const line of text.split('\n').filter(Boolean)) {
        at.sum += (JSON.parse(line) as { reward: number }).reward;
        at.n++;
      }
      sums.set(Number(m[1]), at);
    }
    return Array.from({ length: iterations }, (_, i) => {
      const at = sums.get(i + 1);
      assert.ok(at && at.n > 0, `iteration ${i + 1} of ${campaignId} stored rewards`);
      return at.sum / at.n;
    });
  }

  async function learns(name: string, trainer: 'native' | 'pytorch', rollout: 'native' | 'openai') {
    const spec = hfCampaignSpec(dir, name, {
      engine: { trainer, rollout },
      iterations,
      promptsPerIteration: 8,
      groupSize: 4,
      // One trainer rank and one rollout shard: what is learned does not depend on them, and
      // each process less is seconds less (a PyTorch rank imports torch).
      epWorldSize: 1,
      rolloutShards: 1,
      rewards: { default: { kind: 'python', file: join(dir, 'spaces.py') } },
      hyperparameters: { maxNewTokens: 12, minibatches: 1, epochs: 2, lr: 0.02, klCoef: 0 },
    });
    const deps = workerActivityDeps(new AbortController().signal, {
      ...process.env,
      ...(process.env.MOERL_PYREF_PYTHON ? { MOERL_PYTORCH_PYTHON: process.env.MOERL_PYREF_PYTHON } : {}),
      // The test tokenizer written as qwen2's for llama.cpp (llamacpp-engine.test.ts).
      MOERL_LLAMACPP_PRE_TOKENIZER: 'qwen2',
      MOERL_LLAMACPP_CONTEXT: '512',
      MOERL_CACHE_DIR: join(dir, `cache-${name}`),
    });
    workers.push(deps);
    const { id, state } = await withWorkers(
      t.nativeConnection,
      t.namespace,
      createActivities(deps),
      async (q) => {
        const handle = await startCampaign(t.client, spec, q);
        await handle.result();
        return { id: handle.workflowId, state: await handle.query<CampaignState>('status') };
      },
    );
    assert.equal(state.status, 'completed');
    const rewards = await meanRewards(id);
    const first = rewards[0]!;
    const last = (rewards[iterations - 2]! + rewards[iterations - 1]!) / 2;
    console.log(`# ${name}: mean reward by iteration ${rewards.map((r) => r.toFixed(3)).join(' ')}`);
    assert.ok(
      last >= RISE * first,
      `${name}: reward ${first.toFixed(3)} -> ${last.toFixed(3)}, not ×${RISE}`,
    );
  }

  test('native trainer, native rollouts', () => learns('learn-native', 'native', 'native'));
  test('PyTorch trainer, native rollouts', () => learns('learn-pytorch', 'pytorch', 'native'));
  test('PyTorch trainer, llama-server rollouts', { skip: llamacppSkip }, () =>
    learns('learn-pytorch-llamacpp', 'pytorch', 'openai'),
  );
});
