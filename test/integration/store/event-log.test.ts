// EventLog against a real nats-server: total order by stream sequence under concurrent appends,
// dedup by event id, filtered reads, follow(), and validation (R-R1, R-R4, R-I7).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StateStore } from '../../../src/store/connection.ts';
import { RecordInvalidError, RecordTooLargeError } from '../../../src/store/errors.ts';
import type { FleetEvent, SequencedEvent } from '../../../src/store/event-log.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;
let store: StateStore;

beforeAll(async () => {
  nats = await startTestNats();
  store = await StateStore.open(await nats.connect('events-test'));
});

afterAll(async () => {
  await nats?.cleanup();
});

function ev(id: string, over: Partial<FleetEvent> = {}): FleetEvent {
  return { id, timeMs: 1_700_000_000_000, actor: 'control-plane/test', subjectKind: 'group', subjectId: 'g1', type: 'state_changed', ...over };
}

describe('EventLog', () => {
  it('gives concurrent appends strictly increasing sequences and reads them back in order', async () => {
    const writers = await Promise.all(Array.from({ length: 3 }, async (_, i) => (await StateStore.open(await nats.connect(`ew${i}`))).events));
    const N = 60;
    const acks = await Promise.all(
      Array.from({ length: N }, (_, i) => (writers[i % writers.length] ?? store.events).append(ev(`conc-${i}`, { subjectId: `g${i % 4}`, detail: { i } }))),
    );
    const seqs = acks.map((a) => a.seq);
    expect(new Set(seqs).size).toBe(N);
    expect(acks.every((a) => !a.duplicate)).toBe(true);
    const { events, invalid, nextSeq } = await store.events.read({ limit: 1000 });
    expect(invalid).toEqual([]);
    expect(events).toHaveLength(N);
    const readSeqs = events.map((e) => e.seq);
    expect(readSeqs).toEqual([...readSeqs].sort((a, b) => a - b));
    for (let i = 1; i < readSeqs.length; i++) expect(readSeqs[i]).toBeGreaterThan(readSeqs[i - 1] as number);
    expect(nextSeq).toBe(Math.max(...seqs) + 1);
    // Each append's ack names the sequence its event was stored at.
    const bySeq = new Map(events.map((e) => [e.seq, e.event.id]));
    acks.forEach((a, i) => expect(bySeq.get(a.seq)).toBe(`conc-${i}`));
  });

  it('pages with fromSeq/limit and filters by subject kind and id', async () => {
    const page1 = await store.events.read({ limit: 25 });
    const page2 = await store.events.read({ fromSeq: page1.nextSeq, limit: 25 });
    expect(page1.events).toHaveLength(25);
    expect(page2.events[0]?.seq).toBe(page1.nextSeq);
    const g2 = await store.events.read({ subjectKind: 'group', subjectId: 'g2', limit: 1000 });
    expect(g2.events).toHaveLength(15);
    expect(g2.events.every((e) => e.event.subjectId === 'g2')).toBe(true);
    await store.events.append(ev('host-1', { subjectKind: 'host', subjectId: 'g2', type: 'registered' }));
    expect((await store.events.read({ subjectKind: 'host' })).events.map((e) => e.event.id)).toEqual(['host-1']);
    expect((await store.events.read({ subjectId: 'g2', limit: 1000 })).events).toHaveLength(16);
    expect((await store.events.read({ subjectKind: 'member' })).events).toEqual([]);
    await expect(store.events.read({ subjectKind: 'group.>' })).rejects.toThrow();
    await expect(store.events.read({ subjectId: '*' })).rejects.toThrow();
    await expect(store.events.read({ limit: 1001 })).rejects.toBeInstanceOf(RangeError);
  });

  it('deduplicates by event id: a retried append returns the original sequence', async () => {
    const first = await store.events.append(ev('dedup-1', { type: 'lost', reason: 'no_checkpoint' }));
    await store.events.append(ev('dedup-other'));
    const again = await Promise.all([store.events.append(ev('dedup-1', { type: 'lost', reason: 'no_checkpoint' })), store.events.append(ev('dedup-1'))]);
    expect(again).toEqual([
      { seq: first.seq, duplicate: true },
      { seq: first.seq, duplicate: true },
    ]);
    const all = await store.events.read({ fromSeq: first.seq, limit: 1000 });
    expect(all.events.filter((e) => e.event.id === 'dedup-1')).toHaveLength(1);
  });

  it('rejects invalid and oversized events before they reach the stream', async () => {
    const before = (await store.events.read({ limit: 1000 })).nextSeq;
    await expect(store.events.append(ev('bad id with spaces'))).rejects.toBeInstanceOf(RecordInvalidError);
    await expect(store.events.append(ev('x1', { subjectId: 'a.b' }))).rejects.toMatchObject({ reason: 'record_invalid' });
    await expect(store.events.append(ev('x2', { subjectKind: 'Group' }))).rejects.toMatchObject({ reason: 'record_invalid' });
    await expect(store.events.append({ ...ev('x3'), timeMs: -1 })).rejects.toMatchObject({ reason: 'record_invalid' });
    const big = await store.events.append(ev('x4', { detail: { blob: 'y'.repeat(20_000) } })).catch((e: unknown) => e);
    expect(big).toBeInstanceOf(RecordTooLargeError);
    expect((await store.events.read({ fromSeq: before })).events).toEqual([]);
  });

  it('reports a corrupt message injected into the stream instead of failing the read', async () => {
    const ack = await store.js.publish('sf.events.group.g9', new TextEncoder().encode('{"id":'));
    const misfiled = await store.js.publish('sf.events.group.g9', new TextEncoder().encode(JSON.stringify(ev('misfiled', { subjectId: 'g8' }))));
    await store.events.append(ev('after-corrupt', { subjectId: 'g9' }));
    const r = await store.events.read({ subjectId: 'g9' });
    expect(r.invalid.map((i) => i.seq)).toEqual([ack.seq, misfiled.seq]);
    expect(r.invalid.every((i) => i.error.reason === 'record_invalid')).toBe(true);
    expect(r.events.map((e) => e.event.id)).toEqual(['after-corrupt']);
  });

  it('follow() yields appended events in order, from a sequence or from now', async () => {
    const start = (await store.events.read({ limit: 1000 })).nextSeq;
    const fromStart: SequencedEvent[] = [];
    const fromNow: SequencedEvent[] = [];
    const ac = new AbortController();
    const a = (async () => {
      for await (const e of store.events.follow({ fromSeq: start, subjectKind: 'member', subjectId: 'm1', signal: ac.signal })) {
        fromStart.push(e);
        if (fromStart.length === 5) break;
      }
    })();
    await store.events.append(ev('f-0', { subjectKind: 'member', subjectId: 'm1' }));
    const b = (async () => {
      for await (const e of store.events.follow({ subjectKind: 'member', signal: ac.signal })) fromNow.push(e);
    })();
    // "From now" starts whenever its consumer exists: probe until it sees something.
    for (let i = 0; fromNow.length === 0; i++) {
      expect(i).toBeLessThan(200);
      await store.events.append(ev(`probe-${i}`, { subjectKind: 'member', subjectId: 'probe' }));
      await new Promise((r) => setTimeout(r, 25));
    }
    for (let i = 1; i < 5; i++) {
      await store.events.append(ev(`f-${i}`, { subjectKind: 'member', subjectId: 'm1' }));
      await store.events.append(ev(`noise-${i}`, { subjectKind: 'host', subjectId: 'h1' }));
    }
    await a;
    const real = (): string[] => fromNow.map((e) => e.event.id).filter((id) => !id.startsWith('probe-'));
    for (let i = 0; i < 200 && real().length < 4; i++) await new Promise((r) => setTimeout(r, 20));
    ac.abort();
    await b;
    expect(fromStart.map((e) => e.event.id)).toEqual(['f-0', 'f-1', 'f-2', 'f-3', 'f-4']);
    expect(real()).toEqual(['f-1', 'f-2', 'f-3', 'f-4']);
    const seqs = fromStart.map((e) => e.seq);
    expect(seqs).toEqual([...seqs].sort((x, y) => x - y));
  });

  it('the stream refuses deletes and purges (append-only audit log)', async () => {
    const { seq } = await store.events.append(ev('keep-me'));
    await expect(store.jsm.streams.deleteMessage(store.events.stream, seq)).rejects.toThrow();
    await expect(store.jsm.streams.purge(store.events.stream)).rejects.toThrow();
    expect((await store.events.read({ fromSeq: seq, limit: 1 })).events[0]?.event.id).toBe('keep-me');
  });
});
