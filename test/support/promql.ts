// Prometheus's own PromQL parser (test/support/promql, a small Go program on
// github.com/prometheus/prometheus/promql/parser): which metrics each expression reads.
import { readFileSync } from 'node:fs';
import { runHelper } from './promparse.js';

export interface ParsedExpression {
  expr: string;
  /** Metric names of the expression's selectors, sorted. */
  metrics: string[];
  /** The parser's error, or a selector that names no single metric. */
  error?: string;
}

export async function parsePromQL(exprs: readonly string[]): Promise<ParsedExpression[]> {
  return JSON.parse(await runHelper('promql', JSON.stringify(exprs))) as ParsedExpression[];
}

/** Values Grafana puts in for its variables before a query reaches Prometheus. */
const grafanaVariables: Record<string, string> = {
  __rate_interval: '1m',
  __interval: '30s',
  __range: '1h',
};

/**
 * An expression as Grafana sends it: `$x`/`${x}` replaced by its interval, or else by
 * `selected` (the value of a variable such as `$campaign`; ".*" for "All").
 */
export function expandGrafanaVariables(expr: string, selected = 'value'): string {
  return expr.replace(/\$\{(\w+)\}|\$(\w+)/g, (_, a: string | undefined, b: string | undefined) => {
    const name = (a ?? b)!;
    return grafanaVariables[name] ?? selected;
  });
}

export interface DashboardQuery {
  /** Where in the dashboard: the panel's title and target refId, or the variable's name. */
  where: string;
  expr: string;
}

/**
 * Every PromQL expression of a Grafana dashboard: panel targets (also inside collapsed rows) and
 * the metric of each `label_values(metric, label)` variable query, Grafana variables expanded.
 */
export function dashboardQueries(path: string, selected?: string): DashboardQuery[] {
  interface Panel {
    title?: string;
    targets?: { refId?: string; expr?: string }[];
    panels?: Panel[];
  }
  interface Variable {
    name: string;
    type: string;
    query?: string | { query?: string };
  }
  const dashboard = JSON.parse(readFileSync(path, 'utf8')) as {
    panels?: Panel[];
    templating?: { list?: Variable[] };
  };
  const queries: DashboardQuery[] = [];
  const walk = (panels: Panel[] | undefined) => {
    for (const p of panels ?? []) {
      for (const t of p.targets ?? [])
        if (t.expr !== undefined)
          queries.push({
            where: `panel "${p.title}" ${t.refId}`,
            expr: expandGrafanaVariables(t.expr, selected),
          });
      walk(p.panels);
    }
  };
  walk(dashboard.panels);
  for (const v of dashboard.templating?.list ?? []) {
    if (v.type !== 'query') continue;
    const text = typeof v.query === 'string' ? v.query : (v.query?.query ?? '');
    const m = /^label_values\((.+),\s*\w+\)$/.exec(text.trim());
    if (!m)
      throw new Error(`${path}: variable "${v.name}": query "${text}" is not label_values(expr, label)`);
    queries.push({ where: `variable "${v.name}"`, expr: expandGrafanaVariables(m[1]!, selected) });
  }
  return queries;
}
