// Each RL recipe's gradients against an independent reference (docs/algorithms.md): the native
// core (moe_hf score --grad-out) and the PyTorch engine (engines/pytorch/tests/grad.py) compute
// one step's loss on the same batch, from rewards to advantages to the aggregated loss with its
// KL, entropy and balance terms; test/reference/hf_models.py grad writes each formula out anew,
// by torch autograd with the model in float64. Per tensor, both fp32 trainers agree with it to
// 1e-5 relative (L2). The batch has groups of 3 with one group of equal rewards (left out),
// loss masks with an environment's tokens inside a completion, and behaviour log-probs off the
// policy's by up to 0.3 nats, so that every clip takes effect on some tokens.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { nativeTools } from '../support/native-tools.js';
import { pytorchEngine } from '../support/pytorch-engine.js';

const tools = nativeTools(['moe_hf']);
const engine = pytorchEngine();
const pyref = engine.pyref;
const work = mkdtempSync(join(tmpdir(), 'moerl-algorithm-reference-'));
after(() => rmSync(work, { recursive: true, force: true }));

const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';

/** Loss terms every case shares; each case adds its recipe's flags. */
const shared = ['--temperature', '0.9', '--entropy-coef', '0.01', '--aux-coef', '0.01', '--kl-coef', '0.05'];

const recipes: { name: string; flags: string[] }[] = [
  {
    name: 'DAPO (ppo-clip with clip-higher, token-mean, group-norm, k3)',
    flags: [
      '--policy-loss',
      'ppo-clip',
      '--clip-eps',
      '0.2',
      '--clip-high',
      '0.28',
      '--aggregation',
      'token-mean',
    ],
  },
  {
    name: 'Dr.GRPO (group-mean, seq-mean-token-sum-norm, k1)',
    flags: [
      ...['--advantage', 'group-mean', '--aggregation', 'seq-mean-token-sum-norm', '--norm-tokens', '24'],
      ...['--kl-estimator', 'k1'],
    ],
  },
  {
    name: 'GSPO (sequence ratio with its own narrow clip, seq-mean-token-mean, k2)',
    flags: [
      ...['--policy-loss', 'gspo', '--clip-eps', '0.03', '--clip-high', '0.04'],
      ...['--aggregation', 'seq-mean-token-mean', '--kl-estimator', 'k2'],
    ],
  },
  {
    name: 'CISPO (clipped IS weight, token-mean, RLOO)',
    flags: ['--policy-loss', 'cispo', '--clip-eps', '0.1', '--clip-high', '0.15', '--advantage', 'rloo'],
  },
  {
    name: 'the KL as a reward penalty (k3, group-norm)',
    flags: ['--kl-in-reward'],
  },
  {
    name: 'REINFORCE++ baseline (ppo-clip, seq-mean-token-sum, k2)',
    flags: [
      ...['--advantage', 'reinforce-pp-baseline', '--aggregation', 'seq-mean-token-sum'],
      ...['--kl-estimator', 'k2'],
    ],
  },
];

interface Compared {
  tensors: number;
  missing: string[];
  max_rel_l2: number;
  worst: string;
}
const lastJson = <T>(text: string) => JSON.parse(text.trim().split('\n').pop()!) as T;

