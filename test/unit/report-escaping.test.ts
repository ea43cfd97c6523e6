// The report page holds text that others wrote — the campaign id, the spec's name, pause and
// hyperparameter-change reasons, failure messages, the store's name — and must show it as text:
// no `</script>` closes a script early, no `<!--` opens a comment, no quote leaves an attribute,
// no HTML of theirs becomes an element, in the page or in a chart's tooltip. Checked in the
// page's source and in a real Chromium (test/support/browser.ts), which with CI=true must be
// there: a CI machine without it fails these tests instead of skipping them.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { historyFromRecords, type ActivityRecord, type CampaignRecords } from '../../cli/history.js';
import type { ReportSource } from '../../cli/report/collect.js';
import { buildReport, writeReport } from '../../cli/report/index.js';
import { resolvePrices } from '../../cli/report/prices.js';
import { chromiumSkip, renderPage, withBrowser } from '../support/browser.js';
import { testSpec } from '../support/campaign-harness.js';

const dir = mkdtempSync(join(tmpdir(), 'moerl-report-escaping-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Closes the script, opens a comment, leaves an attribute, makes elements that would run code. */
const evil = `</script><script>window.pwned=1</script><!--<script>"'><b id="injected">b</b><img src=x id=injected onerror="window.pwned=2">`;
const id = `c-${evil}`;
const s = (x: number) => x * 1000;

function act(p: Partial<ActivityRecord> & Pick<ActivityRecord, 'activity' | 'stage' | 'iteration'>) {
  return {
    activityId: String(Math.random()),
    runId: 'run-1',
    scheduledAt: 0,
    startedAt: 0,
    closedAt: 0,
    outcome: 'completed',
    attempts: 1,
    failures: [],
    heartbeatTimeouts: 0,
    result: {},
    ...p,
  } as ActivityRecord;
}

function hostileReport(): string {
  const spec = { ...testSpec({ iterations: 2 }), name: `n-${evil}` };
  const reward = (iteration: number) =>
    act({
      activity: 'computeRewards',
      stage: 'reward',
      iteration,
      scheduledAt: s(10 * iteration),
      closedAt: s(10 * iteration + 1),
      result: { meanReward: 0.5, stdReward: 0.1, passRate: 0.25, attempt: 1 },
    });
  const records: CampaignRecords = {
    campaignId: id,
    runSpans: [
      {
        runId: 'run-1',
        startedAt: new Date(0).toISOString(),
        lastEventAt: new Date(s(30)).toISOString(),
        closedAs: null,
      },
    ],
    activities: [
      act({
        activity: 'rolloutShard',
        stage: 'rollout',
        iteration: 1,
        scheduledAt: s(1),
        closedAt: s(9),
        attempts: 2,
        failures: [`attempt 1: RankFailed: ${evil}`],
        result: {
          shard: 0,
          chunks: 1,
          samples: 8,
          tokens: 100,
          tokensPerSecond: 10,
          chunksRedone: 0,
          attempt: 2,
        },
      }),
      reward(1),
      act({
        activity: 'updatePolicy',
        stage: 'update',
        iteration: 2,
        scheduledAt: s(21),
        closedAt: null,
        outcome: 'running',
        failures: [`attempt 1: ApplicationFailure: ${evil}`],
      }),
      reward(2),
    ],
    changes: [
      { iteration: 2, changes: { temperature: 0.8 }, reason: `r-${evil}`, at: new Date(s(12)).toISOString() },
    ],
    signals: [
      { name: 'pause', at: s(13), reason: `p-${evil}` },
      { name: 'resume', at: s(15), reason: '' },
    ],
    input: { campaignId: id, spec, taskQueues: { control: 'c', rollout: 'r', train: 't' } },
  };
  const source: ReportSource = {
    records,
    history: historyFromRecords(records),
    spec,
    store: `fs:${evil}`,
    trainSteps: new Map(),
    metricsMissing: [],
    updatesSkipped: [],
    readAt: s(30),
  };
  const ui = `http://127.0.0.1:8233/namespaces/default/workflows/${encodeURIComponent(id)}`;
  return writeReport(buildReport(source, resolvePrices({}, spec), ui), dir).html;
}

/** Finds a named mark in a view, shows its first item's tooltip and reads what the page shows. */
const probe = `(() => {
  const find = (node, name) => {
    if (node.name === name) return node;
    for (const child of node.items || []) { const found = find(child, name); if (found) return found; }
    return null;
  };
  const tooltips = {};
  for (const [chart, mark] of [['timeline', 'pause_marks'], ['reward', 'hpChange_marks']]) {
    const view = window.moerlViews[chart];
    const item = find(view.scenegraph().root, mark).items[0];
    view.tooltip()(view, new MouseEvent('mousemove', { clientX: 100, clientY: 100 }), item, item.tooltip);
    const shown = document.getElementById('vg-tooltip-element');
    tooltips[chart] = { html: shown.innerHTML, text: shown.textContent };
  }
  return {
    title: document.title,
    h1: document.querySelector('h1').textContent,
    cells: [...document.querySelectorAll('td')].map((td) => td.textContent),
    link: document.querySelector('a').getAttribute('href'),
    injected: document.querySelectorAll('#injected, img').length,
    scripts: document.querySelectorAll('script').length,
    pwned: window.pwned ?? null,
    tooltips,
  };
})()`;

interface Probed {
  title: string;
  h1: string;
  cells: string[];
  link: string;
  injected: number;
  scripts: number;
  pwned: number | null;
  tooltips: Record<string, { html: string; text: string }>;
}

describe('report page: others’ text stays text', () => {
  const html = hostileReport();
  const page = readFileSync(html, 'utf8');

  it('in the source: five scripts, no comment, no element or attribute of theirs', () => {
    assert.equal(page.match(/<script/gi)?.length, 5, 'the specs, three bundles and the page script');
    assert.equal(page.match(/<\/script/gi)?.length, 5);
    assert.equal(page.includes('<!--'), false);
    // The chart data is JSON in a script element: no "<" at all, and every text comes back whole.
    const specs =
      /<script id="chart-specs" type="application\/json">([\s\S]*?)<\/script>/.exec(page)?.[1] ?? '';
    assert.equal(specs.includes('<'), false);
    assert.ok(JSON.stringify(JSON.parse(specs)).includes(JSON.stringify(`paused: p-${evil}`).slice(1, -1)));
    // Outside the scripts (vega-embed's own tooltip code holds an <img> template).
    const markup = page.replace(/(<script[^>]*>)[\s\S]*?<\/script>/g, '$1</script>');
    for (const raw of ['<b id="injected">', '<img', `"'>`, 'onerror="'])
      assert.equal(markup.includes(raw), false, raw);
  });

  it(
    'in Chromium: the text is shown as written, in the page and in tooltips',
    { skip: chromiumSkip() },
    async () => {
      const render = await withBrowser((browser) => renderPage(browser, html, undefined, probe));
      assert.equal(render.rendered, 'ok', render.consoleErrors.join('\n'));
      assert.deepEqual(render.consoleErrors, []);
      assert.deepEqual(render.requests, [], 'nothing of theirs loaded (an <img> would)');
      const p = render.probed as Probed;
      assert.deepEqual([p.injected, p.scripts, p.pwned], [0, 5, null]);
      assert.equal(p.title, `moerl report: ${id}`);
      assert.equal(p.h1, `Campaign ${id}`);
      assert.ok(p.cells.includes(`${id} (n-${evil})`), 'campaign and name');
      assert.ok(p.cells.includes(`fs:${evil}`), 'store');
      assert.equal(p.link, `http://127.0.0.1:8233/namespaces/default/workflows/${encodeURIComponent(id)}`);
      for (const [chart, reason] of [
        ['timeline', `paused: p-${evil}`],
        ['reward', 'temperature=0.8'],
      ] as const) {
        const shown = p.tooltips[chart]!;
        assert.ok(shown.text.includes(reason), `${chart} tooltip: ${shown.text}`);
        assert.equal(/<(b|img|script)\b/i.test(shown.html), false, `${chart} tooltip: ${shown.html}`);
      }
    },
  );
});

describe('browser tests under CI=true', () => {
  it('a missing Chromium is no skip: withBrowser fails and says how to install it', async () => {
    const browser = fileURLToPath(new URL('../support/browser.js', import.meta.url));
    const script = `
      const { chromiumSkip, withBrowser } = await import(${JSON.stringify(browser)});
      const launch = await withBrowser(async () => 'launched').catch((err) => err.message);
      console.log(JSON.stringify({ skip: chromiumSkip(), launch }));`;
    const empty = mkdtempSync(join(dir, 'path-'));
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], {
      env: { CI: 'true', PATH: empty },
    });
    const { skip, launch } = JSON.parse(stdout.trim()) as { skip: string | false; launch: string };
    assert.equal(skip, false, 'with CI=true a missing Chromium must fail the tests, not skip them');
    assert.match(launch, /chromium not found.*scripts\/setup\.sh packages/);
  });
});
