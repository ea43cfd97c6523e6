// The rollout fleet's real size over a campaign, read from the Prometheus server that scrapes the
// rollout workers. Each worker exports moerl_rollout_rank_capacity (docs/metrics.md), so at any
// instant count() of it is the fleet's pods and sum() its moe_generate ranks, whatever scaled the
// fleet (a fixed Deployment, KEDA, a person). Integrated over the campaign's wall time they give
// pod-seconds and rank-seconds, the measure of what an elastic fleet saves (docs/report.md).
import { CliError, UsageError } from '../errors.js';

/** The fleet at evenly spaced instants over the window: pods and ranks (0 where none). */
export interface FleetSamples {
  /** Where the samples came from: the server and the selector. */
  source: string;
  stepSeconds: number;
  pods: number[];
  ranks: number[];
}

const capacityMetric = 'moerl_rollout_rank_capacity';
/** Prometheus refuses a range query of more than 11,000 points per series. */
const maxPoints = 10_000;

/** The server's base URL, checked before anything is read. */
export function prometheusBase(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new UsageError(
      `--prometheus: got "${text}"; expected the server's URL, e.g. http://127.0.0.1:9090`,
    );
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new UsageError(`--prometheus: got "${text}"; expected an http or https URL`);
  return `${url.origin}${url.pathname.replace(/\/+$/, '')}`;
}

interface RangeResponse {
  status?: string;
  error?: string;
  data?: { resultType?: string; result?: { values?: [number, string][] }[] };
}

/**
 * The fleet from `from` to `to` (ms), one sample per step (1 s, or coarser so that a long
 * campaign stays within Prometheus' point limit). `selector` holds label matchers that pick the
 * campaign's rollout workers among everything the server scrapes, e.g. `job="moerl-rollout"`.
 */
export async function readFleet(
  base: string,
  selector: string,
  window: { from: number; to: number },
): Promise<FleetSamples> {
  const seconds = Math.max(0, (window.to - window.from) / 1000);
  const stepSeconds = Math.max(1, Math.ceil(seconds / maxPoints));
  const points = Math.floor(seconds / stepSeconds) + 1;
  const start = window.from / 1000;
  const series = `${capacityMetric}{${selector}}`;
  const read = async (expr: string): Promise<number[]> => {
    const query = new URLSearchParams({
      query: expr,
      start: String(start),
      end: String(start + (points - 1) * stepSeconds),
      step: String(stepSeconds),
    });
    const where = `--prometheus ${base}: ${expr}`;
    let res: Response;
    try {
      res = await fetch(`${base}/api/v1/query_range?${query}`);
    } catch (err) {
      throw new CliError(`${where}: cannot reach the server (${(err as Error).message})`);
    }
    let body: RangeResponse;
    try {
      body = (await res.json()) as RangeResponse;
    } catch {
      throw new CliError(
        `${where}: HTTP ${res.status}, and the answer is not JSON: is this a Prometheus server?`,
      );
    }
    if (body.status !== 'success')
      throw new CliError(
        `${where}: the server refused it (HTTP ${res.status}): ${body.error ?? 'no error text'}`,
      );
    const result = body.data?.result;
    if (body.data?.resultType !== 'matrix' || !Array.isArray(result) || result.length > 1)
      throw new CliError(
        `${where}: expected one series of a range query, got ${JSON.stringify(body.data)?.slice(0, 200)}`,
      );
    // An aggregation over no series has no sample: no worker ran then.
    const values = new Array<number>(points).fill(0);
    for (const [t, v] of result[0]?.values ?? []) {
      const k = Math.round((t - start) / stepSeconds);
      const value = Number(v);
      if (!Number.isInteger(k) || k < 0 || k >= points || !Number.isFinite(value))
        throw new CliError(`${where}: a sample out of the window or not a number: [${t}, "${v}"]`);
      values[k] = value;
    }
    return values;
  };
  const [pods, ranks] = await Promise.all([read(`count(${series})`), read(`sum(${series})`)]);
  return { source: `${base} ${series}`, stepSeconds, pods, ranks };
}
