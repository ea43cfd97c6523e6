// The turn journal of a chunk of episodes (docs/agents.md, "Durable episodes"): each policy turn,
// each call's intent and each call's outcome is in the store before the episode goes on, so a
// chunk done again after its worker was lost reads them back instead of generating or calling
// again, and goes on live from the first turn not journaled.
//
// The store has no append: the journal is a series of small objects (segments) under the chunk's
// key, `<chunk key>.journal/<writer>-<segment>-a<attempt>.jsonl`, each holding the entries
// written while the one before it was being stored (group commit: one PUT for every episode
// waiting), each ending with the SHA-256 of its lines. Each attempt that opens the journal is
// its next writer, so segments sort in the order they were written. The journal is removed once
// its chunk is stored whole; one left by a worker lost between the two is never read again (its
// chunk is whole) and stays beside it, a few kilobytes.
import { createHash } from 'node:crypto';
import type { ObjectStore } from '../store/types.js';
import type { EpisodeJournal, EpisodeJournalEntry, JournaledPolicyTurn, ToolCallRecord } from './episode.js';

/** A line of a segment: one entry of one episode of the chunk. */
interface JournalLine {
  /** The episode: `<prompt_id>/<sample_index>`. */
  episode: string;
  entry: EpisodeJournalEntry;
}

/** Where a chunk's journal lives. */
export const chunkJournalPrefix = (chunkKey: string) => `${chunkKey}.journal/`;

const pad = (n: number) => String(n).padStart(6, '0');
const segmentName = (writer: number, segment: number, attempt: number) =>
  `${pad(writer)}-${pad(segment)}-a${attempt}.jsonl`;
const writerOf = (key: string) => Number(/(\d+)-\d+-a\d+\.jsonl$/.exec(key)?.[1] ?? 0);

function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** A segment's text: its lines, then the SHA-256 of those lines. */
export function segmentText(lines: readonly JournalLine[]): string {
  const body = lines.map((l) => JSON.stringify(l) + '\n').join('');
  return `${body}${JSON.stringify({ sha256: sha256(body) })}\n`;
}

/** The lines of a segment, or why it cannot be read (cut short, changed, not a journal). */
export function parseSegment(text: string): JournalLine[] | string {
  const trailerAt = text.lastIndexOf('\n', text.length - 2) + 1;
  const body = text.slice(0, trailerAt);
  let trailer: unknown;
  try {
    trailer = JSON.parse(text.slice(trailerAt));
  } catch {
    return 'its last line is not its checksum';
  }
  if ((trailer as { sha256?: unknown })?.sha256 !== sha256(body))
    return 'its checksum does not match its lines';
  return body
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as JournalLine);
}

/** One episode's entries, indexed by what the episode asks of them. */
class EpisodeEntries implements EpisodeJournal {
  elapsedMs = 0;
  private readonly policy = new Map<number, JournaledPolicyTurn>();
  private readonly calls = new Map<string, { outcome?: ToolCallRecord }>();

  constructor(private readonly append: (entry: EpisodeJournalEntry) => Promise<void>) {}

  /** Takes an entry read back or written; the first entry of a turn or a call is the one kept. */
  take(entry: EpisodeJournalEntry): void {
    this.elapsedMs = Math.max(this.elapsedMs, entry.elapsedMs);
    if (entry.kind === 'policy') {
      if (!this.policy.has(entry.turn))
        this.policy.set(entry.turn, {
          tokens: entry.tokens,
          logprobs: entry.logprobs,
          stopped: entry.stopped,
          latencyMs: entry.latencyMs,
        });
      return;
    }
    const key = `${entry.turn}/${entry.call}`;
    const call = this.calls.get(key) ?? {};
    if (entry.kind === 'outcome') call.outcome ??= entry.outcome;
    this.calls.set(key, call);
  }

  policyTurn(turn: number): JournaledPolicyTurn | undefined {
    return this.policy.get(turn);
  }

  call(turn: number, call: number) {
    const journaled = this.calls.get(`${turn}/${call}`);
    if (!journaled) return undefined;
    return journaled.outcome ? { outcome: journaled.outcome } : ({ intent: true } as const);
  }

  write(entry: EpisodeJournalEntry): Promise<void> {
    this.take(entry);
    return this.append(entry);
  }
}

export interface ChunkJournalStats {
  /** Entries read back from earlier attempts. */
  replayed: number;
  /** Segments that could not be read: the entries from the first of them on were not replayed. */
  unreadable: string[];
}

export class ChunkJournal {
  private readonly episodes = new Map<string, EpisodeEntries>();
  private queued: { line: JournalLine; done: () => void; failed: (err: Error) => void }[] = [];
  private storing: Promise<void> | null = null;
  private segment = 0;

  private constructor(
    private readonly store: ObjectStore,
    private readonly prefix: string,
    private readonly writer: number,
    private readonly attempt: number,
    readonly stats: ChunkJournalStats,
  ) {}

  /**
   * The journal of the chunk stored at `chunkKey`, with what earlier attempts wrote; `attempt`
   * (the activity's) names this writer's segments. A segment that cannot be read ends the replay
   * there: the entries after it may depend on it.
   */
  static async open(store: ObjectStore, chunkKey: string, attempt: number): Promise<ChunkJournal> {
    const prefix = chunkJournalPrefix(chunkKey);
    const keys: string[] = [];
    for await (const obj of store.list(prefix)) keys.push(obj.key);
    keys.sort();
    const writer = Math.max(0, ...keys.map(writerOf)) + 1;
    const journal = new ChunkJournal(store, prefix, writer, attempt, { replayed: 0, unreadable: [] });
    for (const key of keys) {
      const lines = parseSegment((await store.get(key)).toString('utf8'));
      if (typeof lines === 'string') {
        journal.stats.unreadable.push(`${key}: ${lines}`);
        break;
      }
      for (const { episode, entry } of lines) journal.entries(episode).take(entry);
      journal.stats.replayed += lines.length;
    }
    return journal;
  }

  private entries(episode: string): EpisodeEntries {
    let entries = this.episodes.get(episode);
    if (!entries) {
      entries = new EpisodeEntries((entry) => this.enqueue({ episode, entry }));
      this.episodes.set(episode, entries);
    }
    return entries;
  }

  /** The journal of the chunk's episode of prompt `promptId`, sample `sample`. */
  episode(promptId: number, sample: number): EpisodeJournal {
    return this.entries(`${promptId}/${sample}`);
  }

  private enqueue(line: JournalLine): Promise<void> {
    return new Promise<void>((done, failed) => {
      this.queued.push({ line, done, failed });
      this.storing ??= this.storeQueued();
    });
  }

  /** Stores what is queued as one segment, then what was queued meanwhile, until none is. */
  private async storeQueued(): Promise<void> {
    while (this.queued.length > 0) {
      const batch = this.queued;
      this.queued = [];
      const key = `${this.prefix}${segmentName(this.writer, this.segment++, this.attempt)}`;
      try {
        await this.store.put(key, segmentText(batch.map((q) => q.line)));
        for (const q of batch) q.done();
      } catch (err) {
        for (const q of batch) q.failed(err as Error);
      }
    }
    this.storing = null;
  }

  /** Removes the journal: its chunk is stored whole. */
  async remove(): Promise<void> {
    await this.storing;
    await this.store.deletePrefix(this.prefix);
  }
}
