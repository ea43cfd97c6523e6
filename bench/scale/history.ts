// Reads a campaign's whole chain of runs back from the server and measures, from the events:
// events and encoded bytes per run, the largest payload (and where it was), decision latency
// (WorkflowTaskScheduled → Completed) and activity schedule-to-start (ActivityTaskScheduled →
// Started) per iteration, and the most activities pending at once.
import type { Client } from '@temporalio/client';
import proto from '@temporalio/proto';

const { temporal } = proto;

type HistoryEvent = proto.temporal.api.history.v1.IHistoryEvent;

export interface RunFigures {
  runId: string;
  events: number;
  bytes: number;
}

export interface CampaignHistory {
  runs: RunFigures[];
  events: number;
  largestPayload: { bytes: number; event: string; activity?: string };
  maxPendingActivities: number;
  /** Decision latencies (ms) with the iteration each belongs to (committed iterations + 1). */
  decisions: { iteration: number; scheduledToCompleted: number; startedToCompleted: number }[];
  /** Schedule-to-start (ms) of every activity with its type and the iteration of its input. */
  activityStarts: { iteration: number; type: string; ms: number }[];
}

const millis = (t: HistoryEvent['eventTime']) =>
  t ? Number(t.seconds ?? 0) * 1000 + (t.nanos ?? 0) / 1e6 : Number.NaN;

/** Every payload below `value` (objects with a `data` byte array and `metadata`). */
function* payloads(value: unknown): Generator<Uint8Array> {
  if (value === null || typeof value !== 'object' || value instanceof Uint8Array) return;
  const o = value as Record<string, unknown>;
  if (o.data instanceof Uint8Array && 'metadata' in o) {
    yield o.data;
    return;
  }
  for (const v of Array.isArray(value) ? value : Object.values(o)) yield* payloads(v);
}

/** The iteration an activity works on, from its JSON input. */
function inputIteration(event: proto.temporal.api.history.v1.IActivityTaskScheduledEventAttributes): number {
  const data = event.input?.payloads?.[0]?.data;
  if (!data) return Number.NaN;
  const input = JSON.parse(Buffer.from(data).toString('utf8')) as {
    iteration?: number;
    staged?: { iteration: number };
    source?: { kind: string };
  };
  return input.iteration ?? input.staged?.iteration ?? 0;
}

export async function campaignHistory(client: Client, workflowId: string): Promise<CampaignHistory> {
  const listed = [];
  for await (const run of client.workflow.list({ query: `WorkflowId = '${workflowId}'` })) listed.push(run);
  listed.sort((a, b) => a.startTime.getTime() - b.startTime.getTime());

  const out: CampaignHistory = {
    runs: [],
    events: 0,
    largestPayload: { bytes: 0, event: '' },
    maxPendingActivities: 0,
    decisions: [],
    activityStarts: [],
  };
  let committed = 0;
  for (const run of listed) {
    const history = await client.workflow.getHandle(workflowId, run.runId).fetchHistory();
    const events = history.events ?? [];
    const bytes = temporal.api.history.v1.History.encode(history).finish().length;
    out.runs.push({ runId: run.runId, events: events.length, bytes });
    out.events += events.length;

    const activities = new Map<number, { type: string; iteration: number; at: number }>();
    const tasks = new Map<number, { scheduled: number; started?: number }>();
    let pending = 0;
    for (const e of events) {
      const at = millis(e.eventTime);
      const type = temporal.api.enums.v1.EventType[e.eventType ?? 0] ?? String(e.eventType);
      for (const p of payloads(e))
        if (p.length > out.largestPayload.bytes) {
          const activity = e.activityTaskScheduledEventAttributes?.activityType?.name ?? undefined;
          out.largestPayload = { bytes: p.length, event: type, ...(activity ? { activity } : {}) };
        }
      const id = Number(e.eventId);
      if (e.workflowTaskScheduledEventAttributes) tasks.set(id, { scheduled: at });
      const wts = e.workflowTaskStartedEventAttributes;
      if (wts) {
        const t = tasks.get(Number(wts.scheduledEventId));
        if (t) t.started = at;
      }
      const wtc = e.workflowTaskCompletedEventAttributes;
      if (wtc) {
        const t = tasks.get(Number(wtc.scheduledEventId));
        if (t)
          out.decisions.push({
            iteration: committed + 1,
            scheduledToCompleted: at - t.scheduled,
            startedToCompleted: at - (t.started ?? t.scheduled),
          });
      }
      const sch = e.activityTaskScheduledEventAttributes;
      if (sch) {
        activities.set(id, { type: sch.activityType?.name ?? '?', iteration: inputIteration(sch), at });
        out.maxPendingActivities = Math.max(out.maxPendingActivities, ++pending);
      }
      const ats = e.activityTaskStartedEventAttributes;
      if (ats) {
        const a = activities.get(Number(ats.scheduledEventId));
        if (a) out.activityStarts.push({ iteration: a.iteration, type: a.type, ms: at - a.at });
      }
      const closed =
        e.activityTaskCompletedEventAttributes ??
        e.activityTaskFailedEventAttributes ??
        e.activityTaskTimedOutEventAttributes ??
        e.activityTaskCanceledEventAttributes;
      if (closed) {
        pending--;
        const a = activities.get(Number(closed.scheduledEventId));
        if (e.activityTaskCompletedEventAttributes && a?.type === 'commitCheckpoint')
          committed = Math.max(committed, a.iteration);
      }
    }
  }
  return out;
}

export function percentile(xs: readonly number[], q: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

/** p50 and p95, rounded to 0.1 ms. */
export function p50p95(xs: readonly number[]): { p50: number; p95: number; n: number } {
  const r = (x: number) => Math.round(x * 10) / 10;
  return { p50: r(percentile(xs, 0.5)), p95: r(percentile(xs, 0.95)), n: xs.length };
}
