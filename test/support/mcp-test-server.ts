// A real MCP server for the tests (the official SDK's McpServer), over stdio or, with --http,
// streamable HTTP on a loopback port it prints as `url <url>`. Its tools: `calculator` (sums and
// differences of integers, exact; declared idempotent), `charge` (declared nothing: not
// idempotent), `echo`, and `env` (the value of one of its environment variables: what a stdio
// server was given). calculator misbehaves when its expression is one of: `hang` never answers,
// `garbage` writes a line that is not JSON-RPC, `bad-result` answers a result that is not a
// CallToolResult, `crash` exits. --calls-file appends each calculator and charge call as a JSON
// line with its idempotency key (a counting tool); --hang-once TOOL makes the first call of TOOL
// with given arguments and key never answer, remembered across restarts in --state-dir;
// --require-header NAME=VALUE answers 401 to HTTP requests without it.
import { createHash } from 'node:crypto';
import { appendFileSync, existsSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

const { values: opts } = parseArgs({
  options: {
    http: { type: 'boolean', default: false },
    'calls-file': { type: 'string' },
    'require-header': { type: 'string' },
    'hang-once': { type: 'string' },
    'state-dir': { type: 'string' },
  },
});

/** Appends the call to --calls-file; true when this call is to hang (--hang-once). */
function counted(tool: string, args: unknown, meta: Record<string, unknown> | undefined): boolean {
  const key = meta?.['moerl/idempotency-key'];
  if (opts['calls-file']) appendFileSync(opts['calls-file'], JSON.stringify({ tool, args, key }) + '\n');
  if (opts['hang-once'] !== tool) return false;
  const marker = join(
    opts['state-dir']!,
    createHash('sha256')
      .update(JSON.stringify([tool, args, key]))
      .digest('hex'),
  );
  if (existsSync(marker)) return false;
  writeFileSync(marker, '');
  return true;
}

function evaluate(expression: string): string {
  if (!/^\s*-?\d+(\s*[-+]\s*-?\d+)*\s*$/.test(expression)) throw new Error(`cannot evaluate ${expression}`);
  const terms = expression.replace(/\s+/g, '').match(/[-+]?-?\d+/g)!;
  return String(terms.reduce((sum, t) => sum + BigInt(t), 0n));
}

function mcpServer(): McpServer {
  const server = new McpServer({ name: 'moerl-test-tools', version: '1' });
  server.registerTool(
    'calculator',
    {
      description: 'Adds and subtracts integers exactly',
      inputSchema: { expression: z.string() },
      annotations: { idempotentHint: true },
    },
    async ({ expression }, extra) => {
      if (counted('calculator', { expression }, extra._meta) || expression === 'hang')
        return new Promise(() => {});
      if (expression === 'garbage') {
        process.stdout.write('this line is not JSON-RPC\n');
        return new Promise(() => {});
      }
      if (expression === 'bad-result') {
        process.stdout.write(
          JSON.stringify({ jsonrpc: '2.0', id: extra.requestId, result: { content: 'not a list' } }) + '\n',
        );
        return new Promise(() => {});
      }
      if (expression === 'crash') process.exit(3);
      try {
        return { content: [{ type: 'text', text: evaluate(expression) }] };
      } catch (err) {
        return { content: [{ type: 'text', text: (err as Error).message }], isError: true };
      }
    },
  );
  server.registerTool(
    'charge',
    { description: 'Charges an amount (each call charges again)', inputSchema: { amount: z.number() } },
    async ({ amount }, extra) => {
      if (counted('charge', { amount }, extra._meta)) return new Promise(() => {});
      return { content: [{ type: 'text', text: `charged ${amount}` }] };
    },
  );
  server.registerTool(
    'echo',
    { description: 'Answers its text', inputSchema: { text: z.string() } },
    async ({ text }) => ({ content: [{ type: 'text', text }] }),
  );
  server.registerTool(
    'env',
    { description: 'The value of an environment variable', inputSchema: { name: z.string() } },
    async ({ name }) => ({ content: [{ type: 'text', text: process.env[name] ?? '(unset)' }] }),
  );
  return server;
}

if (!opts.http) {
  await mcpServer().connect(new StdioServerTransport());
} else {
  const [header, value] = opts['require-header']?.split('=') ?? [];
  // Stateless: a server and a transport per request, as the SDK's stateless example has it.
  const http = createServer((req, res) => {
    void (async () => {
      if (header !== undefined && req.headers[header.toLowerCase()] !== value) {
        res.writeHead(401).end('unauthorized');
        return;
      }
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const body = chunks.length
        ? (JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown)
        : undefined;
      const server = mcpServer();
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
      res.on('close', () => void Promise.all([transport.close(), server.close()]));
      await server.connect(transport);
      await transport.handleRequest(req, res, body);
    })();
  });
  http.listen(0, '127.0.0.1', () => {
    const { port } = http.address() as AddressInfo;
    process.stdout.write(`url http://127.0.0.1:${port}/mcp\n`);
  });
}
