// What a chunk's, a shard's and an iteration's episodes did: counts of turns, end reasons, tool
// calls and errors, and the time spent on tools and on generating. Pure (the workflow adds the
// shards' up for the iteration's summary; the workers' metrics count them).
import type { EpisodeStats } from '../types.js';
import type { EpisodeRecord } from './episode.js';

/** The stats of episode records; `into` (another chunk's, say) is added to and returned. */
export function episodeStats(
  records: readonly EpisodeRecord[],
  into: EpisodeStats = emptyEpisodeStats(),
): EpisodeStats {
  const count = (map: Record<string, number>, key: string, n = 1) => (map[key] = (map[key] ?? 0) + n);
  for (const r of records) {
    into.episodes++;
    count(into.endReasons, r.end_reason);
    for (const turn of r.turns) {
      if (turn.role === 'policy') {
        into.policyTurns++;
        into.generationSeconds += (turn.latencyMs ?? 0) / 1000;
        continue;
      }
      for (const c of turn.calls) {
        count(into.toolCalls, c.error === 'unknown-tool' ? '(unknown)' : c.name || '(unnamed)');
        if (c.error) count(into.toolErrors, c.error);
        into.toolSeconds += c.latencyMs / 1000;
      }
    }
  }
  return into;
}

export function emptyEpisodeStats(): EpisodeStats {
  return {
    episodes: 0,
    policyTurns: 0,
    endReasons: {},
    toolCalls: {},
    toolErrors: {},
    toolSeconds: 0,
    generationSeconds: 0,
  };
}

/** Adds `more` into `into` (an iteration's shards, say) and returns it. */
export function addEpisodeStats(into: EpisodeStats, more: EpisodeStats): EpisodeStats {
  const add = (a: Record<string, number>, b: Record<string, number>) => {
    for (const [k, n] of Object.entries(b)) a[k] = (a[k] ?? 0) + n;
  };
  into.episodes += more.episodes;
  into.policyTurns += more.policyTurns;
  add(into.endReasons, more.endReasons);
  add(into.toolCalls, more.toolCalls);
  add(into.toolErrors, more.toolErrors);
  into.toolSeconds += more.toolSeconds;
  into.generationSeconds += more.generationSeconds;
  return into;
}

/** One line on a chunk's episodes for the worker's log: turns, end reasons, calls, errors, times. */
export function describeEpisodes(stats: EpisodeStats): string {
  const perEpisode = stats.episodes ? (stats.policyTurns / stats.episodes).toFixed(2) : '0';
  return (
    `${stats.episodes} episodes, ${perEpisode} policy turns each, ended ${JSON.stringify(stats.endReasons)}, ` +
    `calls ${JSON.stringify(stats.toolCalls)}, errors ${JSON.stringify(stats.toolErrors)}, ` +
    `tool time ${stats.toolSeconds.toFixed(2)} s, generation ${stats.generationSeconds.toFixed(2)} s`
  );
}
