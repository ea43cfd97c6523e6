// moerl's Hugging Face models (native/io/hf.h, the families of native/model/config.h) against
// transformers on tiny models made offline by test/reference/hf_models.py: a Qwen3-MoE (GQA 4:1,
// head_dim != hidden / heads, norm_topk_prob false, a dense layer by mlp_only_layers, untied)
// and a Mixtral. Teacher-forced log-probs of chat-template prompts, greedy continuations, EP 2
// against EP 1, gradients of an SFT and a GRPO loss against torch autograd, import then export
// bitwise (fp32 and bf16, sharded), a GRPO update exported and loaded by transformers, and bad
// directories refused with the file and tensor named.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { freePort } from '../../cli/dev-server.js';
import { loadTokenizer } from '../../activities/models/tokenizer.js';
import { nativeTools } from '../support/native-tools.js';
import { pythonReference } from '../support/python-reference.js';

const tools = nativeTools(['moe_train', 'moe_generate', 'moe_hf']);
const pyref = pythonReference();
const work = mkdtempSync(join(tmpdir(), 'moerl-hf-models-'));
after(() => rmSync(work, { recursive: true, force: true }));

const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
const readJsonl = <T>(text: string): T[] =>
  text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as T);
const maxAbsDiff = (a: number[][], b: number[][]) => {
  assert.equal(a.length, b.length);
  let worst = 0;
  a.forEach((row, i) => {
    assert.equal(row.length, b[i]!.length, `row ${i} lengths`);
    row.forEach((x, j) => (worst = Math.max(worst, Math.abs(x - b[i]![j]!))));
  });
  return worst;
};

async function native(tool: 'moe_train' | 'moe_generate' | 'moe_hf', args: string[]) {
  const { stdout } = await tools.run(tools.bin(tool), args, { env: tools.env, maxBuffer: 1 << 26 });
  return stdout;
}

/** Runs a tool on `ranks` local ranks under the rank contract; rank 0's stdout. */
async function onRanks(tool: 'moe_generate' | 'moe_hf', args: string[], ranks: number) {
  const port = await freePort();
  const outs = await Promise.all(
    Array.from({ length: ranks }, (_, rank) => {
      const child = spawn(tools.bin(tool), args, {
        env: {
          ...tools.env,
          MOERL_RANK: String(rank),
          MOERL_WORLD_SIZE: String(ranks),
          MOERL_COORDINATOR: `127.0.0.1:${port}`,
          MOERL_FI_PROVIDER: 'shm',
          MOERL_JOB_TOKEN: 'hf-models-test',
        },
      });
      let out = '';
      let err = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      return new Promise<string>((resolve, reject) =>
        child.on('exit', (code) =>
          code === 0 ? resolve(out) : reject(new Error(`${tool} rank ${rank} exited ${code}: ${err}`)),
        ),
      );
    }),
  );
  return outs[0]!;
}

/** Exit code and stderr of a run expected to fail. */
async function failure(tool: 'moe_train' | 'moe_hf', args: string[]) {
  try {
    await native(tool, args);
  } catch (e) {
    const err = e as { code?: number; stderr?: string };
    return { code: err.code, stderr: err.stderr ?? '' };
  }
  assert.fail(`${tool} ${args.join(' ')} succeeded`);
}

interface Compared {
  tensors: number;
  missing: string[];
  bitwise: boolean;
  max_rel_l2: number;
  worst: string;
}
const compare = async (a: string, b: string) =>
  JSON.parse(await pyref.run('hf_models.py', ['compare', a, b])) as Compared;

const logprobs = (text: string) => readJsonl<{ logprobs: number[] }>(text).map((r) => r.logprobs);

