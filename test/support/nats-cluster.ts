// Test helper: a real 3-node NATS JetStream cluster on loopback — three nats-server processes with
// routes to each other, JetStream on each with its own store dir, fsync as shipped (`sync_interval:
// always`, local-nats-server.ts) — plus fault injection on one node at a time: SIGKILL and restart
// on the same ports and data (a crashed server), SIGSTOP/SIGCONT (a frozen one: sockets stay open,
// nothing answers, its Raft peers see no heartbeats), and a stream leader step-down (a leader change
// without a death). Tests and the chaos runner (bench/chaos) use it for the production shape: R3
// buckets and streams (StateStore/ChunkStore `replicas: 3`), clients on the seed list `urls`.
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { jetstreamManager } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { connectNats, type ConnectNatsOptions } from '../../src/store/connection.ts';
import { LocalNatsServer, type FsyncPolicy } from '../../src/store/local-nats-server.ts';

export interface ClusterNode {
  /** nats-server `server_name` (sf-n1, sf-n2, sf-n3): what stream info names as leader/replica. */
  readonly name: string;
  readonly index: number;
  readonly server: LocalNatsServer;
  readonly url: string;
  readonly monitorUrl: string;
  /** Running and not frozen. */
  readonly up: boolean;
  readonly frozen: boolean;
  /** SIGKILL, wait for the exit: nothing flushed, no leadership handed over. */
  kill(): Promise<void>;
  /** Start again on the same ports and store dir (after kill() or stop()). */
  restart(): Promise<void>;
  /** SIGSTOP: the process is frozen with its sockets open. */
  freeze(): void;
  /** SIGCONT after freeze(). */
  thaw(): void;
}

export interface NatsCluster {
  readonly name: string;
  readonly nodes: readonly ClusterNode[];
  /** The seed list every client gets (all members, client ports). */
  readonly urls: readonly string[];
  readonly dir: string;
  /** A client on the seed list, closed by cleanup(). */
  connect(name?: string, extra?: Partial<ConnectNatsOptions>): Promise<NatsConnection>;
  /** The node named as `stream`'s leader by the cluster, if one is elected. */
  streamLeader(nc: NatsConnection, stream: string): Promise<ClusterNode | undefined>;
  /** Ask `stream`'s leader to step down (a new leader is elected among the replicas); resolves with the new leader. */
  stepDownStream(nc: NatsConnection, stream: string, timeoutMs?: number): Promise<ClusterNode>;
  /** The JetStream meta leader, from any live node's /jsz. */
  metaLeader(): Promise<ClusterNode | undefined>;
  /** Resolves once every live node reports healthy (/healthz: JetStream current, every stream and consumer it holds caught up). */
  waitHealthy(timeoutMs?: number): Promise<void>;
  /** Thaw frozen nodes, stop every node, delete the store dirs. */
  cleanup(): Promise<void>;
}

export interface NatsClusterOptions {
  readonly size?: 3 | 5;
  readonly fsync?: FsyncPolicy;
  readonly startTimeoutMs?: number;
}

/** Free loopback ports, taken at once so no two are the same (a port may still be raced by another process). */
async function freePorts(n: number): Promise<number[]> {
  const servers = await Promise.all(Array.from({ length: n }, () => new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => resolve(s));
  })));
  const ports = servers.map((s) => (s.address() as { port: number }).port);
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

async function getJson(url: string): Promise<unknown> {
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  return res.json();
}

