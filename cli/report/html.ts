// One self-contained HTML page: the header and economics as tables, every chart drawn by
// Vega-Lite from data inside the page, the minified vega, vega-lite and vega-embed bundles
// inlined from node_modules. A Content-Security-Policy forbids every fetch, so the page works
// offline and a chart that tried to load anything would fail visibly.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { decimal, seconds, timestamp } from '../format.js';
import type { Chart } from './charts.js';
import type { Economics } from './economics.js';
import type { ReportModel } from './model.js';

/** The UMD bundle of a package, next to the file its main export resolves to. */
function bundle(pkg: string, file: string): string {
  const dir = dirname(fileURLToPath(import.meta.resolve(pkg)));
  return readFileSync(join(dir, file), 'utf8')
    .replace(/\/\/# sourceMappingURL=\S+\s*$/, '')
    .replace(/<\/script/gi, '<\\/script');
}

const escape = (text: string) =>
  text.replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c] as string,
  );
/** JSON inside a <script> element: `<` escaped so no string can close the element. */
const scriptJson = (value: unknown) => JSON.stringify(value).replace(/</g, '\\u003c');

const money = (value: number | null, currency: string) =>
  value === null ? 'no price given' : `${value.toFixed(value < 10 ? 4 : 2)} ${currency}`;
const percent = (value: number | null) => (value === null ? '-' : `${(100 * value).toFixed(1)}%`);

function rows(pairs: [string, string][]): string {
  return pairs.map(([k, v]) => `<tr><th>${escape(k)}</th><td>${v}</td></tr>`).join('\n');
}

function headerTable(model: ReportModel): string {
  const h = model.header;
  const s = h.spec;
  const link = h.temporalUi ? `<a href="${escape(h.temporalUi)}">${escape(h.temporalUi)}</a>` : '-';
  return rows([
    ['campaign', escape(`${h.campaignId} (${s.name})`)],
    ['status', escape(h.status)],
    ['task, model', escape(`${s.task}; ${s.model}`)],
    [
      'iterations',
      escape(
        `${model.iterations.length} of ${s.iterations} × ${s.promptsPerIteration} prompts × ${s.groupSize} samples; ${s.rolloutShards} rollout shards, ${s.epWorldSize} EP ranks, staleness ${s.staleness}, launcher ${s.launcher}`,
      ),
    ],
    ['hyperparameters (at start)', escape(h.hyperparameters)],
    [
      'forked from',
      escape(
        h.forkedFrom
          ? `${h.forkedFrom.campaignId} at iteration ${h.forkedFrom.iteration}`
          : '- (fresh policy)',
      ),
    ],
    [
      'checkpoints kept',
      escape(
        h.checkpointsKept.map((c) => `${c.iteration} (reward ${decimal(c.meanReward)})`).join(', ') || '-',
      ),
    ],
    ['store', escape(h.store)],
    [
      'wall time',
      escape(
        `${seconds(h.wallSeconds)} from ${timestamp(h.startedAt)} to ${h.endedAt ? timestamp(h.endedAt) : 'now (running)'}`,
      ),
    ],
    ['workflow runs', escape(String(h.runs))],
    ['Temporal UI', link],
  ]);
}