for (const family of ['qwen3_moe', 'mixtral'] as const) {
  describe(`${family} against transformers`, { skip: tools.skip || pyref.skip }, () => {
    const dir = join(work, family);
    const ckpt = join(work, `${family}-ckpt`);
    const sequences = join(work, `${family}-sequences.jsonl`);
    const prompts = join(work, `${family}-prompts.jsonl`);
    let reference: number[][];

    before(async () => {
      await pyref.run('hf_models.py', ['make', dir, '--family', family]);
      await native('moe_train', ['init', '--from-hf', dir, '--out', ckpt, '--max-seq-len', '256']);
      // chat-template prompts with an assistant answer each, over 1,000 tokens in all
      const tokenizer = await loadTokenizer(dir);
      const topics = [
        'Grüße aus Köln',
        '東京の天気',
        'a proof that √2 is irrational',
        'emoji 🚀🌍',
        'tabs\tand  spaces',
      ];
      const rows = [];
      const promptRows = [];
      let total = 0;
      for (let i = 0; total < 1100; i++) {
        const topic = topics[i % topics.length]!;
        const chat = tokenizer.renderChat(
          [
            { role: 'system', content: 'You answer briefly.' },
            { role: 'user', content: `Tell me about ${topic} (question ${i}).` },
          ],
          { addGenerationPrompt: true },
        );
        const answer = tokenizer.encode(`Here is what I know about ${topic}: it is case ${i * 7}.`);
        const tokens = [...chat.ids, ...answer, tokenizer.eosTokenIds[0]!];
        rows.push({ tokens, prompt_len: chat.ids.length });
        if (i < 6) promptRows.push({ prompt_id: i, prompt_tokens: chat.ids });
        total += tokens.length;
      }
      writeFileSync(sequences, jsonl(rows));
      writeFileSync(prompts, jsonl(promptRows));
      reference = logprobs(await pyref.run('hf_models.py', ['score', dir, sequences]));
    });

    it('teacher-forced log-probs of chat prompts equal transformers to 1e-4, on 1 and 2 EP ranks', async () => {
      const tokens = reference.reduce((n, r) => n + r.length, 0);
      assert.ok(tokens >= 1000, `${tokens} tokens`);
      const one = logprobs(await native('moe_hf', ['score', '--hf', dir, '--sequences', sequences]));
      const diff = maxAbsDiff(one, reference);
      assert.ok(diff <= 1e-4, `max |moerl - transformers| = ${diff} over ${tokens} tokens`);
      const two = logprobs(await onRanks('moe_hf', ['score', '--hf', dir, '--sequences', sequences], 2));
      assert.ok(maxAbsDiff(two, one) <= 1e-5, `EP 2 vs EP 1: ${maxAbsDiff(two, one)}`);
    });

    it('greedy continuations of 64 tokens equal transformers generate, EP 2 the same tokens', async () => {
      const flags = (out: string) => [
        ...['--checkpoint', ckpt, '--task', family, '--prompts', prompts, '--num-prompts', '6'],
        ...['--samples', '1', '--chunk-size', '6', '--temperature', '0', '--max-new-tokens', '64'],
        ...['--ignore-eos', '--out-dir', out],
      ];
      await native('moe_generate', flags(join(work, `${family}-greedy-1`)));
      await onRanks('moe_generate', flags(join(work, `${family}-greedy-2`)), 2);
      type Sample = { tokens: number[]; logprobs: number[] };
      const chunk = (name: string) =>
        readJsonl<Sample>(readFileSync(join(work, name, 'chunk-0.jsonl'), 'utf8'));
      const one = chunk(`${family}-greedy-1`);
      const two = chunk(`${family}-greedy-2`);
      const ref = readJsonl<{ tokens: number[] }>(
        await pyref.run('hf_models.py', ['generate', dir, prompts, '64']),
      );
      assert.deepEqual(
        one.map((s) => s.tokens),
        ref.map((s) => s.tokens),
      );
      assert.ok(one.every((s) => s.tokens.length === 64));
      assert.deepEqual(
        two.map((s) => s.tokens),
        one.map((s) => s.tokens),
      );
      const diff = maxAbsDiff(
        two.map((s) => s.logprobs),
        one.map((s) => s.logprobs),
      );
      assert.ok(diff <= 1e-5, `EP 2 vs EP 1 log-probs: ${diff}`);
    });

    for (const loss of ['sft', 'grpo'] as const) {
      it(`gradients of a ${loss} loss (balance loss included) equal torch autograd to 1e-4 per tensor`, async () => {
        const batch = join(work, `${family}-${loss}-batch.jsonl`);
        const rows = readJsonl<{ tokens: number[]; prompt_len: number }>(readFileSync(sequences, 'utf8'))
          .slice(0, 4)
          .map((r, i) => ({
            ...r,
            old_logprobs: reference[i]!.slice(r.prompt_len - 1).map((lp, j) => lp + 0.05 * Math.sin(j)),
            advantage: [0.9, -0.4, 1.3, -1.1][i],
          }));
        writeFileSync(batch, jsonl(rows));
        const terms = ['--aux-coef', '0.01', '--entropy-coef', '0.01', '--temperature', '0.9'];
        const mine = join(work, `${family}-${loss}.grad.safetensors`);
        const theirs = join(work, `${family}-${loss}.grad-ref`);
        const m = await native('moe_hf', [
          ...['score', '--hf', dir, '--sequences', batch, '--grad-out', mine, '--loss', loss],
          ...[...terms, '--z-coef', '0'],
        ]);
        const r = await pyref.run('hf_models.py', ['grad', dir, batch, theirs, '--loss', loss, ...terms]);
        const mineLoss = (JSON.parse(m.trim().split('\n').pop()!) as { loss: number }).loss;
        const refLoss = (JSON.parse(r.trim().split('\n').pop()!) as { loss: number }).loss;
        assert.ok(
          Math.abs(mineLoss - refLoss) <= 1e-5 * Math.max(1, Math.abs(refLoss)),
          `${mineLoss} vs ${refLoss}`,
        );
        const c = await compare(mine, theirs);
        assert.deepEqual(c.missing, []);
        assert.ok(c.tensors > 20);
        assert.ok(c.max_rel_l2 <= 1e-4, `worst ${c.worst}: relative L2 ${c.max_rel_l2}`);
      });
    }

    it('import then export is bitwise for every tensor (sharded), and transformers loads the export', async () => {
      const out = join(work, `${family}-export`);
      await native('moe_hf', [
        ...['export', '--checkpoint', ckpt, '--config', join(dir, 'config.json'), '--out', out],
        ...['--max-shard-bytes', '400000'],
      ]);
      const c = await compare(dir, out);
      assert.deepEqual(c.missing, []);
      assert.ok(c.bitwise, `not bitwise: worst ${c.worst}`);
      assert.ok(readFileSync(join(out, 'model.safetensors.index.json'), 'utf8').includes('model-00002-of-'));
      for (const file of ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json'])
        assert.equal(readFileSync(join(out, file), 'utf8'), readFileSync(join(dir, file), 'utf8'), file);
      // the sharded export imports again, and transformers reads it
      const again = join(work, `${family}-reimport`);
      await native('moe_train', ['init', '--from-hf', out, '--out', again, '--max-seq-len', '256']);
      assert.equal(
        maxAbsDiff(logprobs(await pyref.run('hf_models.py', ['score', out, sequences])), reference),
        0,
      );
    });

    it('a GRPO update, exported, gives transformers the logits moerl computes after it (1e-4)', async () => {
      const rollouts = join(work, `${family}-rollouts`);
      await native('moe_generate', [
        ...['--checkpoint', ckpt, '--task', family, '--prompts', prompts, '--num-prompts', '6'],
        ...['--samples', '4', '--chunk-size', '6', '--max-new-tokens', '24', '--out-dir', rollouts],
        ...['--eos-ids', '2047,2045'],
      ]);
      const chunk = join(rollouts, 'chunk-0.jsonl');
      type Rec = { prompt_id: number; sample_index: number; tokens: number[] };
      const recs = readJsonl<Rec>(readFileSync(chunk, 'utf8'));
      const rewards = join(work, `${family}-rewards.jsonl`);
      writeFileSync(
        rewards,
        jsonl(
          recs.map((r) => ({
            prompt_id: r.prompt_id,
            sample_index: r.sample_index,
            reward: r.tokens.length % 3,
          })),
        ),
      );
      const updated = join(work, `${family}-ckpt-1`);
      await native('moe_train', [
        ...['grpo', '--checkpoint', ckpt, '--out', updated, '--rollouts', chunk, '--rewards', rewards],
        ...['--lr', '0.01', '--iteration', '1'],
      ]);
      const out = join(work, `${family}-export-1`);
      await native('moe_hf', [
        'export',
        '--checkpoint',
        updated,
        '--config',
        join(dir, 'config.json'),
        '--out',
        out,
      ]);
      const mine = logprobs(
        await native('moe_hf', ['score', '--checkpoint', updated, '--sequences', sequences]),
      );
      const theirs = logprobs(await pyref.run('hf_models.py', ['score', out, sequences]));
      assert.ok(maxAbsDiff(mine, theirs) <= 1e-4, `after the update: ${maxAbsDiff(mine, theirs)}`);
      assert.ok(maxAbsDiff(mine, reference) > 1e-3, 'the update changed nothing');
    });
  });
}

describe("transformers 4's config.json", { skip: tools.skip || pyref.skip }, () => {
  it('num_experts, rope_theta and torch_dtype (as published Qwen3-MoE checkpoints say) read as the same model', async () => {
    const dir = join(work, 'qwen3-v5');
    await pyref.run('hf_models.py', ['make', dir, '--family', 'qwen3_moe']);
    const v4 = join(work, 'qwen3-v4');
    cpSync(dir, v4, { recursive: true });
    const c = JSON.parse(readFileSync(join(v4, 'config.json'), 'utf8')) as Record<string, unknown>;
    const rope = c.rope_parameters as { rope_theta: number };
    c.num_experts = c.num_local_experts;
    c.rope_theta = rope.rope_theta;
    c.torch_dtype = c.dtype;
    for (const k of ['num_local_experts', 'rope_parameters', 'dtype']) delete c[k];
    writeFileSync(join(v4, 'config.json'), JSON.stringify(c));
    const seqs = join(work, 'v4-sequences.jsonl');
    writeFileSync(seqs, jsonl([{ tokens: [5, 17, 300, 1999, 42, 7, 7, 8] }]));
    const score = async (d: string) => native('moe_hf', ['score', '--hf', d, '--sequences', seqs]);
    assert.equal(await score(v4), await score(dir));
    assert.equal(
      maxAbsDiff(logprobs(await score(v4)), logprobs(await pyref.run('hf_models.py', ['score', v4, seqs]))) <=
        1e-4,
      true,
    );
  });
});

describe('bf16 weights', { skip: tools.skip || pyref.skip }, () => {
  it('import then export of a bfloat16 Qwen3-MoE is bitwise (BF16 on disk both sides)', async () => {
    const dir = join(work, 'qwen3-bf16');
    await pyref.run('hf_models.py', ['make', dir, '--family', 'qwen3_moe', '--dtype', 'bfloat16']);
    const ckpt = join(work, 'qwen3-bf16-ckpt');
    await native('moe_train', ['init', '--from-hf', dir, '--out', ckpt, '--max-seq-len', '64']);
    const out = join(work, 'qwen3-bf16-export');
    await native('moe_hf', [
      'export',
      '--checkpoint',
      ckpt,
      '--config',
      join(dir, 'config.json'),
      '--out',
      out,
    ]);
    const c = await compare(dir, out);
    assert.ok(c.bitwise && c.missing.length === 0, JSON.stringify(c));
  });
});

describe('bad Hugging Face directories', { skip: tools.skip || pyref.skip }, () => {
  const good = join(work, 'bad-base');
  before(async () => {
    await pyref.run('hf_models.py', ['make', good, '--family', 'mixtral']);
    // sharded, so that a shard can go missing
    const ckpt = join(work, 'bad-base-ckpt');
    await native('moe_train', ['init', '--from-hf', good, '--out', ckpt, '--max-seq-len', '64']);
    await native('moe_hf', [
      ...[
        'export',
        '--checkpoint',
        ckpt,
        '--config',
        join(good, 'config.json'),
        '--out',
        join(work, 'bad-sharded'),
      ],
      ...['--max-shard-bytes', '400000'],
    ]);
  });
  const variant = (name: string, from = good) => {
    const d = join(work, `bad-${name}`);
    cpSync(from, d, { recursive: true });
    return d;
  };
  const editConfig = (d: string, edit: (c: Record<string, unknown>) => void) => {
    const c = JSON.parse(readFileSync(join(d, 'config.json'), 'utf8')) as Record<string, unknown>;
    edit(c);
    writeFileSync(join(d, 'config.json'), JSON.stringify(c));
  };
  const refused = async (d: string, ...expected: RegExp[]) => {
    const f = await failure('moe_train', [
      'init',
      '--from-hf',
      d,
      '--out',
      join(d, 'ckpt'),
      '--max-seq-len',
      '64',
    ]);
    assert.equal(f.code, 2, f.stderr);
    for (const e of expected) assert.match(f.stderr, e);
  };

  it('a missing shard is named', async () => {
    const d = variant('missing-shard', join(work, 'bad-sharded'));
    rmSync(join(d, 'model-00002-of-00003.safetensors'), { force: true });
    rmSync(join(d, 'model-00002-of-00004.safetensors'), { force: true });
    await refused(d, /model-00002-of-0000\d\.safetensors/);
  });

  it('a tensor of the wrong shape is named with both shapes', async () => {
    const d = variant('shape');
    editConfig(d, (c) => (c.intermediate_size = 40));
    await refused(
      d,
      /block_sparse_moe\.experts\.0\.w1\.weight has shape \[48,64\], the config says \[40,64\]/,
    );
  });

  it('an unknown model_type is refused with the supported ones', async () => {
    const d = variant('model-type');
    editConfig(d, (c) => (c.model_type = 'llama'));
    await refused(d, /model_type llama is not supported \(qwen3_moe, mixtral\)/);
  });

  it('unsupported config fields and values are all listed at once', async () => {
    const d = variant('fields');
    editConfig(d, (c) => {
      c.rope_scaling = { type: 'yarn', factor: 4 };
      c.hidden_act = 'gelu';
      c.some_new_field = 1;
    });
    await refused(d, /rope_scaling/, /hidden_act = "gelu"/, /unsupported field some_new_field/);
  });

  it('a truncated safetensors header is named', async () => {
    const d = variant('truncated');
    truncateSync(join(d, 'model.safetensors'), 100);
    await refused(d, /model\.safetensors.*(truncated header|header length)/);
  });
});