export async function startNatsCluster(opts: NatsClusterOptions = {}): Promise<NatsCluster> {
  const size = opts.size ?? 3;
  const dir = await mkdtemp(join(tmpdir(), 'sf-nats-cluster-'));
  const name = 'sf-test';
  const ports = await freePorts(size * 3);
  const clientPorts = ports.slice(0, size);
  const routePorts = ports.slice(size, 2 * size);
  const monitorPorts = ports.slice(2 * size);
  const routes = routePorts.map((p) => `nats-route://127.0.0.1:${p}`);
  const connections: NatsConnection[] = [];

  const nodes: ClusterNode[] = Array.from({ length: size }, (_, i) => {
    const server = new LocalNatsServer({
      storeDir: join(dir, `n${i + 1}`, 'store'),
      workDir: join(dir, `n${i + 1}`),
      serverName: `sf-n${i + 1}`,
      port: clientPorts[i]!,
      monitorPort: monitorPorts[i]!,
      cluster: { name, port: routePorts[i]!, routes: routes.filter((_, j) => j !== i) },
      startTimeoutMs: opts.startTimeoutMs ?? 30_000,
      ...(opts.fsync !== undefined ? { fsync: opts.fsync } : {}),
    });
    let frozen = false;
    return {
      name: `sf-n${i + 1}`,
      index: i,
      server,
      url: `nats://127.0.0.1:${clientPorts[i]}`,
      monitorUrl: `http://127.0.0.1:${monitorPorts[i]}`,
      get up() {
        return server.running && !frozen;
      },
      get frozen() {
        return frozen;
      },
      async kill() {
        frozen = false;
        await server.kill();
      },
      async restart() {
        frozen = false;
        if (server.running) await server.stop();
        await server.start();
      },
      freeze() {
        server.signal('SIGSTOP');
        frozen = true;
      },
      thaw() {
        if (!frozen) return;
        server.signal('SIGCONT');
        frozen = false;
      },
    };
  });

  const byName = (n: string | undefined): ClusterNode | undefined => nodes.find((x) => x.name === n);

  const cluster: NatsCluster = {
    name,
    nodes,
    urls: nodes.map((n) => n.url),
    dir,
    async connect(clientName = 'test', extra = {}) {
      const nc = await connectNats({ servers: cluster.urls, name: clientName, ...extra });
      connections.push(nc);
      return nc;
    },
    async streamLeader(nc, stream) {
      const jsm = await jetstreamManager(nc);
      const info = await jsm.streams.info(stream);
      return byName(info.cluster?.leader);
    },
    async stepDownStream(nc, stream, timeoutMs = 30_000) {
      const before = await cluster.streamLeader(nc, stream);
      const deadline = Date.now() + timeoutMs;
      let asked = false;
      for (;;) {
        if (!asked) {
          // The JetStream API's own leader step-down (what `nats stream cluster step-down` sends).
          const reply = await nc.request(`$JS.API.STREAM.LEADER.STEPDOWN.${stream}`, undefined, { timeout: 5_000 }).catch(() => undefined);
          const body = reply === undefined ? undefined : (reply.json() as { success?: boolean; error?: unknown });
          asked = body?.success === true;
        }
        const now = await cluster.streamLeader(nc, stream).catch(() => undefined);
        if (asked && now !== undefined && now !== before) return now;
        if (Date.now() > deadline) throw new Error(`stream ${stream}: leader did not change from ${before?.name ?? 'none'} within ${timeoutMs} ms`);
        await sleep(200);
      }
    },
    async metaLeader() {
      for (const n of nodes) {
        if (!n.up) continue;
        try {
          const jsz = (await getJson(`${n.monitorUrl}/jsz`)) as { meta_cluster?: { leader?: string } };
          const leader = byName(jsz.meta_cluster?.leader);
          if (leader !== undefined) return leader;
        } catch {
          // try the next node
        }
      }
      return undefined;
    },
    async waitHealthy(timeoutMs = 60_000) {
      const deadline = Date.now() + timeoutMs;
      let last = '';
      for (;;) {
        const live = nodes.filter((n) => n.up);
        const states = await Promise.all(live.map(async (n) => {
          try {
            const res = await fetch(`${n.monitorUrl}/healthz`, { signal: AbortSignal.timeout(2000) });
            return res.ok ? undefined : `${n.name}: ${(await res.text()).slice(0, 200)}`;
          } catch (err) {
            return `${n.name}: ${(err as Error).message}`;
          }
        }));
        const bad = states.filter((s): s is string => s !== undefined);
        if (bad.length === 0 && (await cluster.metaLeader()) !== undefined) return;
        last = bad.join('; ') || 'no meta leader';
        if (Date.now() > deadline) throw new Error(`NATS cluster not healthy within ${timeoutMs} ms: ${last}`);
        await sleep(250);
      }
    },
    async cleanup() {
      await Promise.allSettled(connections.map((nc) => nc.close()));
      for (const n of nodes) if (n.frozen) n.thaw();
      await Promise.allSettled(nodes.map((n) => n.server.stop()));
      await rm(dir, { recursive: true, force: true });
    },
  };

  try {
    // Started together: each waits for its routes only in the background, and a JetStream cluster
    // elects its meta leader once a majority of servers is up.
    await Promise.all(nodes.map((n) => n.server.start()));
    await cluster.waitHealthy(opts.startTimeoutMs ?? 60_000);
  } catch (err) {
    await cluster.cleanup().catch(() => undefined);
    throw err;
  }
  return cluster;
}
