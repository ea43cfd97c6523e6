// The PyTorch trainer rank (engines/pytorch, docs/engines.md) against the native trainer: from
// the tiny Qwen3-MoE of test/reference/hf_models.py and rollouts sampled by native moe_generate
// (prompt token ids, --eos-ids), an SFT run and two GRPO iterations (KL to a reference policy,
// entropy bonus, temperature, two minibatches, several micro-batches, a skipped group) by
// `moe_train` (imported with init --from-hf, exported with moe_hf) and by the PyTorch trainer
// from the same weights agree per parameter tensor, router included, and in their metrics, also
// with truncated importance sampling on rollouts whose log-probs are perturbed; two PyTorch ranks
// (gloo, FSDP2) give one rank's result; bad input exits 2 naming the problem.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { nativeTools } from '../support/native-tools.js';
import type { EngineRun } from '../support/pytorch-engine.js';
import { pytorchEngine } from '../support/pytorch-engine.js';

const tools = nativeTools(['moe_train', 'moe_generate', 'moe_hf']);
const engine = pytorchEngine();
const work = mkdtempSync(join(tmpdir(), 'moerl-pytorch-trainer-'));
after(() => rmSync(work, { recursive: true, force: true }));

const at = (name: string) => join(work, name);
const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
const readJsonl = <T>(text: string): T[] =>
  text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as T);

async function native(tool: 'moe_train' | 'moe_generate' | 'moe_hf', args: string[]) {
  const { stdout } = await tools.run(tools.bin(tool), args, { env: tools.env, maxBuffer: 1 << 26 });
  return stdout;
}

/** A run that must succeed: its stdout. */
function ok(run: EngineRun, what: string): string {
  assert.equal(run.code, 0, `${what} exited ${run.code}: ${run.stderr.slice(-4000)}`);
  return run.stdout;
}

type Metrics = Record<string, number | number[] | number[][] | boolean>;
const stepLines = (stdout: string) => readJsonl<Metrics>(stdout).filter((m) => !m.progress);

/** The metrics both trainers define the same way agree to 1e-4 (relative, or absolute near 0). */
function sameMetrics(mine: Metrics[], theirs: Metrics[]) {
  assert.equal(mine.length, theirs.length, 'optimizer steps');
  const names = [
    'loss',
    'policy_loss',
    'kl',
    'entropy',
    'clip_frac',
    'mismatch_kl',
    'tis_clip_frac',
    'aux_loss',
    'z_loss',
    'grad_norm',
    'lr',
  ];
  mine.forEach((m, i) => {
    for (const name of [...names, 'tokens', 'sequences', 'step']) {
      const a = m[name] as number;
      const b = theirs[i]![name] as number;
      assert.ok(Math.abs(a - b) <= 1e-4 * Math.max(1, Math.abs(b)), `step ${i} ${name}: ${a} vs native ${b}`);
    }
    for (const name of ['expert_load', 'expert_load_layers'])
      assert.equal(JSON.stringify(m[name]).length > 2, true, `step ${i} ${name}`);
  });
}

/** A native checkpoint as an HF directory (the source's config, tokenizer, generation config). */
async function exportHf(ckpt: string, out: string) {
  await native('moe_hf', [
    'export',
    '--checkpoint',
    ckpt,
    '--config',
    join(at('hf'), 'config.json'),
    '--out',
    out,
  ]);
}

// SFT examples: prompt and answer text for moe_train sft --data (its character tokenizer), and
// the same as token ids for the PyTorch trainer (ids: 0 pad, 1 eos, then the characters).
const chars = '0123456789+=: ,abcdefghijklmnopqrstuvwxyz';
const encode = (text: string) => [...text].map((c) => 2 + chars.indexOf(c));
const sftExamples: [string, string][] = [
  ['rev:abc=', 'cba'],
  ['12+7=', '19'],
  ['sort:3141=', '1134'],
  ['rev:hello world=', 'dlrow olleh'],
  ['9+9=', '18'],
  ['sort:=', ''],
];

