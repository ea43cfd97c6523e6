// A training activity cancelled while its job is being launched (a Job created, or a failed one
// deleted first: minutes during an API outage) stops: the launch is told to give up, and a job
// it returns all the same is killed. The launcher here is a fake that launches when the test
// says so; the Kubernetes launcher giving up on a cancel is in test/k8s/orphans.test.ts.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { CancelledFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import { createActivities } from '../../activities/index.js';
import type { ActivityDeps } from '../../activities/index.js';
import type { JobStatus, Launcher, TrainJob, TrainJobSpec } from '../../activities/launch/types.js';
import { openStore } from '../../activities/store/index.js';
import { testSpec } from '../support/campaign-harness.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-train-cancel-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** A job that runs until killed; what was done to it is recorded. */
class FakeRunningJob implements TrainJob {
  readonly adopted = false;
  readonly calls: string[] = [];
  private end!: (s: JobStatus) => void;
  private readonly done = new Promise<JobStatus>((resolve) => (this.end = resolve));
  constructor(readonly name: string) {}
  status(): JobStatus {
    return { name: this.name, state: 'running', ranks: [], failure: null };
  }
  wait(): Promise<JobStatus> {
    return this.done;
  }
  kill(): Promise<void> {
    this.calls.push('kill');
    this.end({ ...this.status(), state: 'failed' });
    return Promise.resolve();
  }
  cleanUp(): Promise<void> {
    this.calls.push('cleanUp');
    return Promise.resolve();
  }
  readLog(): Promise<Buffer> {
    return Promise.resolve(Buffer.from(''));
  }
}

/** A launcher whose launch() waits until the test finishes it; it hears the signal it is given. */
class FakeSlowLauncher implements Launcher {
  started!: Promise<void>;
  private markStarted!: () => void;
  signal: AbortSignal | undefined;
  finish!: (job: TrainJob) => void;
  giveUp!: (err: Error) => void;
  constructor() {
    this.started = new Promise((resolve) => (this.markStarted = resolve));
  }
  launch(_spec: TrainJobSpec, signal?: AbortSignal): Promise<TrainJob> {
    this.signal = signal;
    return new Promise<TrainJob>((resolve, reject) => {
      this.finish = resolve;
      this.giveUp = reject;
      this.markStarted();
    });
  }
}

function depsWith(launcher: Launcher): ActivityDeps {
  return {
    openStore: (location: Parameters<typeof openStore>[0]) => openStore(location),
    launcherFor: () => launcher,
    shutdown: new AbortController().signal,
    workerId: 'host/1/abc',
  } as unknown as ActivityDeps;
}

/** `p`, or a failure naming `what` after a few seconds (the old code waited for the job's end). */
function within<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: still running 5 s after the cancel`)), 5000);
    }),
  ]);
}

const spec = testSpec({ store: { kind: 'fs', path: join(dir, 'store') }, sftWarmStartSteps: 0 });
const input = { campaignId: 'cancel-me', spec, source: { kind: 'init' as const } };

describe('a training job cancelled during launch()', () => {
  test('the job that launch() returns after the cancel is killed and the activity ends cancelled', async () => {
    const launcher = new FakeSlowLauncher();
    const env = new MockActivityEnvironment({ heartbeatTimeoutMs: 1000 });
    const run = env.run(createActivities(depsWith(launcher)).preparePolicy, input);
    await launcher.started;
    env.cancel();
    const job = new FakeRunningJob('created-meanwhile');
    launcher.finish(job);
    await assert.rejects(within(run, 'preparePolicy'), (err: unknown) => err instanceof CancelledFailure);
    assert.deepEqual(job.calls, ['kill', 'cleanUp']);
  });

  test('launch() is given the cancellation: one that gives up leaves no job and ends the activity cancelled', async () => {
    const launcher = new FakeSlowLauncher();
    const env = new MockActivityEnvironment({ heartbeatTimeoutMs: 1000 });
    const run = env.run(createActivities(depsWith(launcher)).preparePolicy, input);
    await launcher.started;
    assert.ok(launcher.signal, 'launch() got a signal');
    // As the Kubernetes launcher does while it waits for a failed Job to be deleted.
    launcher.signal.addEventListener('abort', () => launcher.giveUp(new Error('gave up')));
    env.cancel();
    await assert.rejects(within(run, 'preparePolicy'), (err: unknown) => err instanceof CancelledFailure);
  });
});
