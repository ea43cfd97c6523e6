// The test MCP server (mcp-test-server.ts) as a stdio command for a spec, or started as a
// streamable HTTP server in a process group of its own, its URL read from its log.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { spawnGroup, type GroupProcess } from './process-group.js';

const serverScript = fileURLToPath(new URL('./mcp-test-server.js', import.meta.url));

/** The argv of a stdio test server. */
export function mcpTestServerCommand(...args: string[]): string[] {
  return [process.execPath, serverScript, ...args];
}

export interface McpHttpServer {
  url: string;
  process: GroupProcess;
}

/** Starts the test server on a loopback port; `logFile` takes its output. */
export async function startMcpHttpServer(logFile: string, ...args: string[]): Promise<McpHttpServer> {
  const proc = spawnGroup('mcp-test-server', process.execPath, [serverScript, '--http', ...args], logFile);
  for (let waited = 0; waited < 60_000; waited += 50) {
    const url = /^url (\S+)$/m.exec(readFileSync(logFile, 'utf8').slice(proc.logStart))?.[1];
    if (url) return { url, process: proc };
    if (proc.exitReason) break;
    await sleep(50);
  }
  await proc.stop(1000);
  throw new Error(
    `the MCP test server did not print its url (${proc.exitReason ?? 'still running'}); see ${logFile}`,
  );
}
