// KvRepository against a real nats-server: CAS under contention, create-if-absent races,
// bounded retries, and validation of records on the way in and out (R-R2, R-R4).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { Conflict } from '../../../src/core/errors.ts';
import { StateStore } from '../../../src/store/connection.ts';
import { CasConflictError, InvalidKeyError, RecordInvalidError, RecordTooLargeError, StoreError } from '../../../src/store/errors.ts';
import type { KvChange } from '../../../src/store/kv-repository.ts';
import type { Repository } from '../../../src/store/sharded-kv-repository.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

const Counter = z.object({ n: z.number().int().nonnegative(), by: z.string().max(64) });
type Counter = z.infer<typeof Counter>;

let nats: TestNats;
let store: StateStore;
let repo: Repository<Counter>;

beforeAll(async () => {
  nats = await startTestNats();
  store = await StateStore.open(await nats.connect('kv-test'));
  repo = store.shardedRepository('groups', Counter);
});

afterAll(async () => {
  await nats?.cleanup();
});

async function settle<T>(ps: Promise<T>[]): Promise<{ ok: T[]; errors: unknown[] }> {
  const rs = await Promise.allSettled(ps);
  return {
    ok: rs.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : [])),
    errors: rs.flatMap((r) => (r.status === 'rejected' ? [r.reason as unknown] : [])),
  };
}

describe('KvRepository CAS', () => {
  it('lets exactly one of N concurrent updates from the same revision win', async () => {
    const rev0 = await repo.create('cas-race', { n: 0, by: 'init' });
    // Separate connections, so the writes really race at the server.
    const others = await Promise.all(Array.from({ length: 4 }, async (_, i) => (await StateStore.open(await nats.connect(`w${i}`))).shardedRepository('groups', Counter)));
    const writers = [repo, ...others];
    const N = 20;
    const { ok, errors } = await settle(Array.from({ length: N }, (_, i) => (writers[i % writers.length] as Repository<Counter>).update('cas-race', { n: 1, by: `w${i}` }, rev0)));
    expect(ok).toHaveLength(1);
    expect(errors).toHaveLength(N - 1);
    for (const e of errors) {
      expect(e).toBeInstanceOf(CasConflictError);
      // A core Conflict, so the API's single status table answers ABORTED for it.
      expect(e).toBeInstanceOf(Conflict);
      expect((e as CasConflictError).status).toBe('ABORTED');
      expect((e as CasConflictError).reason).toBe('cas_conflict');
      expect((e as CasConflictError).key).toBe('cas-race');
      expect((e as CasConflictError).expectedRevision).toBe(rev0);
    }
    const now = await repo.get('cas-race');
    expect(now?.revision).toBe(ok[0]);
    expect(now?.value.n).toBe(1);
  });

  it('never overwrites silently: a stale revision is refused even after many writes', async () => {
    const r1 = await repo.create('stale', { n: 1, by: 'a' });
    const r2 = await repo.update('stale', { n: 2, by: 'b' }, r1);
    expect(r2).toBeGreaterThan(r1);
    await expect(repo.update('stale', { n: 99, by: 'stale-writer' }, r1)).rejects.toBeInstanceOf(CasConflictError);
    expect((await repo.get('stale'))?.value).toEqual({ n: 2, by: 'b' });
  });

  it('lets exactly one of N concurrent creates of the same key win', async () => {
    const N = 16;
    const { ok, errors } = await settle(Array.from({ length: N }, (_, i) => repo.create('create-race', { n: i, by: `c${i}` })));
    expect(ok).toHaveLength(1);
    expect(errors).toHaveLength(N - 1);
    for (const e of errors) {
      expect(e).toBeInstanceOf(CasConflictError);
      expect((e as CasConflictError).expectedAbsent).toBe(true);
    }
    const winner = await repo.get('create-race');
    expect(winner?.revision).toBe(ok[0]);
  });

  it('mutate() with retries lands all N concurrent increments', async () => {
    const N = 12;
    const results = await Promise.all(
      Array.from({ length: N }, (_, i) => repo.mutate('counter', (cur) => ({ n: (cur?.n ?? 0) + 1, by: `m${i}` }), { retries: N + 5 })),
    );
    expect((await repo.get('counter'))?.value.n).toBe(N);
    const revisions = results.map((r) => r?.revision);
    expect(new Set(revisions).size).toBe(N); // every increment was its own write
  });

  it('mutate() gives up after its bounded retries with a CasConflictError', async () => {
    await repo.create('contended', { n: 0, by: 'init' });
    const rival = (await StateStore.open(await nats.connect('rival'))).shardedRepository('groups', Counter);
    let calls = 0;
    // Every time fn runs, a rival writer gets in first, so every CAS attempt of mutate() loses.
    const err = await repo
      .mutate(
        'contended',
        async (cur) => {
          calls++;
          await rival.mutate('contended', (c) => ({ n: (c?.n ?? 0) + 1, by: 'rival' }));
          return { n: (cur?.n ?? 0) + 100, by: 'loser' };
        },
        { retries: 3, backoffMs: 1 },
      )
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CasConflictError);
    expect(calls).toBe(4);
    expect((await repo.get('contended'))?.value).toEqual({ n: 4, by: 'rival' });
  });

  it('mutate() leaves the key alone when fn returns undefined', async () => {
    const rev = await repo.create('noop', { n: 5, by: 'x' });
    const r = await repo.mutate('noop', () => undefined);
    expect(r).toEqual({ value: { n: 5, by: 'x' }, revision: rev });
    expect(await repo.mutate('absent-noop', () => undefined)).toBeUndefined();
    expect(await repo.get('absent-noop')).toBeUndefined();
  });

  it('deletes with CAS; a deleted key reads as absent and can be created again', async () => {
    const r1 = await repo.create('del', { n: 1, by: 'a' });
    const r2 = await repo.update('del', { n: 2, by: 'a' }, r1);
    await expect(repo.delete('del', r1)).rejects.toBeInstanceOf(CasConflictError);
    await repo.delete('del', r2);
    expect(await repo.get('del')).toBeUndefined();
    expect((await repo.keys()).keys).not.toContain('del');
    const r3 = await repo.create('del', { n: 3, by: 'b' });
    expect(r3).toBeGreaterThan(r2);
    expect((await repo.get('del'))?.value.n).toBe(3);
  });

  it('rejects a non-positive expected revision instead of writing unconditionally', async () => {
    await expect(repo.update('noop', { n: 1, by: 'x' }, 0)).rejects.toBeInstanceOf(RangeError);
    await expect(repo.delete('noop', 0)).rejects.toBeInstanceOf(RangeError);
  });
});

