// A scripted OpenAI-compatible rollout server for campaign tests (a fake): healthy, taking any
// weights, and answering each completion request with what `answer` makes of its body.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface FakeRolloutServer {
  url: string;
  close(): Promise<void>;
}

/**
 * `answer` gets the parsed body of a POST /v1/completions and returns the answer's JSON text,
 * or a promise of it (one that never settles holds the request, as a server mid-generation).
 */
export async function startFakeRolloutServer(
  answer: (body: unknown) => string | Promise<string>,
): Promise<FakeRolloutServer> {
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      res.setHeader('content-type', 'application/json');
      if (req.url === '/health') return res.end('{"status":"ok"}');
      if (req.url === '/update_weights_from_disk') return res.end('{"success":true}');
      void Promise.resolve(answer(JSON.parse(body))).then((text) => res.end(text));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
