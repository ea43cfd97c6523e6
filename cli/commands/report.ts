// `moerl report <id>`: one self-contained HTML page of a campaign (charts from the workflow
// history of every run and the store's training metrics), its data as JSON and CSV, and the
// campaign's economics given the pools' prices (docs/report.md).
import { join, resolve } from 'node:path';
import { describeCampaign } from '../campaigns.js';
import type { Command, CommandContext } from '../command.js';
import { UsageError } from '../errors.js';
import { prometheusBase, readFleet } from '../report/fleet.js';
import { resolvePrices } from '../report/prices.js';

/** The campaign's page in the Temporal UI, from the UI's base URL. */
function uiLink(base: string | undefined, namespace: string, id: string): string | null {
  if (base === undefined) return null;
  let url: URL;
  try {
    url = new URL(base);
  } catch {
    throw new UsageError(`--ui: got "${base}"; expected the Temporal UI's URL, e.g. http://127.0.0.1:8233`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new UsageError(`--ui: got "${base}"; expected an http or https URL`);
  const path = url.pathname.replace(/\/+$/, '');
  return `${url.origin}${path}/namespaces/${encodeURIComponent(namespace)}/workflows/${encodeURIComponent(id)}`;
}

export const reportCommand: Command = {
  name: 'report',
  summary: 'write an HTML report (charts, economics) of a campaign, with its data as JSON and CSV',
  usage:
    'report <campaign-id> [--out DIR] [--prices FILE] [--rollout-price P] [--train-price P] [--ui URL] [--prometheus URL [--fleet-selector S]]',
  options: {
    out: { type: 'string' },
    prices: { type: 'string' },
    'rollout-price': { type: 'string' },
    'train-price': { type: 'string' },
    'rollout-nodes': { type: 'string' },
    'train-nodes': { type: 'string' },
    currency: { type: 'string' },
    ui: { type: 'string' },
    prometheus: { type: 'string' },
    'fleet-selector': { type: 'string' },
  },
  optionHelp: {
    '--out DIR': 'where report.html, report.json and iterations.csv go (default .moerl/reports/<id>)',
    '--prices FILE': 'YAML with currency, rollout and train { nodeHourPrice, nodes } (docs/report.md)',
    '--rollout-price P': 'price of one rollout node per hour (overrides the file)',
    '--train-price P': 'price of one train node per hour (overrides the file)',
    '--rollout-nodes N': "nodes in the rollout pool (default: the spec's rolloutShards)",
    '--train-nodes N': 'nodes in the train pool (default 1)',
    '--currency C': 'currency of the prices (default USD)',
    '--ui URL': 'base URL of the Temporal UI, for the link in the header (env MOERL_TEMPORAL_UI)',
    '--prometheus URL':
      "the Prometheus server that scrapes the rollout workers: the fleet's pod- and rank-seconds over the campaign, its busy fraction and cost (env MOERL_PROMETHEUS_URL)",
    '--fleet-selector S':
      "label matchers that pick the campaign's rollout workers there, e.g. 'job=\"moerl-rollout\"' (default: every worker the server scrapes)",
  },
  details: `Reads the workflow history of every run (across continue-as-new) and the metrics each update
stored under campaigns/<id>/metrics/ (a relative fs store resolves against the current folder).
The page needs no network: the charting library is inside it. With --json the report document
(report.json) is printed on stdout. Formulas: docs/report.md.`,
  positionals: { min: 1, max: 1 },
  campaignIdArgument: true,
  async run(ctx: CommandContext) {
    const id = ctx.positionals[0] as string;
    const flags = {
      file: ctx.string('prices'),
      rolloutPrice: ctx.string('rollout-price'),
      trainPrice: ctx.string('train-price'),
      rolloutNodes: ctx.string('rollout-nodes'),
      trainNodes: ctx.string('train-nodes'),
      currency: ctx.string('currency'),
    };
    // Bad prices or a bad URL fail before anything is read; node counts default from the spec.
    resolvePrices(flags, undefined);
    const ui = uiLink(ctx.string('ui') ?? ctx.io.env.MOERL_TEMPORAL_UI, ctx.temporal().namespace, id);
    const prometheusUrl = ctx.string('prometheus') ?? ctx.io.env.MOERL_PROMETHEUS_URL;
    const prometheus = prometheusUrl === undefined ? null : prometheusBase(prometheusUrl);
    const selector = ctx.string('fleet-selector') ?? '';
    if (selector && !prometheus) throw new UsageError('--fleet-selector needs --prometheus');
    // Loaded only when a report is made: the store's S3 client and the page's renderer would
    // slow every other command's start.
    const [{ collectReport }, { buildReport, writeReport }, { campaignWindow }] = await Promise.all([
      import('../report/collect.js'),
      import('../report/index.js'),
      import('../report/model.js'),
    ]);
    const client = await ctx.client();
    await describeCampaign(client, id);
    const source = await collectReport(client, id);
    const prices = resolvePrices(flags, source.spec);
    const { startedAt, endedAt } = campaignWindow(source);
    const fleet = prometheus
      ? await readFleet(prometheus, selector, { from: startedAt, to: endedAt ?? source.readAt })
      : null;
    const report = buildReport(source, prices, ui, fleet);
    const dir = resolve(ctx.string('out') ?? join('.moerl', 'reports', id));
    const paths = writeReport(report, dir);
    ctx.print(report, () =>
      [
        `report of ${id}: ${report.iterations.length} iterations in ${report.header.runs} workflow run${report.header.runs === 1 ? '' : 's'}`,
        `  html  ${paths.html}`,
        `  json  ${paths.json}`,
        `  csv   ${paths.csv}`,
        ...report.absent.map((a) => `  not recorded: ${a}`),
      ].join('\n'),
    );
  },
};
