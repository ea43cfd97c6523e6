// `moerl fork <id> --from-iteration N`: a new campaign starting from a committed checkpoint of
// another one, with the source's spec, the hyperparameters it trained on from that checkpoint
// (its `moerl set` changes up to then), plus overrides.
import { taskQueuesFrom } from '../../workers/temporal-options.js';
import { parseCampaignSpec } from '../../workflows/spec.js';
import {
  forkHyperparameters,
  forkPromptSchedule,
  promptSchedule as parentSchedule,
} from '../../workflows/state.js';
import { campaignInput, describeCampaign, queryState } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { CliError, UsageError } from '../errors.js';
import { keyValues } from '../format.js';
import { applyOverrides, parseOverride } from '../spec-file.js';
import { describeStarted, startCampaign } from './start.js';

export const forkCommand: Command = {
  name: 'fork',
  summary: 'start a new campaign from a committed checkpoint of another',
  usage: 'fork <campaign-id> --from-iteration N [--set key=value]... [--id ID]',
  options: {
    'from-iteration': { type: 'string' },
    set: { type: 'string', multiple: true },
    id: { type: 'string' },
  },
  optionHelp: {
    '--from-iteration N': 'the checkpoint to start from (one the source still retains; see status)',
    '--set key=value': "override a field of the source's spec (dotted path, repeatable)",
    '--id ID': 'id of the new campaign (default: <name>-<6 random characters>)',
  },
  details: 'example: moerl fork demo-k3j9x2 --from-iteration 12 --set hyperparameters.lr=0.0001',
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const text = ctx.string('from-iteration');
    if (text === undefined) throw new UsageError('fork needs --from-iteration N');
    const iteration = Number(text);
    if (!Number.isInteger(iteration) || iteration < 0)
      throw new UsageError(`--from-iteration must be an iteration number ≥ 0, got "${text}"`);
    const overrides = ctx.strings('set').map(parseOverride);
    const sourceId = ctx.positionals[0] as string;

    const client = await ctx.client();
    const { handle } = await describeCampaign(client, sourceId);
    const state = await queryState(client, handle);
    const checkpoint = state.checkpoints.find((c) => c.iteration === iteration);
    if (!checkpoint) {
      const retained = state.checkpoints.map((c) => c.iteration).join(', ') || 'none';
      throw new CliError(
        `campaign ${sourceId} does not retain a committed checkpoint of iteration ${iteration} (retained: ${retained})`,
      );
    }
    const source = await campaignInput(client, sourceId);
    const carried = state.hyperparameterChanges.filter((c) => c.iteration <= iteration + 1);
    const parentSpec = {
      ...source.spec,
      hyperparameters: forkHyperparameters(source.spec, state.hyperparameterChanges, iteration),
    };
    const spec = parseCampaignSpec(
      applyOverrides(parentSpec, overrides),
      `spec of ${sourceId} with its set changes to iteration ${iteration + 1} and --set overrides`,
    );
    // The fork draws the prompts its parent's next iteration did, and on from there.
    const changed = spec.promptsPerIteration !== source.spec.promptsPerIteration;
    const promptSchedule = forkPromptSchedule(
      parentSchedule(state, source.spec),
      iteration,
      changed ? spec.promptsPerIteration : undefined,
    );
    const id = ctx.string('id');
    const started = await startCampaign(client, {
      spec,
      taskQueues: taskQueuesFrom(ctx.io.env),
      forkFrom: checkpoint,
      promptSchedule,
      ...(id === undefined ? {} : { id }),
    });
    const carriedText = carried.map((c) => `${keyValues(c.changes)} (from iteration ${c.iteration})`);
    ctx.print({ ...started, forkFrom: checkpoint, carriedChanges: carried }, () =>
      [
        describeStarted(started, `forked ${sourceId} at iteration ${iteration} (${checkpoint.key}) into`),
        ...(carried.length > 0 ? [`  carries ${sourceId}'s set changes: ${carriedText.join('; ')}`] : []),
      ].join('\n'),
    );
  },
};