describe('PyTorch trainer rank against the native trainer', { skip: tools.skip || engine.skip }, () => {
  const grpoFlags = [
    ...['--kl-coef', '0.05', '--entropy-coef', '0.01', '--temperature', '0.9', '--clip-eps', '0.2'],
    ...['--minibatches', '2', '--lr', '0.002'],
  ];

  // the engine's unit tests run beside the set-up (each is mostly one Python start-up)
  let unitTests: Promise<EngineRun>;

  before(async () => {
    unitTests = engine.unitTests();
    await engine.pyref.run('hf_models.py', ['make', at('hf'), '--family', 'qwen3_moe']);
    await native('moe_train', ['init', '--from-hf', at('hf'), '--out', at('ckpt0'), '--max-seq-len', '128']);
    // 6 prompts of token ids, 5 samples each at temperature 0.9, two chunks
    const prompts = Array.from({ length: 6 }, (_, p) => ({
      prompt_id: p,
      prompt_tokens: Array.from({ length: 4 + p }, (_, j) => (p * 37 + j * 11 + 5) % 2000),
    }));
    writeFileSync(at('prompts.jsonl'), jsonl(prompts));
    await native('moe_generate', [
      ...['--checkpoint', at('ckpt0'), '--task', 'qwen3_moe', '--prompts', at('prompts.jsonl')],
      ...['--num-prompts', '6', '--samples', '5', '--chunk-size', '3', '--temperature', '0.9'],
      ...['--max-new-tokens', '12', '--eos-ids', '2047,2045', '--out-dir', at('rollouts')],
    ]);
    const chunks = [0, 1].map((k) => join(at('rollouts'), `chunk-${k}.jsonl`));
    writeFileSync(at('rollouts.txt'), chunks.join('\n') + '\n');
    type Rec = { prompt_id: number; sample_index: number };
    const recs = chunks.flatMap((c) => readJsonl<Rec>(readFileSync(c, 'utf8')));
    assert.equal(recs.length, 30);
    // prompt 0's rewards are all equal: a group without signal, skipped by both trainers
    const reward = (r: Rec) => (r.prompt_id === 0 ? 1 : (r.sample_index + r.prompt_id) % 3);
    writeFileSync(
      at('rewards.jsonl'),
      jsonl(recs.map((r) => ({ prompt_id: r.prompt_id, sample_index: r.sample_index, reward: reward(r) }))),
    );
    writeFileSync(at('rewards.txt'), at('rewards.jsonl') + '\n');
    // the same samples, every other one cut at the length limit: DAPO's overlong filtering
    const cut = chunks.map((c, k) => {
      const path = join(at('rollouts'), `cut-${k}.jsonl`);
      const records = readJsonl<Rec & Record<string, unknown>>(readFileSync(c, 'utf8'));
      writeFileSync(
        path,
        jsonl(
          records.map((r) => ({
            ...r,
            finish_reason: (r.prompt_id + r.sample_index) % 2 ? 'length' : 'stop',
          })),
        ),
      );
      return path;
    });
    writeFileSync(at('rollouts-cut.txt'), cut.join('\n') + '\n');
    writeFileSync(at('sft-text.jsonl'), jsonl(sftExamples.map(([prompt, answer]) => ({ prompt, answer }))));
    writeFileSync(
      at('sft-ids.jsonl'),
      jsonl(sftExamples.map(([p, a]) => ({ prompt_tokens: encode(p), tokens: [...encode(a), 1] }))),
    );
    // the KL term's reference policy: one native SFT step away from the policy
    await native('moe_train', [
      ...['sft', '--checkpoint', at('ckpt0'), '--out', at('ref-ckpt'), '--data', at('sft-text.jsonl')],
      ...['--steps', '1', '--batch-size', '6', '--lr', '0.01'],
    ]);
    await exportHf(at('ref-ckpt'), at('ref-hf'));
  });

  it("the engine's unit tests pass (inputs, loss terms, AdamW, rank contract, pins)", async () => {
    const r = await unitTests;
    assert.equal(r.code, 0, r.stderr.slice(-4000));
  });

  it('an SFT run (2 steps, warmup, cosine, 2 micro-batches) agrees with moe_train sft to 1e-4 per tensor', async (t) => {
    const flags = ['--steps', '2', '--batch-size', '5', '--warmup-steps', '1', '--micro-batch', '3'];
    const nat = stepLines(
      await native('moe_train', [
        ...['sft', '--checkpoint', at('ckpt0'), '--out', at('sft-native'), '--data', at('sft-text.jsonl')],
        ...flags,
      ]),
    );
    await exportHf(at('sft-native'), at('sft-native-hf'));
    const mine = stepLines(
      ok(
        await engine.train([
          ...['sft', '--checkpoint', at('hf'), '--out', at('sft-pt'), '--data', at('sft-ids.jsonl')],
          ...flags,
        ]),
        'pytorch sft',
      ),
    );
    sameMetrics(mine, nat);
    const c = await engine.compare(at('sft-pt'), at('sft-native-hf'), at('hf'));
    t.diagnostic(`SFT: parameters ${c.max_rel_l2} (${c.worst}), updates ${c.max_update_rel_l2}`);
    assert.deepEqual(c.missing, []);
    assert.equal(c.tensors, 80);
    assert.ok(c.max_rel_l2 <= 1e-4, `worst ${c.worst}: relative L2 ${c.max_rel_l2}`);
    assert.ok(c.changed! >= 70, `only ${c.changed} tensors changed`);
  });

  it('two GRPO iterations (KL, entropy, temperature, 2 minibatches) agree with moe_train grpo to 1e-4 per tensor', async (t) => {
    // iteration 1 from the imported policy; iteration 2 from each trainer's own output, so the
    // AdamW moments and step carry over (native checkpoint; optimizer.moerl beside the HF files)
    const lists = ['--rollouts-file', at('rollouts.txt'), '--rewards-file', at('rewards.txt')];
    const nativeRun = async (from: string, to: string, iteration: string) =>
      stepLines(
        await native('moe_train', [
          ...['grpo', '--checkpoint', from, '--out', to, '--ref-checkpoint', at('ref-ckpt')],
          ...[...lists, ...grpoFlags, '--micro-batch', '4', '--iteration', iteration],
        ]),
      );
    const torchRun = async (from: string, to: string, iteration: string) =>
      stepLines(
        ok(
          await engine.train([
            ...['grpo', '--checkpoint', from, '--out', to, '--ref-checkpoint', at('ref-hf')],
            ...[...lists, ...grpoFlags, '--micro-batch', '4', '--iteration', iteration],
            ...['--metrics', join(at('metrics'), 'grpo.jsonl')],
          ]),
          `pytorch grpo iteration ${iteration}`,
        ),
      );
    const nat1 = await nativeRun(at('ckpt0'), at('grpo-native-1'), '1');
    const nat2 = await nativeRun(at('grpo-native-1'), at('grpo-native-2'), '2');
    await exportHf(at('grpo-native-1'), at('grpo-native-1-hf'));
    await exportHf(at('grpo-native-2'), at('grpo-native-2-hf'));
    const mine1 = await torchRun(at('hf'), at('grpo-pt-1'), '1');
    const mine2 = await torchRun(at('grpo-pt-1'), at('grpo-pt-2'), '2');
    sameMetrics(mine1, nat1);
    sameMetrics(mine2, nat2);
    for (const m of [...mine1, ...mine2]) {
      assert.equal(m.groups, 6);
      assert.equal(m.skipped_groups, 1);
      assert.ok((m.kl as number) > 0);
    }
    assert.ok(
      mine2.some((m) => (m.clip_frac as number) > 0),
      'iteration 2 is off-policy: some tokens clip',
    );
    // native rollouts: both trainers' log-probs are theirs to rounding
    t.diagnostic(
      `mismatch_kl of the first step: native ${nat1[0]!.mismatch_kl}, PyTorch ${mine1[0]!.mismatch_kl}`,
    );
    for (const m of [nat1[0]!, mine1[0]!])
      assert.ok((m.mismatch_kl as number) < 1e-6, `mismatch ${m.mismatch_kl}`);
    assert.equal(readJsonl(readFileSync(join(at('metrics'), 'grpo.jsonl'), 'utf8')).length, 4);
    for (const [mine, theirs, from] of [
      ['grpo-pt-1', 'grpo-native-1-hf', 'hf'],
      ['grpo-pt-2', 'grpo-native-2-hf', 'grpo-native-1-hf'],
    ] as const) {
      const c = await engine.compare(at(mine), at(theirs), at(from));
      t.diagnostic(`${mine}: parameters ${c.max_rel_l2} (${c.worst}), updates ${c.max_update_rel_l2}`);
      assert.deepEqual(c.missing, []);
      assert.equal(c.tensors, 80);
      assert.ok(c.max_rel_l2 <= 1e-4, `${mine}: worst ${c.worst}, relative L2 ${c.max_rel_l2}`);
      assert.ok(c.changed! >= 70, `only ${c.changed} tensors changed`);
    }
    // the PyTorch output is a complete HF directory, its config.json the source's
    assert.equal(
      readFileSync(join(at('grpo-pt-2'), 'config.json'), 'utf8'),
      readFileSync(join(at('hf'), 'config.json'), 'utf8'),
    );
    for (const file of ['tokenizer.json', 'generation_config.json', 'optimizer.moerl'])
      assert.ok(readFileSync(join(at('grpo-pt-2'), file)).length > 0, file);
  });

  it('truncated importance sampling (rollout log-probs perturbed, 2 epochs) agrees with moe_train grpo to 1e-4 per tensor', async (t) => {
    // a foreign sampler's log-probs: shifted per token so that the weights p_train / p_rollout
    // are about e^1.2 (capped at 2), e^-0.4, 1, e^0.3 and e^-0.9
    const shifts = [-1.2, 0.4, 0, -0.3, 0.9];
    const files = [0, 1].map((k) => {
      const recs = readJsonl<{ logprobs: number[] }>(
        readFileSync(join(at('rollouts'), `chunk-${k}.jsonl`), 'utf8'),
      );
      const out = at(`tis-chunk-${k}.jsonl`);
      writeFileSync(
        out,
        jsonl(recs.map((r) => ({ ...r, logprobs: r.logprobs.map((lp, j) => lp + shifts[j % 5]!) }))),
      );
      return out;
    });
    writeFileSync(at('tis-rollouts.txt'), files.join('\n') + '\n');
    const flags = [
      ...['--rollouts-file', at('tis-rollouts.txt'), '--rewards-file', at('rewards.txt')],
      ...[...grpoFlags, '--micro-batch', '4', '--epochs', '2', '--tis-clip', '2', '--iteration', '1'],
    ];
    const nat = stepLines(
      await native('moe_train', [
        ...[
          'grpo',
          '--checkpoint',
          at('ckpt0'),
          '--out',
          at('tis-native'),
          '--ref-checkpoint',
          at('ref-ckpt'),
        ],
        ...flags,
      ]),
    );
    await exportHf(at('tis-native'), at('tis-native-hf'));
    const mine = stepLines(
      ok(
        await engine.train([
          ...['grpo', '--checkpoint', at('hf'), '--out', at('tis-pt'), '--ref-checkpoint', at('ref-hf')],
          ...flags,
        ]),
        'pytorch grpo with TIS',
      ),
    );
    sameMetrics(mine, nat);
    assert.equal(nat.length, 4, '2 minibatches, 2 epochs');
    for (const m of nat) {
      assert.ok((m.tis_clip_frac as number) > 0.1, `a fifth of the weights capped: ${m.tis_clip_frac}`);
      assert.ok((m.mismatch_kl as number) > 0.05, `mismatch_kl ${m.mismatch_kl}`);
    }
    const c = await engine.compare(at('tis-pt'), at('tis-native-hf'), at('hf'));
    t.diagnostic(`TIS: parameters ${c.max_rel_l2} (${c.worst}), updates ${c.max_update_rel_l2}`);
    t.diagnostic(
      `TIS metrics, native: ${nat.map((m) => `${m.mismatch_kl}/${m.tis_clip_frac}/${m.clip_frac}`).join(' ')}`,
    );
    assert.deepEqual(c.missing, []);
    assert.equal(c.tensors, 80);
    assert.ok(c.max_rel_l2 <= 1e-4, `worst ${c.worst}: relative L2 ${c.max_rel_l2}`);
    assert.ok(c.changed! >= 70, `only ${c.changed} tensors changed`);
  });

  // docs/algorithms.md: each policy loss, aggregation, advantage and KL estimator on both
  // trainers; 2 epochs, so the second is off-policy and the clips act
  const algorithms: [string, string[]][] = [
    [
      'GSPO (seq-mean-token-mean, RLOO)',
      [
        '--policy-loss',
        'gspo',
        '--aggregation',
        'seq-mean-token-mean',
        '--advantage',
        'rloo',
        '--clip-high',
        '0.5',
      ],
    ],
    [
      'CISPO (seq-mean-token-sum-norm, REINFORCE++ baseline, k1, TIS)',
      [
        ...['--policy-loss', 'cispo', '--aggregation', 'seq-mean-token-sum-norm', '--norm-tokens', '12'],
        ...[
          '--advantage',
          'reinforce-pp-baseline',
          '--kl-estimator',
          'k1',
          '--clip-high',
          '0.05',
          '--tis-clip',
          '2',
        ],
      ],
    ],
    [
      'DAPO clip-higher and overlong filtering (seq-mean-token-sum, group mean, k2)',
      [
        ...['--clip-high', '0.28', '--aggregation', 'seq-mean-token-sum', '--advantage', 'group-mean'],
        ...['--kl-estimator', 'k2', '--mask-truncated'],
      ],
    ],
    ['the KL as a reward penalty (k1)', ['--kl-in-reward', '--kl-estimator', 'k1']],
  ];
  for (const [name, flags] of algorithms) {
    it(`${name} agrees with moe_train grpo to 1e-4 per tensor`, async (t) => {
      const tag = `alg-${algorithms.findIndex(([n]) => n === name)}`;
      const cut = flags.includes('--mask-truncated');
      const common = [
        ...[
          '--rollouts-file',
          at(cut ? 'rollouts-cut.txt' : 'rollouts.txt'),
          '--rewards-file',
          at('rewards.txt'),
        ],
        ...[...grpoFlags, ...flags, '--micro-batch', '4', '--epochs', '2', '--iteration', '1'],
      ];
      const nat = stepLines(
        await native('moe_train', [
          ...['grpo', '--checkpoint', at('ckpt0'), '--out', at(`${tag}-native`)],
          ...['--ref-checkpoint', at('ref-ckpt'), ...common],
        ]),
      );
      await exportHf(at(`${tag}-native`), at(`${tag}-native-hf`));
      const mine = stepLines(
        ok(
          await engine.train([
            ...['grpo', '--checkpoint', at('hf'), '--out', at(`${tag}-pt`), '--ref-checkpoint', at('ref-hf')],
            ...common,
          ]),
          `pytorch grpo: ${name}`,
        ),
      );
      sameMetrics(mine, nat);
      assert.equal(nat.length, 4, '2 minibatches, 2 epochs');
      // 15 of the 30 samples are cut; both trainers leave them out alike (sameMetrics: tokens, sequences)
      for (const m of [...nat, ...mine]) assert.equal(m.overlong_filtered, cut ? 15 : 0);
      if (flags.includes('--kl-in-reward'))
        mine.forEach((m, i) => {
          const theirs = nat[i]!;
          assert.ok((theirs.reward_kl as number) > 0, `native reward_kl ${theirs.reward_kl}`);
          assert.ok(Math.abs((m.reward_kl as number) - (theirs.reward_kl as number)) <= 1e-5, 'reward_kl');
          // the penalties part prompt 0's equal rewards: its group is trained on too
          assert.deepEqual([m.skipped_groups, theirs.skipped_groups], [0, 0]);
        });
      const c = await engine.compare(at(`${tag}-pt`), at(`${tag}-native-hf`), at('hf'));
      t.diagnostic(
        `${name}: parameters ${c.max_rel_l2} (${c.worst}), updates ${c.max_update_rel_l2}; ` +
          `clip_frac ${nat.map((m) => m.clip_frac).join(' ')}`,
      );
      assert.deepEqual(c.missing, []);
      assert.ok(c.max_rel_l2 <= 1e-4, `worst ${c.worst}: relative L2 ${c.max_rel_l2}`);
      assert.ok(c.changed! >= 70, `only ${c.changed} tensors changed`);
    });
  }

  it('2 ranks (gloo, FSDP2, an empty micro-batch on rank 1) give the 1-rank update to rounding', async (t) => {
    // 25 sequences in minibatches of 13 and 12: with --micro-batch 2 each rank's sequences make 4
    // and 3 micro-batches (rank 1 runs an empty fourth), grouped for the balance loss as one rank's
    // --micro-batch 4
    const runs = await engine.trainOnRanks(
      [
        ...['grpo', '--checkpoint', at('hf'), '--out', at('grpo-pt-ranks'), '--ref-checkpoint', at('ref-hf')],
        ...['--rollouts-file', at('rollouts.txt'), '--rewards-file', at('rewards.txt')],
        ...[...grpoFlags, '--micro-batch', '2', '--iteration', '1'],
      ],
      2,
    );
    assert.deepEqual(
      runs.map((r) => r.code),
      [0, 0],
      runs.map((r, rank) => `rank ${rank}: ${r.stderr.slice(-2000)}`).join('\n'),
    );
    assert.equal(stepLines(runs[1]!.stdout).length, 0, 'rank 1 prints nothing');
    const c = await engine.compare(at('grpo-pt-ranks'), at('grpo-pt-1'));
    t.diagnostic(`2 ranks vs 1: parameters ${c.max_rel_l2} (${c.worst})`);
    assert.ok(c.max_rel_l2 <= 1e-5, `worst ${c.worst}: relative L2 ${c.max_rel_l2}`);
  });

  it('bad input exits 2 naming the file, line or variable', async () => {
    const bad = at('bad');
    mkdirSync(bad, { recursive: true });
    const grpo = (overrides: Record<string, string>, env: Record<string, string> = {}) => {
      const flags: Record<string, string> = {
        '--checkpoint': at('hf'),
        '--out': join(bad, 'out'),
        '--rollouts-file': at('rollouts.txt'),
        '--rewards-file': at('rewards.txt'),
        ...overrides,
      };
      return engine.train(['grpo', ...Object.entries(flags).flat()], env);
    };
    const refused = async (run: Promise<EngineRun>, pattern: RegExp) => {
      const r = await run;
      assert.equal(r.code, 2, `exit ${r.code}: ${r.stderr}`);
      assert.match(r.stderr, pattern);
    };
    // a rollout file that does not exist
    writeFileSync(
      join(bad, 'missing.txt'),
      `${join(at('rollouts'), 'chunk-0.jsonl')}\n${join(bad, 'nope.jsonl')}\n`,
    );
    await refused(
      grpo({ '--rollouts-file': join(bad, 'missing.txt') }),
      /missing\.txt line 2: cannot open .*nope\.jsonl/,
    );
    // a malformed rollout line
    const lines = readFileSync(join(at('rollouts'), 'chunk-0.jsonl'), 'utf8').split('\n');
    lines[2] = lines[2]!.replace('"logprobs":[', '"logprobs":[0.5,');
    writeFileSync(join(bad, 'chunk.jsonl'), lines.join('\n'));
    writeFileSync(join(bad, 'malformed.txt'), join(bad, 'chunk.jsonl') + '\n');
    await refused(
      grpo({ '--rollouts-file': join(bad, 'malformed.txt') }),
      /chunk\.jsonl line 3: \d+ logprobs for \d+ tokens/,
    );
    writeFileSync(join(bad, 'chunk.jsonl'), '{"prompt_id": 0,\n');
    await refused(
      grpo({ '--rollouts-file': join(bad, 'malformed.txt') }),
      /chunk\.jsonl line 1: malformed JSON/,
    );
    // directories that are not Hugging Face models
    await refused(grpo({ '--checkpoint': at('ckpt0') }), /--checkpoint .*ckpt0: no config\.json/);
    mkdirSync(join(bad, 'llama'), { recursive: true });
    writeFileSync(join(bad, 'llama', 'config.json'), JSON.stringify({ model_type: 'llama' }));
    await refused(grpo({ '--checkpoint': join(bad, 'llama') }), /model_type llama is not supported/);
    // a rank contract without a coordinator, and a flag out of range
    await refused(grpo({}, { MOERL_WORLD_SIZE: '2' }), /MOERL_COORDINATOR='' must be host:port/);
    await refused(grpo({ '--minibatches': '0' }), /--minibatches: must be > 0/);
  });
});