function economicsTable(e: Economics): string {
  const c = e.currency;
  const p = e.pools;
  const i = e.interruptions;
  return rows([
    [
      'rollout pool',
      escape(
        `${p.rollout.nodes} nodes at ${money(p.rollout.nodeHourPrice, c)}/node-hour; busy ${percent(p.rollout.busyFraction)} (${seconds(p.rollout.busySeconds)}); cost ${money(p.rollout.cost, c)}`,
      ),
    ],
    ...(e.fleet
      ? [
          [
            'rollout fleet (measured)',
            escape(
              `${(e.fleet.podSeconds / 3600).toFixed(3)} node-hours (mean ${decimal(e.fleet.meanPods)}, peak ${e.fleet.peakPods} pods); ranks busy ${percent(e.fleet.busyFraction)} of ${seconds(e.fleet.rankSeconds)} rank-seconds; cost ${money(e.fleet.cost, c)} — from ${e.fleet.source}`,
            ),
          ] as [string, string],
        ]
      : []),
    [
      'train pool',
      escape(
        `${p.train.nodes} nodes at ${money(p.train.nodeHourPrice, c)}/node-hour; busy ${percent(p.train.busyFraction)} (${seconds(p.train.busySeconds)}); cost ${money(p.train.cost, c)}`,
      ),
    ],
    [
      'checkpoint commits (control)',
      escape(`busy ${percent(p.control.busyFraction)} (${seconds(p.control.busySeconds)})`),
    ],
    ['campaign cost', escape(money(e.totalCost, c))],
    [
      'per 1M generated tokens',
      escape(
        `${money(e.costPerMillionGeneratedTokens, c)} (rollout pool alone ${money(e.rolloutCostPerMillionGeneratedTokens, c)}); ${e.generatedTokens} tokens`,
      ),
    ],
    [
      'per 1M trained tokens',
      escape(
        `${money(e.costPerMillionTrainedTokens, c)} (train pool alone ${money(e.trainCostPerMillionTrainedTokens, c)}); ${e.trainedTokens ?? '-'} tokens`,
      ),
    ],
    [
      'lost to interruptions',
      escape(
        `${seconds(i.lostSeconds.total)} node time, ${money(i.lostCost, c)}: ${i.chunksRedone} chunks redone (${seconds(i.redoneChunkSeconds)}), retry delays ${seconds(i.retryDelaySeconds)} (of which heartbeat waits ${seconds(i.heartbeatWaitSeconds)}), stages failed for good ${seconds(i.failedStageSeconds)}`,
      ),
    ],
    [
      'update time',
      escape(
        e.update
          ? `${seconds(e.update.seconds)}: EP communication ${percent(e.update.epShare)}, compute ${percent(e.update.computeShare)} (${(e.update.epBytes / 1e6).toFixed(1)} MB exchanged)`
          : '-',
      ),
    ],
  ]);
}

const style = `
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1040px; color: #111827; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin: 28px 0 4px; }
table { border-collapse: collapse; margin: 8px 0; } th { text-align: left; padding: 2px 16px 2px 0; color: #4b5563; font-weight: 600; vertical-align: top; }
td { padding: 2px 0; } .caption { color: #4b5563; margin: 0 0 6px; } .absent { color: #92400e; }
.chart { margin-bottom: 8px; }`;

export function renderHtml(model: ReportModel, economics: Economics, chartList: Chart[]): string {
  const specs = Object.fromEntries(chartList.filter((c) => c.spec).map((c) => [c.id, c.spec]));
  const sections = chartList
    .map(
      (c) => `<section><h2>${escape(c.title)}</h2><p class="caption">${escape(c.caption)}</p>
${c.spec ? `<div class="chart" id="chart-${c.id}"></div>` : `<p class="absent">Not in this campaign's history or store, so not drawn.</p>`}</section>`,
    )
    .join('\n');
  const absent = model.absent.length
    ? `<h2>Not recorded</h2><ul>${model.absent.map((a) => `<li class="absent">${escape(a)}</li>`).join('')}</ul>`
    : '';
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:">
<title>moerl report: ${escape(model.header.campaignId)}</title>
<style>${style}</style></head>
<body data-rendered="pending">
<h1>Campaign ${escape(model.header.campaignId)}</h1>
<table>${headerTable(model)}</table>
<h2>Economics and utilisation</h2>
<table>${economicsTable(economics)}</table>
${absent}
${sections}
<script id="chart-specs" type="application/json">${scriptJson(specs)}</script>
<script>${bundle('vega', 'vega.min.js')}</script>
<script>${bundle('vega-lite', 'vega-lite.min.js')}</script>
<script>${bundle('vega-embed', 'vega-embed.min.js')}</script>
<script>
  // Each chart's vega view is kept on window.moerlViews, so a test can count the drawn marks.
  window.moerlViews = {};
  const specs = JSON.parse(document.getElementById('chart-specs').textContent);
  Promise.all(Object.entries(specs).map(([id, spec]) =>
    vegaEmbed('#chart-' + id, spec, { renderer: 'svg', actions: false }).then((r) => { window.moerlViews[id] = r.view; })))
    .then(() => { document.body.dataset.rendered = 'ok'; },
          (err) => { document.body.dataset.rendered = 'error'; console.error('chart failed: ' + err); });
</script>
</body></html>
`;
}
