// The deadlines of a training job's rendezvous, a field pair of either launcher section: how long
// the ranks may take to form their group (every rank started, inputs downloaded, connected to
// rank 0) and how long each exchange after that may wait for a peer. Kept apart so the local and
// kubernetes sections share them; pure zod, like spec.ts (workflows import it).
import { z } from 'zod';

/** The per-exchange deadline when the spec gives none (the native core's MOERL_TIMEOUT_S default). */
export const defaultExchangeTimeoutSeconds = 60;
/** The start-up deadline of local ranks when the spec gives none (they pend for nothing but downloads). */
export const defaultLocalStartupTimeoutSeconds = 600;

export const rendezvousFields = {
  startupTimeoutSeconds: z
    .number()
    .int()
    .min(1)
    .max(7 * 24 * 3600)
    .optional()
    .describe(
      "how long the ranks of a training job may take to form their group — pods pending, inputs downloading, every rank connected to rank 0 — before the job fails (MOERL_STARTUP_TIMEOUT_S). Absent: the launcher's pending timeout (kubernetes: unschedulableTimeoutSeconds; local: 600)",
    ),
  exchangeTimeoutSeconds: z
    .number()
    .int()
    .min(1)
    .max(24 * 3600)
    .optional()
    .describe(
      `how long one exchange between formed ranks (a collective, a dispatch) may wait for a peer before the job fails (MOERL_TIMEOUT_S). Absent: ${defaultExchangeTimeoutSeconds}`,
    ),
};

export interface RankDeadlines {
  startupTimeoutSeconds: number;
  exchangeTimeoutSeconds: number;
}

/**
 * A launcher section's deadlines with their defaults. Computed here, not as zod defaults, so a
 * campaign started before the fields existed gets them too.
 */
export function rankDeadlines(launcher: {
  kind: string;
  startupTimeoutSeconds?: number;
  exchangeTimeoutSeconds?: number;
  unschedulableTimeoutSeconds?: number;
}): RankDeadlines {
  const pending =
    launcher.kind === 'kubernetes' && launcher.unschedulableTimeoutSeconds !== undefined
      ? launcher.unschedulableTimeoutSeconds
      : defaultLocalStartupTimeoutSeconds;
  return {
    startupTimeoutSeconds: launcher.startupTimeoutSeconds ?? pending,
    exchangeTimeoutSeconds: launcher.exchangeTimeoutSeconds ?? defaultExchangeTimeoutSeconds,
  };
}
