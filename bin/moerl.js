#!/usr/bin/env node
// The `moerl` command: a shim over the compiled CLI in dist/.
import { existsSync } from 'node:fs';

const entry = new URL('../dist/cli/main.js', import.meta.url);
if (!existsSync(entry)) {
  console.error('moerl: the CLI is not built yet; run "npm run build" in the moerl repository first');
  process.exit(1);
}
const { main } = await import(entry.href);
process.exitCode = await main(process.argv.slice(2));
