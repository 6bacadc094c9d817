// A tiny HTTP listener for operators and kubelet probes: /healthz (process alive),
// /readyz (dependencies usable, from a caller-supplied check) and /metrics (Prometheus text).
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';

export interface OpsServerOptions {
  readonly host: string;
  readonly port: number;
  readonly registry: Registry;
  /** Returns undefined when ready, or a short reason when not. Must be cheap and bounded. */
  readonly readiness: () => Promise<string | undefined>;
}

export interface OpsServer {
  readonly url: string;
  close(): Promise<void>;
}

export async function startOpsServer(options: OpsServerOptions): Promise<OpsServer> {
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const reply = (status: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, { 'content-type': type });
      res.end(body);
    };
    if (req.method !== 'GET') return reply(405, 'method not allowed\n');
    if (path === '/healthz') return reply(200, 'ok\n');
    if (path === '/readyz') {
      options.readiness().then(
        (reason) => (reason === undefined ? reply(200, 'ready\n') : reply(503, `not ready: ${reason}\n`)),
        (err: unknown) => reply(503, `not ready: ${err instanceof Error ? err.message : String(err)}\n`),
      );
      return;
    }
    if (path === '/metrics') {
      options.registry.metrics().then(
        (text) => reply(200, text, options.registry.contentType),
        () => reply(500, 'metrics unavailable\n'),
      );
      return;
    }
    reply(404, 'not found\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => resolve());
  });
  const { address, port } = server.address() as AddressInfo;
  return {
    url: `http://${address}:${port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
