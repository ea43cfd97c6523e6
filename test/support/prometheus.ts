// A real Prometheus server (built from its Go modules by scripts/tools.sh, without service
// discovery plugins: static and file targets remain) on 127.0.0.1, scraping every second, and
// its HTTP API's instant queries. For the opt-in scrape test and the fleet benchmark.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../../cli/dev-server.js';
import { resolveTool, type ToolName } from '../../cli/temporal-tools.js';
import { spawnGroup, waitUntilReady } from './process-group.js';

export interface Sample {
  metric: Record<string, string>;
  value: [number, string];
}

export interface Prometheus {
  /** The server's base URL, e.g. http://127.0.0.1:9090. */
  url: string;
  /** An instant query; fails on a query error. */
  query(expr: string): Promise<Sample[]>;
  /** The first sample's value of an instant query; NaN when there is none. */
  one(expr: string): Promise<number>;
  stop(): Promise<void>;
}

/**
 * Starts Prometheus with its data in `dir`, scraping every second with `scrapeConfigs`: the
 * YAML lines of the `scrape_configs` list, e.g. `  - job_name: moerl`.
 */
export async function startPrometheus(dir: string, scrapeConfigs: string[]): Promise<Prometheus> {
  const binary = await resolveTool('prometheus' as unknown as ToolName, { showProgress: true });
  const config = join(dir, 'prometheus.yml');
  writeFileSync(
    config,
    [
      'global: { scrape_interval: 1s, evaluation_interval: 1s }',
      'scrape_configs:',
      ...scrapeConfigs,
      '',
    ].join('\n'),
  );
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const server = spawnGroup(
    'prometheus',
    binary,
    [
      `--config.file=${config}`,
      `--storage.tsdb.path=${join(dir, 'tsdb')}`,
      `--web.listen-address=127.0.0.1:${port}`,
    ],
    join(dir, 'prometheus.log'),
  );
  try {
    await waitUntilReady(
      server,
      Date.now() + 60_000,
      async () => (await fetch(`${url}/-/ready`)).ok || 'not ready yet',
      (message) => new Error(message),
    );
  } catch (err) {
    await server.stop(10_000);
    throw err;
  }
  const query = async (expr: string): Promise<Sample[]> => {
    const res = await fetch(`${url}/api/v1/query?${new URLSearchParams({ query: expr })}`);
    const body = (await res.json()) as { status: string; error?: string; data?: { result: Sample[] } };
    assert.equal(body.status, 'success', `${expr}: ${body.error}`);
    return body.data!.result;
  };
  return {
    url,
    query,
    one: async (expr) => Number((await query(expr))[0]?.value[1] ?? NaN),
    stop: () => server.stop(10_000),
  };
}
