// `moerl demo`: the whole product on one machine. Starts the dev server and an all-role worker,
// runs the demo campaign (examples/demo.yaml: init → SFT warm start → GRPO iterations with 2 EP
// ranks and 2 rollout shards) with live progress, then prints a summary and stops everything.
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { taskQueuesFrom } from '../../workers/temporal-options.js';
import type { StageName } from '../../workflows/types.js';
import type { Command, CommandContext } from '../command.js';
import { connectClient } from '../../workers/temporal-options.js';
import { decimal, seconds, table } from '../format.js';
import { stopOnSignals, withLocalStack } from '../local-stack.js';
import { followCampaign, inFlightText, iterationLine, iterationStages as stages } from '../progress.js';
import { loadSpecFile, parseOverride } from '../spec-file.js';
import { startCampaign } from './start.js';

export const demoSpecPath = fileURLToPath(new URL('../../../examples/demo.yaml', import.meta.url));

const pollMs = 500;

export const demoCommand: Command = {
  name: 'demo',
  summary: 'run the demo campaign end to end on this machine (dev server + worker included)',
  usage: 'demo [--spec FILE] [--set key=value]... [--state-dir DIR]',
  options: {
    spec: { type: 'string' },
    set: { type: 'string', multiple: true },
    'state-dir': { type: 'string' },
  },
  optionHelp: {
    '--spec FILE': 'run this campaign spec instead of examples/demo.yaml (e.g. examples/hf-arith/spec.yaml)',
    '--set key=value': 'override a field of the spec (repeatable), e.g. --set iterations=5',
    '--state-dir DIR': 'where the dev server keeps its database and log (default .moerl/demo)',
  },
  details: `Needs the native tools (npm run setup builds them). Reward is the exact-match rate of the
sampled answers; it rises as GRPO trains the policy. With --json the last line is one JSON object:
campaign_id, iterations, reward_first, reward_last, validation_first, validation_last (null
without a validation file), wall_s, stage_seconds.`,
  positionals: { min: 0, max: 0 },
  async run(ctx: CommandContext) {
    const spec = loadSpecFile(ctx.string('spec') ?? demoSpecPath, ctx.strings('set').map(parseOverride));
    const stateDir = resolve(ctx.string('state-dir') ?? join('.moerl', 'demo'));
    mkdirSync(stateDir, { recursive: true });
    const stop = new AbortController();
    const removeSignalHandlers = stopOnSignals(stop, 'demo', (line) => ctx.note(line));
    const say = (line: string) => (ctx.json ? ctx.note(line) : ctx.io.stdout.write(`${line}\n`));
    const started = Date.now();
    try {
      return await withLocalStack(
        {
          stateDir,
          namespace: 'default',
          taskQueues: taskQueuesFrom(ctx.io.env),
          shutdownGraceMs: 5000,
          stop,
        },
        async ({ server }) => {
          say(`moerl demo: Temporal UI ${server.uiUrl} (state in ${stateDir})`);
          const { client, connection } = await connectClient({
            address: server.address,
            namespace: 'default',
          });
          try {
            const campaign = await startCampaign(client, { spec, taskQueues: taskQueuesFrom(ctx.io.env) });
            say(
              `campaign ${campaign.campaignId}: ${spec.iterations} GRPO iterations of ${spec.promptsPerIteration} prompts × ${spec.groupSize} samples, ${spec.epWorldSize} EP ranks, ${spec.rolloutShards} rollout shards`,
            );
            let prepareSeconds: number | null = null;
            let lastLine = '';
            const followed = await followCampaign(client, campaign.campaignId, {
              intervalMs: pollMs,
              signal: stop.signal,
              onChange({ snapshot, state, newIterations }) {
                if (prepareSeconds === null && state.committedIteration >= 0)
                  prepareSeconds = (Date.now() - started) / 1000;
                for (const it of newIterations) say(iterationLine(it, spec.iterations));
                const line = inFlightText(snapshot);
                if (line && line !== lastLine) ctx.note(`  … ${line}`);
                lastLine = line;
              },
              // A stage that failed for good waits for an operator: the demo reports it instead.
              stopWhen: (state) =>
                state.status === 'paused' && state.lastFailure?.nonRetryable
                  ? `paused: ${state.pauseReason}`
                  : null,
            });
            const { outcome, state, iterations } = followed;
            const wallS = (Date.now() - started) / 1000;
            const stageSeconds = Object.fromEntries(
              stages.map((s) => [s, iterations.reduce((sum, it) => sum + (it.stageSeconds[s] ?? 0), 0)]),
            ) as Record<StageName, number>;
            const first = iterations[0]?.meanReward ?? null;
            const last = iterations.at(-1)?.meanReward ?? null;
            const checkpoint = state?.latestCheckpoint;
            const storeRoot =
              spec.store.kind === 'fs'
                ? resolve(spec.store.path)
                : `s3://${spec.store.bucket}/${spec.store.prefix}`;
            say('');
            say(`campaign ${campaign.campaignId} ${outcome ?? 'interrupted'} in ${seconds(wallS)}`);
            say(
              `reward     ${decimal(first)} (iteration 1) → ${decimal(last)} (iteration ${iterations.at(-1)?.iteration ?? '-'})`,
            );
            // A dataset with a validation file: its held-out score, first and last checkpoint scored.
            const validations = state?.validations ?? [];
            const [firstV, lastV] = [validations[0], validations.at(-1)];
            if (firstV && lastV)
              say(
                `validation ${decimal(firstV.meanReward)} (iteration ${firstV.iteration}) → ${decimal(lastV.meanReward)} (iteration ${lastV.iteration}), pass@${lastV.k} ${decimal(firstV.passAtK)} → ${decimal(lastV.passAtK)}`,
              );
            say(
              table(
                ['stage', 'total', 'per iteration'],
                [
                  ['prepare (init + SFT)', seconds(prepareSeconds), '-'],
                  ...stages.map((s) => [
                    s,
                    seconds(stageSeconds[s]),
                    seconds(stageSeconds[s] / Math.max(1, iterations.length)),
                  ]),
                ],
                new Set([1, 2]),
              ),
            );
            say(
              `checkpoint ${checkpoint ? `${storeRoot}/${checkpoint.key} (iteration ${checkpoint.iteration})` : '-'}`,
            );
            say(
              `history    npx moerl dev --state-dir ${stateDir}, then open its web UI or run npx moerl history ${campaign.campaignId}`,
            );
            say(
              `report     with that dev server running: npx moerl report ${campaign.campaignId} (writes .moerl/reports/${campaign.campaignId}/report.html)`,
            );
            if (ctx.json)
              ctx.io.stdout.write(
                `${JSON.stringify({
                  campaign_id: campaign.campaignId,
                  status: outcome,
                  iterations: iterations.length,
                  reward_first: first,
                  reward_last: last,
                  validation_first: firstV?.meanReward ?? null,
                  validation_last: lastV?.meanReward ?? null,
                  wall_s: wallS,
                  stage_seconds: { ...stageSeconds, prepare: prepareSeconds },
                })}\n`,
              );
            return outcome === 'completed' ? 0 : 1;
          } finally {
            await connection.close();
          }
        },
      );
    } finally {
      removeSignalHandlers();
    }
  },
};
