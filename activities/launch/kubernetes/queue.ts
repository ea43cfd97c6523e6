// A trainer Job under a cluster queue (Kueue, `launcher.queueName`): it is created suspended
// and waits there until the queue admits it by unsuspending it. Kueue suspends an admitted Job
// again when it preempts it (its pods are removed, none counts as failed); that is one more
// wait, not a failure. QueueClock keeps a Job's queued and running time apart, starting from
// the Job's own timestamps, so a launcher that adopts a Job (a retry on another worker) keeps
// the wait that came before it.
import type { V1Job } from '@kubernetes/client-node';
import { jobCondition, timeMs } from './failures.js';

/** The Job waits for admission: suspended and not finished. */
export function isQueued(job: V1Job): boolean {
  return job.spec?.suspend === true && !finishedCondition(job);
}

function finishedCondition(job: V1Job) {
  return jobCondition(job, 'Complete') ?? jobCondition(job, 'Failed');
}

/** Seconds a Job has waited for admission, and has run since it was admitted. */
export interface QueueTimes {
  queueWaitSeconds: number;
  runSeconds: number;
}

export class QueueClock {
  private queuedMs = 0;
  private runMs = 0;
  /** The state the Job is in now, and since when. */
  private current: { queued: boolean; since: number } | null = null;
  private ended = false;

  /** Takes in the Job as a watch delivered it. */
  observe(job: V1Job, now = Date.now()): void {
    if (this.ended) return;
    const queued = isQueued(job);
    if (this.current === null) this.current = this.first(job, queued, now);
    else if (this.current.queued !== queued) {
      this.close(now);
      this.current = { queued, since: now };
    }
    const finished = finishedCondition(job);
    if (finished) {
      const at = timeMs(job.status?.completionTime) || timeMs(finished.lastTransitionTime) || now;
      this.close(Math.max(at, this.current.since));
      this.ended = true;
    }
  }

  times(now = Date.now()): QueueTimes {
    let queued = this.queuedMs;
    let run = this.runMs;
    if (this.current && !this.ended) {
      const open = Math.max(0, now - this.current.since);
      if (this.current.queued) queued += open;
      else run += open;
    }
    return { queueWaitSeconds: Math.round(queued / 1000), runSeconds: Math.round(run / 1000) };
  }

  private close(at: number): void {
    if (!this.current) return;
    const span = Math.max(0, at - this.current.since);
    if (this.current.queued) this.queuedMs += span;
    else this.runMs += span;
    this.current.since = at;
  }

  /**
   * The state of a Job seen for the first time (created now, or adopted): queued since it was
   * last suspended (its Suspended condition) or created; running since its startTime, which the
   * Job controller resets at every admission, after a wait from its creation if it was ever
   * suspended. Segments before a preemption that came before adoption are not in the object:
   * a re-admitted Job counts its earlier run as waiting, a re-queued one only its latest wait.
   */
  private first(job: V1Job, queued: boolean, now: number): { queued: boolean; since: number } {
    const created = Math.min(timeMs(job.metadata?.creationTimestamp) || now, now);
    const suspended = job.status?.conditions?.find((c) => c.type === 'Suspended');
    if (queued) {
      const since = suspended?.status === 'True' ? timeMs(suspended.lastTransitionTime) || created : created;
      return { queued, since: Math.min(since, now) };
    }
    const started = Math.min(timeMs(job.status?.startTime) || now, now);
    if (suspended) this.queuedMs = Math.max(0, started - created);
    return { queued, since: started };
  }
}