describe('KvRepository validation', () => {
  it('rejects malformed records on write with record_invalid and writes nothing', async () => {
    const bad = { n: -1, by: 'x' } as Counter;
    const err = await repo.create('bad-write', bad).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RecordInvalidError);
    expect((err as RecordInvalidError).reason).toBe('record_invalid');
    expect((err as RecordInvalidError).problems.join()).toMatch(/^n:/);
    expect(await repo.get('bad-write')).toBeUndefined();
  });

  it('rejects oversized records on write with record_too_large and writes nothing', async () => {
    const small = store.repository('locators', z.object({ s: z.string() }));
    const limit = store.spec('locators').maxRecordBytes;
    const err = await small.create('big', { s: 'x'.repeat(limit) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RecordTooLargeError);
    expect((err as RecordTooLargeError).reason).toBe('record_too_large');
    expect((err as RecordTooLargeError).limitBytes).toBe(limit);
    expect((err as RecordTooLargeError).sizeBytes).toBeGreaterThan(limit);
    expect(await small.get('big')).toBeUndefined();
  });

  it('the bucket itself refuses oversized values written around the codec', async () => {
    const limit = store.spec('locators').maxRecordBytes;
    await expect(store.rawKv('locators').put('raw-big', new Uint8Array(limit + 4096))).rejects.toThrow(/exceeds maximum/);
  });

  it('reports a corrupt value injected into the bucket as record_invalid on read, not a crash', async () => {
    // The groups bucket is sharded: each corrupt value goes to the shard that holds its key.
    const put = (key: string, bytes: Uint8Array): Promise<number> => store.rawKv('groups', key).put(key, bytes);
    await put('corrupt-json', new TextEncoder().encode('{"n": 1, "by": '));
    await put('corrupt-schema', new TextEncoder().encode('{"n": "seven", "by": "x"}'));
    await put('corrupt-utf8', new Uint8Array([0x7b, 0xff, 0xfe, 0x7d]));
    for (const key of ['corrupt-json', 'corrupt-schema', 'corrupt-utf8']) {
      const err = await repo.get(key).catch((e: unknown) => e);
      expect(err, key).toBeInstanceOf(RecordInvalidError);
      expect((err as StoreError).reason).toBe('record_invalid');
      expect((err as Error).message).toContain(`${store.bucketFor('groups', key)}/${key}`);
    }
    // mutate() must not paper over corruption by overwriting it.
    await expect(repo.mutate('corrupt-schema', () => ({ n: 0, by: 'fix' }))).rejects.toBeInstanceOf(RecordInvalidError);
    // A listing still returns the good records and reports the bad ones.
    const all = await repo.list();
    expect(all.invalid.map((e) => e.where).sort()).toEqual(['corrupt-json', 'corrupt-schema', 'corrupt-utf8'].map((k) => `${store.bucketFor('groups', k)}/${k}`).sort());
    expect(all.entries.find((e) => e.key === 'counter')?.value.n).toBe(12);
  });

  it('validates keys', async () => {
    for (const key of ['', 'a..b', '.a', 'a.', 'has space', 'star*', 'gt>', 'ü', 'x'.repeat(257)]) {
      await expect(repo.get(key), JSON.stringify(key)).rejects.toBeInstanceOf(InvalidKeyError);
      await expect(repo.create(key, { n: 1, by: 'x' })).rejects.toMatchObject({ reason: 'invalid_key' });
    }
    expect(await repo.get('ok.key/with=chars_-1')).toBeUndefined();
  });

  it('bounds keys() and list() and says when it truncated', async () => {
    const lim = store.repository('hostLeases', Counter);
    for (let i = 0; i < 7; i++) await lim.create(`lease.h${i}`, { n: i, by: 'x' });
    await lim.create('other.k', { n: 0, by: 'x' });
    expect(await lim.keys({ limit: 3 })).toMatchObject({ truncated: true });
    expect((await lim.keys({ limit: 3 })).keys).toHaveLength(3);
    const filtered = await lim.keys({ filter: 'lease.*' });
    expect(filtered).toEqual({ keys: Array.from({ length: 7 }, (_, i) => `lease.h${i}`), truncated: false });
    const listed = await lim.list({ filter: 'lease.>', limit: 7 });
    expect(listed.truncated).toBe(false);
    expect(listed.entries.map((e) => e.value.n).sort()).toEqual([0, 1, 2, 3, 4, 5, 6]);
    await expect(lim.keys({ limit: 0 })).rejects.toBeInstanceOf(RangeError);
    await expect(lim.keys({ filter: 'a.>.b' })).rejects.toBeInstanceOf(InvalidKeyError);
  });
});

