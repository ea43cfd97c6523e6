// `moerl report`'s pieces put together: the report document (what --json prints and report.json
// holds), the per-iteration CSV, and the HTML page, written into one folder.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { charts } from './charts.js';
import type { ReportSource } from './collect.js';
import { economics, type Economics } from './economics.js';
import type { FleetSamples } from './fleet.js';
import { renderHtml } from './html.js';
import { buildModel, type ReportModel } from './model.js';
import type { Prices } from './prices.js';

export interface ReportDocument extends ReportModel {
  generatedAt: string;
  economics: Economics;
}

export function buildReport(
  source: ReportSource,
  prices: Prices,
  temporalUi: string | null,
  fleet: FleetSamples | null = null,
): ReportDocument {
  const model = buildModel(source, temporalUi);
  return {
    generatedAt: new Date(source.readAt).toISOString(),
    ...model,
    economics: economics(model, source.records.activities, source.spec, prices, source.readAt, fleet),
  };
}

const csvColumns: [string, (it: ReportModel['iterations'][number]) => unknown][] = [
  ['iteration', (it) => it.iteration],
  ['run', (it) => it.run],
  ['mean_reward', (it) => it.meanReward],
  ['pass_rate', (it) => it.passRate],
  ['samples', (it) => it.samples],
  ['tokens', (it) => it.tokens],
  ['rollout_tokens_per_s', (it) => it.rolloutTokensPerSecond],
  ['chunks_redone', (it) => it.chunksRedone],
  ['rollout_s', (it) => it.stageSeconds.rollout],
  ['reward_s', (it) => it.stageSeconds.reward],
  ['update_s', (it) => it.stageSeconds.update],
  ['commit_s', (it) => it.stageSeconds.checkpoint],
  ['waiting_s', (it) => it.waitingSeconds],
  ['retries', (it) => it.retries],
  ['failed_attempts', (it) => it.failures],
  ['heartbeat_timeouts', (it) => it.heartbeatTimeouts],
  ['train_steps', (it) => it.train?.steps],
  ['trained_tokens', (it) => it.train?.tokens],
  ['loss', (it) => it.train?.loss],
  ['policy_loss', (it) => it.train?.policyLoss],
  ['kl', (it) => it.train?.kl],
  ['entropy', (it) => it.train?.entropy],
  ['clip_frac', (it) => it.train?.clipFrac],
  ['grad_norm', (it) => it.train?.gradNorm],
  ['aux_loss', (it) => it.train?.auxLoss],
  ['z_loss', (it) => it.train?.zLoss],
  ['mismatch_kl', (it) => it.train?.mismatchKl],
  ['tis_clip_frac', (it) => it.train?.tisClipFrac],
  ['update_step_s', (it) => it.train?.seconds],
  ['ep_s', (it) => it.train?.epSeconds],
  ['ep_bytes', (it) => it.train?.epBytes],
  ['episodes', (it) => it.episodes?.episodes],
  ['policy_turns', (it) => it.episodes?.policyTurns],
  ['tool_calls', (it) => it.episodes && total(it.episodes.toolCalls)],
  ['tool_errors', (it) => it.episodes && total(it.episodes.toolErrors)],
  ['tool_s', (it) => it.episodes?.toolSeconds],
  ['generation_s', (it) => it.episodes?.generationSeconds],
  ['hyperparameter_changes', (it) => it.hyperparameterChanges.join(' ')],
];

const total = (counts: Record<string, number>) => Object.values(counts).reduce((a, b) => a + b, 0);

function csvCell(value: unknown): string {
  if (value === null || value === undefined) return '';
  const text = String(value);
  return /[",\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

export function iterationsCsv(report: ReportModel): string {
  const lines = [csvColumns.map(([name]) => name).join(',')];
  for (const it of report.iterations) lines.push(csvColumns.map(([, get]) => csvCell(get(it))).join(','));
  return `${lines.join('\n')}\n`;
}

/** Writes report.html, report.json and iterations.csv into `dir`; returns their paths. */
export function writeReport(
  report: ReportDocument,
  dir: string,
): { html: string; json: string; csv: string } {
  mkdirSync(dir, { recursive: true });
  const paths = {
    html: join(dir, 'report.html'),
    json: join(dir, 'report.json'),
    csv: join(dir, 'iterations.csv'),
  };
  writeFileSync(paths.html, renderHtml(report, report.economics, charts(report)));
  writeFileSync(paths.json, `${JSON.stringify(report, null, 2)}\n`);
  writeFileSync(paths.csv, iterationsCsv(report));
  return paths;
}
