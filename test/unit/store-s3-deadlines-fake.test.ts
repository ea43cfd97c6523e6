// Every read from the S3 store has a deadline, against a fake server (a plain HTTP server, no
// S3) that holds a request open by sending its answer's header one byte a second: the idle
// limit alone never fires on it, so a read once waited as long as the server liked.
import assert from 'node:assert/strict';
import { createServer, type Server, type Socket } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { S3Store } from '../../activities/store/index.js';
import { within } from '../support/campaign-harness.js';

let server: Server;
let endpoint: string;
const sockets = new Set<Socket>();

describe('S3 store deadlines (fake server)', () => {
  before(async () => {
    server = createServer((socket) => {
      const header = Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Padding: ' + 'x'.repeat(10_000));
      let sent = 0;
      const timer = setInterval(() => {
        if (socket.destroyed) return clearInterval(timer);
        socket.write(header.subarray(sent, ++sent));
      }, 1_000);
      sockets.add(socket);
      socket.on('error', () => undefined);
      socket.on('close', () => clearInterval(timer));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    endpoint = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
  });
  after(() => {
    for (const socket of sockets) socket.destroy();
    server.close();
  });

  const store = () =>
    new S3Store(
      { bucket: 'b', prefix: '', region: 'us-east-1', endpoint, forcePathStyle: true },
      { credentials: { accessKeyId: 'a', secretAccessKey: 's' }, maxAttempts: 1, answerTimeoutMs: 3_000 },
    );

  for (const [what, read] of [
    ['get', (s: S3Store) => s.get('k')],
    ['head', (s: S3Store) => s.head('k')],
    ['list', (s: S3Store) => s.list('')[Symbol.asyncIterator]().next()],
  ] as const)
    test(`${what}: an answer held open past the answer limit fails the read, retryable, naming the store`, async () => {
      const s = store();
      const failure = await within(
        `the ${what} read to end`,
        60_000,
        read(s).then(
          () => undefined,
          (err: unknown) => err,
        ),
      );
      assert.ok(failure instanceof Error, `the read failed: ${String(failure)}`);
      assert.match(failure.message, /s3:\/\/b\//);
      assert.match(failure.message, /requestTimeout|timed out/i);
      assert.equal((failure as { retryable?: boolean }).retryable, true);
    });
});
