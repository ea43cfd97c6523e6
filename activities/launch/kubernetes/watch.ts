// A list + watch of one kind of object in one namespace, kept in a local cache: the launcher's
// informer. It survives dropped connections and API server restarts: a watch that ends is
// resumed from the last resourceVersion seen, one the server no longer has (410 Gone) is
// replaced by a fresh list, and any failure is retried with exponential backoff. A watch with
// no event (not even a bookmark) for a while is treated as lost, so a silently dead connection
// is replaced too.
import { Watch } from '@kubernetes/client-node';
import type { KubeConfig, KubernetesObject } from '@kubernetes/client-node';
import type { ApplicationFailure } from '@temporalio/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { kubernetesFailure } from './errors.js';
import type { ApiCall } from './errors.js';

/** The server ends each watch after this long (it sends a bookmark about every minute). */
const watchTimeoutSeconds = 240;
/** A watch that has said nothing for this long is abandoned and re-established. */
const silenceMs = (watchTimeoutSeconds + 30) * 1000;
const backoffStartMs = 500;
const backoffMaxMs = 30_000;

export interface ListWatchOptions<T extends KubernetesObject> {
  kubeConfig: KubeConfig;
  /** The collection's path, e.g. /api/v1/namespaces/<ns>/pods. */
  path: string;
  /** labelSelector / fieldSelector of both the list and the watch. */
  selector: { labelSelector?: string; fieldSelector?: string };
  list: () => Promise<{ items: T[]; metadata?: { resourceVersion?: string } }>;
  /** For error messages. */
  call: ApiCall;
  /** After every change of the cache (and after every list). */
  onChange: () => void;
  /** A failure retrying cannot fix (credentials, RBAC); the watch has stopped. */
  onFatal: (failure: ApplicationFailure) => void;
}

export class ListWatch<T extends KubernetesObject> {
  /** The objects, by uid. */
  readonly objects = new Map<string, T>();
  /** True once the first list has filled the cache. */
  synced = false;
  private stopped = false;
  private abandonCurrent: (() => void) | null = null;
  private readonly stopSignal = new AbortController();

  constructor(private readonly opts: ListWatchOptions<T>) {}

  start(): void {
    void this.run();
  }

  stop(): void {
    this.stopped = true;
    this.stopSignal.abort();
    this.abandonCurrent?.();
  }

  private async run(): Promise<void> {
    let backoffMs = backoffStartMs;
    while (!this.stopped) {
      try {
        let version = await this.relist();
        backoffMs = backoffStartMs;
        for (;;) {
          const started = Date.now();
          const result = await this.watchOnce(version);
          if (this.stopped) return;
          if (result.expired) break;
          version = result.version;
          // A server that ends watches at once must not turn this into a busy loop.
          if (!result.events && Date.now() - started < 1000) {
            await this.pause(backoffMs);
            backoffMs = Math.min(backoffMs * 2, backoffMaxMs);
          } else backoffMs = backoffStartMs;
        }
      } catch (err) {
        if (this.stopped) return;
        const failure = kubernetesFailure(err, this.opts.call);
        if (failure.nonRetryable) {
          this.stopped = true;
          this.opts.onFatal(failure);
          return;
        }
        await this.pause(backoffMs);
        backoffMs = Math.min(backoffMs * 2, backoffMaxMs);
      }
    }
  }

  private pause(ms: number): Promise<void> {
    return sleep(ms, undefined, { signal: this.stopSignal.signal }).catch(() => undefined);
  }

  private async relist(): Promise<string> {
    const list = await this.opts.list();
    this.objects.clear();
    for (const item of list.items) if (item.metadata?.uid) this.objects.set(item.metadata.uid, item);
    this.synced = true;
    this.opts.onChange();
    return list.metadata?.resourceVersion ?? '';
  }

  /** One watch from `version`; resolves when it ends, rejects when it fails. */
  private watchOnce(version: string): Promise<{ version: string; expired: boolean; events: number }> {
    return new Promise((resolve, reject) => {
      let latest = version;
      let expired = false;
      let events = 0;
      let controller: AbortController | undefined;
      let abandoned = false;
      const abandon = () => {
        abandoned = true;
        controller?.abort();
      };
      this.abandonCurrent = abandon;
      let silence = setTimeout(abandon, silenceMs);
      const onEvent = (type: string, object: T) => {
        events++;
        clearTimeout(silence);
        silence = setTimeout(abandon, silenceMs);
        if (type === 'ERROR') {
          // Mostly 410 Gone (the server compacted past our version): list again.
          expired = true;
          abandon();
          return;
        }
        const rv = object.metadata?.resourceVersion;
        if (rv) latest = rv;
        const uid = object.metadata?.uid;
        if (type === 'BOOKMARK' || !uid) return;
        if (type === 'DELETED') this.objects.delete(uid);
        else this.objects.set(uid, object);
        this.opts.onChange();
      };
      const onDone = (err: unknown) => {
        clearTimeout(silence);
        const code = (err as { statusCode?: number } | null)?.statusCode;
        if (code === 410) resolve({ version: latest, expired: true, events });
        else if (err && !abandoned) reject(err as Error);
        else resolve({ version: latest, expired, events });
      };
      new Watch(this.opts.kubeConfig)
        .watch(
          this.opts.path,
          {
            ...this.opts.selector,
            resourceVersion: version || undefined,
            allowWatchBookmarks: true,
            timeoutSeconds: watchTimeoutSeconds,
          },
          onEvent,
          onDone,
        )
        .then((c) => {
          controller = c;
          if (abandoned || this.stopped) c.abort();
        }, reject);
    });
  }
}
