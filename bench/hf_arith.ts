// The hf-arith example (examples/hf-arith) measured: the example's campaign once per seed, each
// on its own dev server and worker (`moerl demo --spec`), then read back from its store: the SFT
// warm start's loss (first and last step), the mean training reward of every GRPO iteration
// (its rollouts' rewards), and the validation scores (mean reward and pass@k on the held-out
// sums) of each validated checkpoint. Prints one JSON line per seed and one with the medians.
// Needs the example's model and data in its store (npm run example:hf-arith made them).
// Usage: node dist/bench/hf_arith.js [--seeds 1,2,3] [--set key=value]...
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { campaignPrefix, metricsKey, validationScoresKey } from '../activities/layout.js';
import { median } from './support/stats.js';

const { values } = parseArgs({
  options: {
    seeds: { type: 'string', default: '1,2,3' },
    set: { type: 'string', multiple: true, default: [] },
  },
});
const root = fileURLToPath(new URL('../..', import.meta.url));
const storeDir = resolve(root, '.moerl/hf-arith/store');

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
const round = (x: number) => Math.round(x * 1000) / 1000;

function measure(seed: number) {
  const sets = [`seed=${seed}`, ...(values.set as string[])].flatMap((s) => ['--set', s]);
  const started = Date.now();
  const out = execFileSync(
    'node',
    [
      'bin/moerl.js',
      'demo',
      '--json',
      '--spec',
      'examples/hf-arith/spec.yaml',
      '--state-dir',
      `.moerl/hf-arith/bench-${seed}`,
      ...sets,
    ],
    { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const wallS = (Date.now() - started) / 1000;
  const result = JSON.parse(out.trim().split('\n').at(-1)!) as { campaign_id: string; status: string };
  const at = (key: string) => join(storeDir, key);
  const id = result.campaign_id;
  const sft = (JSON.parse(readFileSync(at(metricsKey(id, 0)), 'utf8')) as { steps: { loss: number }[] })
    .steps;
  const rewardsDir = at(`${campaignPrefix(id)}/rewards`);
  const reward = readdirSync(rewardsDir)
    .sort()
    .map((iteration) => {
      const samples = readdirSync(join(rewardsDir, iteration)).flatMap((f) =>
        readFileSync(join(rewardsDir, iteration, f), 'utf8')
          .trim()
          .split('\n')
          .map((l) => (JSON.parse(l) as { reward: number }).reward),
      );
      return round(mean(samples));
    });
  const validationDir = at(`${campaignPrefix(id)}/validation`);
  const validation = readdirSync(validationDir)
    .sort()
    .map((iteration) => {
      const v = JSON.parse(readFileSync(at(validationScoresKey(id, Number(iteration))), 'utf8')) as {
        iteration: number;
        meanReward: number;
        passAtK: number;
      };
      return { iteration: v.iteration, meanReward: round(v.meanReward), passAtK: round(v.passAtK) };
    });
  return {
    seed,
    campaign: id,
    status: result.status,
    wall_s: round(wallS),
    sft_loss_first: round(sft[0]!.loss),
    sft_loss_last: round(sft.at(-1)!.loss),
    reward_per_iteration: reward,
    validation,
  };
}

const runs = (values.seeds as string).split(',').map((s) => measure(Number(s)));
for (const r of runs) console.log(JSON.stringify(r));
const first = <T>(xs: T[]) => xs[0]!;
const last = <T>(xs: T[]) => xs.at(-1)!;
console.log(
  JSON.stringify({
    seeds: runs.length,
    median_reward_first: median(runs.map((r) => first(r.reward_per_iteration))),
    median_reward_last: median(runs.map((r) => last(r.reward_per_iteration))),
    median_validation_first: median(runs.map((r) => first(r.validation).meanReward)),
    median_validation_last: median(runs.map((r) => last(r.validation).meanReward)),
    median_pass_at_k_first: median(runs.map((r) => first(r.validation).passAtK)),
    median_pass_at_k_last: median(runs.map((r) => last(r.validation).passAtK)),
    median_wall_s: median(runs.map((r) => r.wall_s)),
  }),
);
