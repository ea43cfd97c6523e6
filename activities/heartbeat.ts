// Heartbeats on a timer for an activity's whole life. A heartbeat sent only between units of
// work starves whenever one unit (a download, a chunk, an HTTP call) outlasts the heartbeat
// timeout: the server then kills a healthy attempt and retries it, possibly without end.
import { Context } from '@temporalio/activity';

/** Heartbeats `details()` now and then on a timer until the returned function is called. */
export function heartbeatUntilStopped(details: () => unknown): () => void {
  const ctx = Context.current();
  const timeoutMs = ctx.info.heartbeatTimeoutMs || 30_000;
  // Several beats per timeout; the SDK throttles what it sends to the server anyway.
  const everyMs = Math.max(100, Math.min(timeoutMs / 4, 10_000));
  const beat = () => ctx.heartbeat(details());
  beat();
  const timer = setInterval(beat, everyMs);
  return () => clearInterval(timer);
}

/** Runs `fn` while heartbeating `details()` on a timer. */
export async function withHeartbeat<T>(details: () => unknown, fn: () => Promise<T>): Promise<T> {
  const stop = heartbeatUntilStopped(details);
  try {
    return await fn();
  } finally {
    stop();
  }
}