describe('RL recipes against an independent float64 reference', { skip: tools.skip || engine.skip }, () => {
  const model = join(work, 'qwen3_moe');
  const batch = join(work, 'batch.jsonl');

  before(async () => {
    await pyref.run('hf_models.py', ['make', model, '--family', 'qwen3_moe', '--seed', '5']);
    // 4 groups of 3: prompts of 5 to 7 tokens, completions of 6 to 13; the third group's rewards
    // are equal, so no estimator trains on it
    let seed = 12345;
    const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31);
    const rewards = [
      [1, 0, 0.5],
      [0, 0.25, 1],
      [0.5, 0.5, 0.5],
      [1, 0, 0],
    ];
    const rows = rewards.flatMap((group, g) =>
      group.map((reward, k) => {
        const prompt = Array.from({ length: 5 + ((g + k) % 3) }, () => 3 + (next() % 2000));
        const completion = Array.from({ length: 6 + ((5 * g + 3 * k) % 8) }, () => 3 + (next() % 2000));
        return { tokens: [...prompt, ...completion], prompt_len: prompt.length, group: g, reward };
      }),
    );
    writeFileSync(join(work, 'sequences.jsonl'), jsonl(rows));
    const scored = (
      await pyref.run('hf_models.py', ['score', model, join(work, 'sequences.jsonl'), '--temperature', '0.9'])
    )
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { logprobs: number[] }).logprobs);
    const full = rows.map((r, i) => {
      const lp = scored[i]!.slice(r.prompt_len - 1);
      const row: Record<string, unknown> = {
        ...r,
        old_logprobs: lp.map((x, j) => x + 0.3 * Math.sin(1.7 * j + i)),
        ref_logprobs: lp.map((x, j) => x + 0.2 * Math.cos(1.3 * j + 2 * i)),
      };
      // an environment's tokens (a tool result) inside two completions of different groups
      if (i === 1 || i === 9) row.loss_mask = lp.map((_, j) => (j >= 2 && j < 4 ? 0 : 1));
      return row;
    });
    writeFileSync(batch, jsonl(full));
  });

  // One process per implementation for all recipes (torch is imported once in each); moe_hf
  // starts in milliseconds, so it runs once per recipe.
  type Outcome = {
    reference: { loss: number; clipped: number };
    native: { loss: number };
    pytorch: { loss: number };
    compared: { native: Compared; pytorch: Compared };
  };
  let outcomes: Outcome[] = [];
  before(async () => {
    const cases = (who: string) =>
      recipes.map((r, i) => ({ out: join(work, `${who}-${i}`), flags: [...shared, ...r.flags] }));
    writeFileSync(
      join(work, 'reference-cases.jsonl'),
      jsonl(cases('ref').map((c) => ({ ...c, flags: ['--loss', 'grpo', '--float64', ...c.flags] }))),
    );
    writeFileSync(join(work, 'pytorch-cases.jsonl'), jsonl(cases('pytorch')));
    const native = async () => {
      const out: { loss: number }[] = [];
      for (const [i, r] of recipes.entries()) {
        const grad = ['--grad-out', join(work, `native-${i}.safetensors`), '--loss', 'grpo', '--z-coef', '0'];
        const run = await tools.run(
          tools.bin('moe_hf'),
          ['score', '--hf', model, '--sequences', batch, ...grad, ...shared, ...r.flags],
          { env: tools.env, maxBuffer: 1 << 26 },
        );
        out.push(lastJson<{ loss: number }>(run.stdout));
      }
      return out;
    };
    const [refOut, nativeOut, pytorchOut] = await Promise.all([
      pyref.run('hf_models.py', ['grad-cases', model, batch, join(work, 'reference-cases.jsonl')]),
      native(),
      engine.gradients(model, batch, join(work, 'pytorch-cases.jsonl')),
    ]);
    const refs = refOut
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Outcome['reference']);
    const pairs = recipes.flatMap((_, i) => [
      join(work, `native-${i}.safetensors`),
      join(work, `ref-${i}`),
      join(work, `pytorch-${i}`),
      join(work, `ref-${i}`),
    ]);
    const compared = (await pyref.run('hf_models.py', ['compare', ...pairs]))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Compared);
    assert.equal(refs.length, recipes.length);
    assert.equal(compared.length, 2 * recipes.length);
    outcomes = recipes.map((_, i) => ({
      reference: refs[i]!,
      native: nativeOut[i]!,
      pytorch: pytorchOut[i]!,
      compared: { native: compared[2 * i]!, pytorch: compared[2 * i + 1]! },
    }));
  });

  for (const [i, recipe] of recipes.entries()) {
    it(`${recipe.name}: native and PyTorch gradients equal the reference to 1e-5 per tensor`, (t) => {
      const { reference: r, native: n, pytorch: p, compared } = outcomes[i]!;
      assert.ok(r.clipped > 0, `no token's clip took effect (${r.clipped}): the case would not test it`);
      for (const [who, loss] of [
        ['native', n.loss],
        ['PyTorch', p.loss],
      ] as const)
        assert.ok(
          Math.abs(loss - r.loss) <= 1e-6 * Math.max(1, Math.abs(r.loss)),
          `${who} loss ${loss} vs ${r.loss}`,
        );
      for (const [who, c] of [
        ['native', compared.native],
        ['PyTorch', compared.pytorch],
      ] as const) {
        t.diagnostic(
          `${who}: worst ${c.worst} ${c.max_rel_l2.toExponential(2)}; clipped tokens ${r.clipped}`,
        );
        assert.deepEqual(c.missing, [], who);
        assert.ok(c.tensors > 20, who);
        assert.ok(c.max_rel_l2 <= 1e-5, `${who}: worst ${c.worst}, relative L2 ${c.max_rel_l2}`);
      }
    });
  }
});
