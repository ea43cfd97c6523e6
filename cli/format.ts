// Plain-text output helpers: aligned tables, durations, numbers. No colours, so output pipes
// cleanly and tests can match it.

/** Left-aligns text columns and right-aligns numeric ones (those named in `right`). */
export function table(headers: string[], rows: string[][], right: ReadonlySet<number> = new Set()): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (right.has(i) ? c.padStart(widths[i] ?? 0) : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(headers), ...rows.map(line)].join('\n');
}

/** 0.42s, 12.3s, 4m05s, 2h03m. */
export function seconds(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) return '-';
  if (value < 10) return `${value.toFixed(2)}s`;
  if (value < 60) return `${value.toFixed(1)}s`;
  const s = Math.round(value);
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

export function decimal(value: number | null | undefined, digits = 3): string {
  return value === null || value === undefined || !Number.isFinite(value) ? '-' : value.toFixed(digits);
}

/** `lr=0.0001 klCoef=0.02` */
export function keyValues(values: Record<string, unknown>): string {
  return Object.entries(values)
    .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
    .join(' ');
}

/** ISO timestamp without milliseconds, in UTC. */
export function timestamp(value: Date | string | undefined): string {
  if (value === undefined) return '-';
  const date = typeof value === 'string' ? new Date(value) : value;
  return Number.isNaN(date.getTime()) ? '-' : date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** The message on one line: continuation lines joined with "; ". */
export function oneLine(message: string): string {
  const lines = message
    .split('\n')
    .map((l) => l.trim().replace(/^- /, ''))
    .filter(Boolean);
  return lines.reduce(
    (out, line) => (out === '' ? line : out.endsWith(':') ? `${out} ${line}` : `${out}; ${line}`),
    '',
  );
}