describe('KvRepository watch', () => {
  it('reports current values, then puts, deletes and corrupt values in order', async () => {
    const w = store.repository('heartbeats', Counter);
    await w.create('hb.a', { n: 1, by: 'x' });
    const ac = new AbortController();
    const seen: KvChange<Counter>[] = [];
    const done = (async () => {
      for await (const c of w.watch({ filter: 'hb.>', signal: ac.signal })) {
        seen.push(c);
        if (seen.length === 4) ac.abort();
      }
    })();
    // Wait for the initial value before changing anything, so the order is deterministic.
    for (let i = 0; seen.length < 1; i++) {
      expect(i, 'watch delivered no initial value').toBeLessThan(1500);
      await new Promise((r) => setTimeout(r, 20));
    }
    const guard = setTimeout(() => ac.abort(), 60_000); // never hang the suite on a missed change
    const r = await w.create('hb.b', { n: 2, by: 'y' });
    await w.delete('hb.b', r);
    await store.rawKv('heartbeats').put('hb.c', new TextEncoder().encode('not json'));
    await done;
    clearTimeout(guard);
    expect(seen.map((c) => `${c.op}:${c.key}`)).toEqual(['put:hb.a', 'put:hb.b', 'delete:hb.b', 'invalid:hb.c']);
    const inv = seen[3];
    expect(inv?.op === 'invalid' && inv.error.reason).toBe('record_invalid');
  });
});
