#!/usr/bin/env bash
# Runs the demo campaign, writes its report with the example p5en prices, and saves a screenshot
# of the page (rendered in headless Chromium) as docs/images/report.png — the README's picture.
#
#   scripts/report-screenshot.sh [--set key=value]...   (overrides for examples/demo.yaml)
#   scripts/report-screenshot.sh --campaign ID           (a campaign the last run left in the
#                                                         state folder: only report and picture)
#
# Needs what `npm run demo` needs (npm run setup) and the Debian chromium package. State goes to
# .moerl/report-demo; the dev server started here to read the history is stopped at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
STATE=.moerl/report-demo
PORT="${MOERL_REPORT_PORT:-7433}"
UI_PORT="${MOERL_REPORT_UI_PORT:-8433}"
moerl() { node bin/moerl.js "$@"; }

if [[ ${1:-} == --campaign ]]; then
  id="${2:?--campaign needs a campaign id}"
else
  rm -rf "$STATE"
  id="$(moerl demo --json --state-dir "$STATE" "$@" | tail -n 1 | node -e 'process.stdin.on("data", (d) => console.log(JSON.parse(d).campaign_id))')"
  echo "report-screenshot: demo campaign $id done"
fi

# node itself, not a subshell running the function: the trap must signal the dev server
node bin/moerl.js dev --state-dir "$STATE" --port "$PORT" --ui-port "$UI_PORT" >"$STATE/dev.out" 2>&1 &
dev=$!
trap 'kill -TERM "$dev" 2>/dev/null; wait "$dev" 2>/dev/null || true' EXIT
for _ in $(seq 60); do
  moerl list --address "127.0.0.1:$PORT" >/dev/null 2>&1 && break
  sleep 1
done

out=".moerl/reports/$id"
moerl report "$id" --address "127.0.0.1:$PORT" --ui "http://127.0.0.1:$UI_PORT" \
  --prices examples/prices/p5en.yaml --out "$out"
mkdir -p docs/images
# shellcheck disable=SC2016 # the script is JavaScript, not shell
node --input-type=module -e '
  const { renderPage, withBrowser } = await import(process.argv[1]);
  const page = await withBrowser((b) => renderPage(b, process.argv[2], process.argv[3]));
  if (page.rendered !== "ok" || page.consoleErrors.length) {
    console.error(`report-screenshot: the page did not render: ${JSON.stringify(page)}`);
    process.exit(1);
  }
' "$ROOT/dist/test/support/browser.js" "$ROOT/$out/report.html" "$ROOT/docs/images/report.png"
echo "report-screenshot: docs/images/report.png from $out/report.html"
