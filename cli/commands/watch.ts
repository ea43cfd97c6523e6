// `moerl watch <id>`: the demo's live progress for any campaign, until it ends. The exit code
// says how it ended, so a script can wait on a campaign with `moerl watch <id> >/dev/null`.
import { printable } from '../../activities/printable.js';
import type { Command, CommandContext } from '../command.js';
import { UsageError } from '../errors.js';
import { decimal } from '../format.js';
import { followCampaign, iterationLine, progressLine } from '../progress.js';
import type { FollowResult } from '../progress.js';

/** Exit codes by how the workflow ended; anything else that ends it (failed, terminated, timed out) is 4. */
export const watchExitCodes = { completed: 0, cancelled: 3, otherwise: 4 } as const;

function intervalMs(value: string | undefined): number {
  if (value === undefined) return 1000;
  const s = Number(value);
  if (!Number.isFinite(s) || s < 0.1 || s > 3600)
    throw new UsageError(`--interval: got "${value}"; seconds between polls, from 0.1 to 3600`);
  return s * 1000;
}

/** The last line: how the campaign ended (or that watching stopped) and what it committed. */
export function outcomeLine(id: string, result: FollowResult): string {
  const state = result.state;
  const last = state?.recentIterations.at(-1);
  // Without a state (the status query never answered) there is nothing to count.
  const committed = state
    ? ` (${Math.max(0, state.committedIteration)} iterations committed` +
      (last ? `, mean reward ${decimal(last.meanReward)} at iteration ${last.iteration})` : ')')
    : '';
  return printable(`campaign ${id} ${result.outcome ?? 'still running (watch stopped)'}${committed}`);
}

export const watchCommand: Command = {
  name: 'watch',
  summary: 'follow a campaign live (iterations, stage in flight and its attempt, reward, ETA) until it ends',
  usage: 'watch <campaign-id> [--interval SECONDS]',
  options: { interval: { type: 'string' } },
  optionHelp: { '--interval SECONDS': 'time between polls (default 1)' },
  details: `Prints a line per finished iteration and a live line: iteration bar, stages in flight with the
server's attempt, last reward and rollout tokens/s, ETA; a paused campaign shows its reason and is
still watched. Ends when the campaign's workflow ends (continue-as-new runs are followed). Exit
code: 0 completed, 3 cancelled, 4 failed, terminated or timed out, 1 no such campaign or no
server. With --json, one JSON object per line on stdout for every change (fields: campaignId,
status, execution, pauseReason, committedIteration, totalIterations, inFlight, last, etaSeconds).`,
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const id = ctx.positionals[0] as string;
    const interval = intervalMs(ctx.string('interval'));
    const client = await ctx.client();
    const out = ctx.io.stdout;
    // On a terminal the live line is redrawn in place; in a pipe or file each change is a line.
    const tty = (out as { isTTY?: boolean }).isTTY === true;
    let live = '';
    const clearLive = () => {
      if (tty && live) out.write('\r\x1b[K');
    };
    const result = await followCampaign(client, id, {
      intervalMs: interval,
      ...(ctx.io.signal ? { signal: ctx.io.signal } : {}),
      onQueryError: (message) =>
        ctx.note(`moerl watch: status query failed (retrying): ${printable(message)}`),
      onChange({ snapshot, newIterations }) {
        if (ctx.json) {
          out.write(`${JSON.stringify(snapshot)}\n`);
          return;
        }
        clearLive();
        const total = snapshot.totalIterations ?? 0;
        for (const it of newIterations) out.write(`${iterationLine(it, total)}\n`);
        const line = progressLine(snapshot);
        if (tty) out.write(line);
        else if (line !== live) out.write(`${line}\n`);
        live = line;
      },
    });
    if (tty && live) out.write('\n');
    if (!ctx.json) out.write(`${outcomeLine(id, result)}\n`);
    if (result.outcome === null) return 1;
    if (result.execution === 'completed') return watchExitCodes.completed;
    if (result.execution === 'cancelled') return watchExitCodes.cancelled;
    return watchExitCodes.otherwise;
  },
};
