// Heartbeats reach the control plane on a connection of their own (control-plane.ts), so a replica
// can lose that connection while its main one stays up. Heartbeats it cannot receive say nothing
// about the hosts, so while either connection is down no host may be judged by its silence: with a
// real nats-server, a real dockerd host and a real agent heartbeating throughout, the plane's
// heartbeat connection goes through a TCP relay this test owns (the one seam: the relay is cut and
// re-opened; nothing about NATS is faked). Cut for longer than TTL + dead grace, the host stays
// READY; back, the heartbeats flow again and it stays READY. Then, with both connections up, the
// agent stops: the same silence makes the host DEAD, so the first part is not a test that cannot fail.
import { createServer, connect as tcpConnect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HEARTBEAT_READ_BATCH_MS, type ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { connectNats } from '../../../src/store/connection.ts';
import { startFleet, type Fleet } from './fleet-harness.ts';

/** A TCP relay to the nats-server that can be cut (every piped socket destroyed, no listener) and re-opened on the same port. */
class CuttableRelay {
  #server: Server | undefined;
  readonly #sockets = new Set<Socket>();
  port = 0;

  constructor(private readonly target: { host: string; port: number }) {}

  async open(): Promise<void> {
    const server = createServer((client) => {
      const upstream = tcpConnect(this.target.port, this.target.host);
      for (const s of [client, upstream]) {
        this.#sockets.add(s);
        s.on('close', () => this.#sockets.delete(s));
        s.on('error', () => undefined);
      }
      client.pipe(upstream).pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.port = (server.address() as AddressInfo).port;
    this.#server = server;
  }

  async cut(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    for (const s of this.#sockets) s.destroy();
    if (server !== undefined) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

let fleet: Fleet;
let plane: ControlPlane;
let relay: CuttableRelay;
let heartbeatNc: NatsConnection;

beforeAll(async () => {
  fleet = await startFleet(1);
  const url = new URL(fleet.nats.server.url.replace(/^nats:/, 'http:'));
  relay = new CuttableRelay({ host: url.hostname, port: Number(url.port) });
  await relay.open();
  heartbeatNc = await connectNats({ servers: `nats://127.0.0.1:${relay.port}`, name: 'control-plane-heartbeats-relayed', readBatchMs: HEARTBEAT_READ_BATCH_MS, reconnectTimeWaitMs: 250 });
  plane = await fleet.startPlane({ heartbeatNc });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined), 60_000);
  await fleet.waitFor('host-a heartbeating', async () => (plane.fleet.heartbeat('host-a') !== undefined ? true : undefined), 30_000);
}, 240_000);

afterAll(async () => {
  await relay?.cut();
  await heartbeatNc?.close().catch(() => undefined);
  await fleet?.cleanup();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('the heartbeat connection lost while the main one stays up', () => {
  it('judges no host by the silence it causes; a host really silent is still declared DEAD', async () => {
    const { heartbeatTtlMs, deadGraceMs } = fleet.config;
    const silenceMs = heartbeatTtlMs + deadGraceMs + 3_000;
    const seqBefore = plane.fleet.heartbeat('host-a')!.sequence;

    await relay.cut();
    await sleep(silenceMs);
    // The cut was real: no heartbeat got through, and the main connection still reads the store.
    const seqDuring = plane.fleet.heartbeat('host-a')!.sequence;
    expect(seqDuring - seqBefore).toBeLessThanOrEqual(2);
    expect((await fleet.host('host-a')).lifecycle.state).toBe('READY');

    await relay.open();
    await fleet.waitFor('heartbeats through again', async () => (plane.fleet.heartbeat('host-a')!.sequence > seqDuring + 2 ? true : undefined), 30_000);
    await sleep(heartbeatTtlMs);
    expect((await fleet.host('host-a')).lifecycle.state).toBe('READY');
    const { events } = await fleet.store.events.read({ subjectKind: 'host', subjectId: 'host-a', limit: 1000 });
    expect(events.map((e) => e.event.type).filter((t) => t === 'host_heartbeat_missed' || t === 'host_declared_dead')).toEqual([]);

    // The control: the same silence, with both connections up, is a dead host.
    const stoppedAt = Date.now();
    await fleet.stopAgent('host-a');
    await fleet.waitFor('host-a DEAD', async () => ((await fleet.host('host-a')).lifecycle.state === 'DEAD' ? true : undefined), silenceMs + 10_000);
    expect(Date.now() - stoppedAt).toBeLessThan(silenceMs + 10_000);
  }, 120_000);
});
