// The rendezvous part of the rank contract, set by every launcher: the job's secret, which rank 0
// requires of every rank before it admits it (and proves itself with), and the two deadlines.
// The token is made here, in the worker that starts the job, for that job alone; it never goes
// into the campaign spec, an activity's input or result, or a job's files (docs/architecture.md,
// "Rank rendezvous").
import { randomBytes } from 'node:crypto';
import type { RankDeadlines } from '../../workflows/spec-rendezvous.js';

export const rendezvousEnv = {
  jobToken: 'MOERL_JOB_TOKEN',
  startupTimeout: 'MOERL_STARTUP_TIMEOUT_S',
  exchangeTimeout: 'MOERL_TIMEOUT_S',
  /** Rank 0's listening address; the kubernetes launcher gives each pod its pod IP. */
  bindAddress: 'MOERL_BIND_ADDRESS',
} as const;

/** A fresh job token: 256 random bits, URL-safe base64 (an environment value as it is). */
export function newJobToken(): string {
  return randomBytes(32).toString('base64url');
}

/** The deadlines as rank environment. */
export function deadlineEnv(deadlines: RankDeadlines): Record<string, string> {
  return {
    [rendezvousEnv.startupTimeout]: String(deadlines.startupTimeoutSeconds),
    [rendezvousEnv.exchangeTimeout]: String(deadlines.exchangeTimeoutSeconds),
  };
}
