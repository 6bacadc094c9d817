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

describe('CoalescingTransport: batched reads (readBatchMs)', () => {
  /**
   * Publishes one message every 2 ms for `ms` on `subject` from a plain connection and counts, on
   * `reader`, in how many separate event-loop turns (macrotasks) they were delivered.
   */
  async function deliveries(reader: NatsConnection, subject: string, ms: number): Promise<{ messages: number; turns: number }> {
    let messages = 0;
    let turns = 0;
    let inTurn = false;
    reader.subscribe(subject, { callback: () => {
      messages += 1;
      if (inTurn) return;
      inTurn = true;
      turns += 1;
      setImmediate(() => { inTurn = false; });
    } });
    await reader.flush();
    const writer = await nats.connect(`writer-${subject}`);
    const end = Date.now() + ms;
    let sent = 0;
    while (Date.now() < end) {
      writer.publish(subject, String(sent++));
      await writer.flush();
      await new Promise((r) => setTimeout(r, 2));
    }
    await writer.flush();
    await new Promise((r) => setTimeout(r, 250));
    expect(messages).toBe(sent);
    return { messages, turns };
  }

  it('reads a busy connection about once per batch interval, losing nothing; an unbatched one reads far more often', async () => {
    const batched = await connectNats({ servers: nats.server.url, name: 'batched', readBatchMs: 100 });
    const plain = await connectNats({ servers: nats.server.url, name: 'plain' });
    try {
      const b = await deliveries(batched, 'batch.busy', 1_000);
      const p = await deliveries(plain, 'batch.busy.plain', 1_000);
      // ~1 s of traffic: about ten reads, plus the one after the last pause.
      expect(b.turns).toBeLessThanOrEqual(14);
      expect(p.turns).toBeGreaterThan(3 * b.turns);
    } finally {
      await batched.close();
      await plain.close();
    }
  });

  it('keeps up with far more than one socket read (64 KiB) per interval: everything arrives, in order, no slow-consumer drop', async () => {
    const nc = await connectNats({ servers: nats.server.url, name: 'batched-heavy', readBatchMs: 100 });
    const events: string[] = [];
    void (async () => {
      for await (const st of nc.status()) events.push(st.type);
    })();
    try {
      const N = 400;
      const got: number[] = [];
      let lastAt = 0;
      nc.subscribe('batch.heavy', { callback: (_e, m) => { got.push(Buffer.from(m.data.buffer, m.data.byteOffset, m.data.byteLength).readUInt32BE(0)); lastAt = Date.now(); } });
      await nc.flush();
      const writer = await nats.connect('writer-heavy');
      const payload = Buffer.alloc(20_000, 7);
      const t0 = Date.now();
      // 8 MB over ~1 s: ~800 KB per 100-ms rest, a dozen socket reads' worth.
      for (let i = 0; i < N; i++) {
        payload.writeUInt32BE(i, 0);
        writer.publish('batch.heavy', Buffer.from(payload));
        if (i % 40 === 39) {
          await writer.flush();
          await new Promise((r) => setTimeout(r, 100));
        }
      }
      await writer.flush();
      const deadline = Date.now() + 10_000;
      while (got.length < N && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(got).toEqual(Array.from({ length: N }, (_, i) => i));
      // Read as fast as it came (a pause per 64 KiB read would take ~12 s for this).
      expect(lastAt - t0).toBeLessThan(3_000);
      expect(events.filter((e) => e === 'disconnect' || e === 'slowConsumer')).toEqual([]);
    } finally {
      await nc.close();
    }
  });

  it('answers requests on a batched connection (at most a batch interval late) and keeps batching after a reconnect', async () => {
    const nc = await connectNats({ servers: nats.server.url, name: 'batched-reconnecting', readBatchMs: 100, reconnectTimeWaitMs: 100 });
    const responder = await nats.connect('responder');
    try {
      const answer = (): void => void responder.subscribe('batch.echo', { callback: (_e, m) => void m.respond(m.data) });
      answer();
      await responder.flush();
      const t0 = Date.now();
      expect((await nc.request('batch.echo', 'ping', { timeout: 5_000 })).string()).toBe('ping');
      expect(Date.now() - t0).toBeLessThan(1_000);
      const reconnected = nextStatus(nc, 'reconnect');
      await nats.server.restart();
      await reconnected;
      expect((nc as unknown as Internals).protocol.transport).toBeInstanceOf(CoalescingTransport);
      const b = await deliveries(nc, 'batch.after', 1_000);
      expect(b.turns).toBeLessThanOrEqual(14);
    } finally {
      await nc.close();
    }
  });
});
