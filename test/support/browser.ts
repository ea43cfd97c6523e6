// A real headless Chromium (the Debian `chromium` package; MOERL_CHROMIUM names another binary)
// driven through puppeteer-core, which downloads no browser. Opens a report page from a file,
// refuses every network request, and counts what each Vega view drew. Browser tests skip
// without Chromium, except with CI=true: there they run and fail, as a CI machine must have it.
import { findOnPath } from '../../cli/dev-server.js';
import puppeteer from 'puppeteer-core';
import type { Browser } from 'puppeteer-core';

export function chromiumPath(): string | undefined {
  return process.env.MOERL_CHROMIUM || findOnPath('chromium') || findOnPath('chromium-browser');
}

const install = 'bash scripts/setup.sh packages, or MOERL_CHROMIUM=<binary>';

/** For describe(..., { skip }): why browser tests cannot run here, or false (always with CI=true). */
export function chromiumSkip(): string | false {
  if (chromiumPath() || process.env.CI === 'true') return false;
  return `chromium not installed (${install})`;
}

export interface PageRender {
  /** data-rendered of <body>: "ok" once every chart was embedded, "error" if one failed. */
  rendered: string;
  consoleErrors: string[];
  /** Requests other than the page itself (the page must need none). */
  requests: string[];
  /** Per chart id: drawn items per named mark (group marks excluded), summed over facets. */
  marks: Record<string, Record<string, number>>;
  /** What the `probe` expression given to renderPage evaluated to in the page. */
  probed?: unknown;
}

export async function withBrowser<T>(body: (browser: Browser) => Promise<T>): Promise<T> {
  const executablePath = chromiumPath();
  if (!executablePath) throw new Error(`chromium not found (${install})`);
  const browser = await puppeteer.launch({
    executablePath,
    headless: true,
    // The test may run as root in a container without user namespaces.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    return await body(browser);
  } finally {
    await browser.close();
  }
}

/**
 * Opens `file` (an absolute path), waits for the charts, optionally writes a screenshot and
 * evaluates `probe` (an expression, as text) in the page once the charts are drawn.
 */
export async function renderPage(
  browser: Browser,
  file: string,
  screenshot?: string,
  probe?: string,
): Promise<PageRender> {
  const page = await browser.newPage();
  const consoleErrors: string[] = [];
  const requests: string[] = [];
  const url = `file://${file}`;
  page.on('console', (m) => {
    if (m.type() === 'error') consoleErrors.push(m.text());
  });
  page.on('pageerror', (err) => consoleErrors.push(String(err)));
  await page.setRequestInterception(true);
  page.on('request', (req) => {
    if (req.url() === url) return void req.continue();
    requests.push(req.url());
    void req.abort();
  });
  await page.setViewport({ width: 1100, height: 900, deviceScaleFactor: 1 });
  await page.goto(url, { waitUntil: 'load' });
  // The page's code runs in the browser; it is given as text because this project compiles
  // without the DOM's types.
  await page.waitForFunction('document.body.dataset.rendered !== "pending"', { timeout: 30_000 });
  const rendered = (await page.evaluate('document.body.dataset.rendered')) as string;
  const marks = (await page.evaluate(`(() => {
    const out = {};
    for (const [id, view] of Object.entries(window.moerlViews)) {
      const counts = {};
      const walk = (node) => {
        if (node.marktype && node.marktype !== 'group' && node.name)
          counts[node.name] = (counts[node.name] || 0) + (node.items ? node.items.length : 0);
        for (const child of node.items || []) walk(child);
      };
      walk(view.scenegraph().root);
      out[id] = counts;
    }
    return out;
  })()`)) as PageRender['marks'];
  if (screenshot) await page.screenshot({ path: screenshot as `${string}.png`, fullPage: true });
  const probed: unknown = probe === undefined ? undefined : await page.evaluate(probe);
  await page.close();
  return { rendered, consoleErrors, requests, marks, ...(probe === undefined ? {} : { probed }) };
}
