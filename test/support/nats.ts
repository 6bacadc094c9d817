// Test helper: a real nats-server (JetStream, fsync always) in a fresh temp dir, plus a
// connection factory. Integration tests use this instead of any mock (tests run real parts; a fake only at a named seam).
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { NatsConnection } from '@nats-io/transport-node';
import { connectNats } from '../../src/store/connection.ts';
import { LocalNatsServer, type LocalNatsServerOptions } from '../../src/store/local-nats-server.ts';
import type { NatsAuthOptions } from '../../src/store/nats-auth.ts';

export interface TestNats {
  readonly server: LocalNatsServer;
  readonly dir: string;
  /**
   * A new client connection, closed by cleanup(); `auth` when the server was started with `users`;
   * `readBatchMs` reads it in batches (connection.ts), as the control plane's heartbeat connection.
   */
  connect(name?: string, auth?: NatsAuthOptions, readBatchMs?: number): Promise<NatsConnection>;
  /** Close every connection made by connect(), stop the server, delete the temp dir. */
  cleanup(): Promise<void>;
}

export async function startTestNats(opts: Partial<Omit<LocalNatsServerOptions, 'storeDir' | 'workDir'>> = {}): Promise<TestNats> {
  const dir = await mkdtemp(join(tmpdir(), 'sf-nats-'));
  const server = await LocalNatsServer.start({ storeDir: join(dir, 'store'), workDir: dir, startTimeoutMs: 20_000, ...opts });
  const connections: NatsConnection[] = [];
  return {
    server,
    dir,
    async connect(name = 'test', auth?: NatsAuthOptions, readBatchMs?: number) {
      const nc = await connectNats({ servers: server.url, name, ...(auth !== undefined ? { auth } : {}), ...(readBatchMs !== undefined ? { readBatchMs } : {}) });
      connections.push(nc);
      return nc;
    },
    async cleanup() {
      await Promise.allSettled(connections.map((nc) => nc.close()));
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Resolves at the next status event of `type` on `nc` (e.g. 'reconnect'); arm it BEFORE causing
 * the event. Requests issued while a connection is between servers are not answered after it
 * reconnects (they time out), so tests wait for the reconnect before reusing a connection.
 */
export function nextStatus(nc: NatsConnection, type: string, timeoutMs = 15_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no '${type}' status within ${timeoutMs} ms`)), timeoutMs);
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === type) {
          clearTimeout(timer);
          resolve();
          return;
        }
      }
    })();
  });
}
