// The coalescing NATS transport (src/store/coalescing-transport.ts) against a real nats-server:
// frames written across many microtask turns of one event-loop turn leave in ONE socket write, in
// order; nothing written just before close() is lost; a reconnect gets a working transport again.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatsConnection } from '@nats-io/transport-node';
import { CoalescingTransport } from '../../../src/store/coalescing-transport.ts';
import { connectNats } from '../../../src/store/connection.ts';
import { nextStatus, startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;

beforeAll(async () => {
  nats = await startTestNats();
});

afterAll(async () => {
  await nats?.cleanup();
});

interface Internals {
  protocol: { transport: CoalescingTransport & { socket: { _write: (...a: unknown[]) => unknown; _writev: (...a: unknown[]) => unknown } } };
}

/** Counts the socket writes (syscall-level: _write / _writev) a connection makes from now on. */
function countWrites(nc: NatsConnection): { readonly count: () => number } {
  const { transport } = (nc as unknown as Internals).protocol;
  expect(transport).toBeInstanceOf(CoalescingTransport);
  const socket = transport.socket;
  let n = 0;
  const write = socket._write.bind(socket);
  const writev = socket._writev.bind(socket);
  socket._write = (...a: unknown[]) => { n += 1; return write(...a); };
  socket._writev = (...a: unknown[]) => { n += 1; return writev(...a); };
  return { count: () => n };
}

/** Collects the payloads of `subject` on a separate connection until `n` have arrived. */
async function collect(subject: string, n: number): Promise<{ done: Promise<string[]> }> {
  const collector = await nats.connect('collector');
  const sub = collector.subscribe(subject, { max: n, timeout: 10_000 });
  await collector.flush(); // the server has the subscription before anyone publishes
  const done = (async () => {
    const got: string[] = [];
    for await (const m of sub) got.push(m.string());
    return got;
  })();
  return { done };
}

describe('CoalescingTransport', () => {
  it('sends the frames of one event-loop turn in one socket write, in order', async () => {
    const nc = await nats.connect('coalescing-writer');
    await nc.flush();
    const N = 50;
    const { done } = await collect('coalesce.order', N);
    const writes = countWrites(nc);
    // One macrotask, N microtask turns: nats.js alone would flush (write) once per turn.
    await new Promise<void>((resolve) => {
      setImmediate(async () => {
        for (let i = 0; i < N; i++) {
          nc.publish('coalesce.order', String(i));
          await Promise.resolve();
          await Promise.resolve();
        }
        resolve();
      });
    });
    await nc.flush();
    // N publishes in one writev, plus the PING of flush() in a later loop turn.
    expect(writes.count()).toBeLessThanOrEqual(2);
    expect(await done).toEqual(Array.from({ length: N }, (_, i) => String(i)));
  });

  it('writes frames of separate event-loop turns without waiting for anything else', async () => {
    const nc = await nats.connect('coalescing-turns');
    await nc.flush();
    const writes = countWrites(nc);
    for (let i = 0; i < 5; i++) {
      nc.publish('coalesce.turns', String(i));
      await new Promise((r) => setTimeout(r, 5));
    }
    expect(writes.count()).toBe(5);
  });

  it('delivers everything published right before close()', async () => {
    const nc = await connectNats({ servers: nats.server.url, name: 'closing' });
    const N = 20;
    const { done } = await collect('coalesce.close', N);
    for (let i = 0; i < N; i++) {
      nc.publish('coalesce.close', String(i));
      await Promise.resolve();
    }
    await nc.close();
    expect(await done).toEqual(Array.from({ length: N }, (_, i) => String(i)));
  });

  it('keeps working after the server restarts (a new transport per reconnect)', async () => {
    const nc = await connectNats({ servers: nats.server.url, name: 'reconnecting', reconnectTimeWaitMs: 100 });
    try {
      const reconnected = nextStatus(nc, 'reconnect');
      await nats.server.restart();
      await reconnected;
      const { done } = await collect('coalesce.after', 3);
      for (let i = 0; i < 3; i++) nc.publish('coalesce.after', String(i));
      await nc.flush();
      expect((nc as unknown as Internals).protocol.transport).toBeInstanceOf(CoalescingTransport);
      expect(await done).toEqual(['0', '1', '2']);
    } finally {
      await nc.close();
    }
  });
});
