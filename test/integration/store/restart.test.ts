// Durability across nats-server restarts (clean stop and SIGKILL) on the same store dir: KV
// values and revisions, events and checkpoint chunks survive, CAS continues from the stored revisions,
// and an open connection reconnects by itself. Also checks the fsync policy really applied.
import { readFileSync, readdirSync } from 'node:fs';
import { jetstreamManager } from '@nats-io/jetstream';
import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { StateStore } from '../../../src/store/connection.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import type { ChunkRef } from '../../../src/core/checkpoint-manifest.ts';
import { Unavailable } from '../../../src/core/errors.ts';
import { CasConflictError, StoreUnavailableError } from '../../../src/store/errors.ts';
import type { FleetEvent } from '../../../src/store/event-log.ts';
import { nextStatus, startTestNats, type TestNats } from '../../support/nats.ts';

/** Resolves once every thread of `pid` is stopped (state T in /proc), after a SIGSTOP. */
async function stopped(pid: number): Promise<void> {
  const deadline = Date.now() + 5_000;
  for (;;) {
    const tasks = readdirSync(`/proc/${pid}/task`);
    const states = tasks.map((t) => {
      const stat = readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8');
      return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    });
    if (states.every((st) => st === 'T' || st === 't')) return;
    if (Date.now() > deadline) throw new Error(`process ${pid} not stopped: thread states ${states.join('')}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

const Placement = z.object({ groupId: z.string(), hostId: z.string(), generation: z.number().int() });

let nats: TestNats | undefined;
afterEach(async () => {
  await nats?.cleanup();
  nats = undefined;
});

function ev(id: string): FleetEvent {
  return { id, timeMs: 1, actor: 'test', subjectKind: 'group', subjectId: 'g1', type: 'placed', toState: 'RUNNING' };
}

async function jsConfig(monitorUrl: string): Promise<{ sync_always?: boolean; sync_interval?: number }> {
  const varz = (await (await fetch(`${monitorUrl}/varz`)).json()) as { jetstream: { config: { sync_always?: boolean; sync_interval?: number } } };
  return varz.jetstream.config;
}

async function writeFixture(store: StateStore): Promise<{ revs: Map<string, number>; seqs: number[]; chunk: ChunkRef }> {
  const repo = store.shardedRepository('groups', Placement);
  const revs = new Map<string, number>();
  for (let i = 0; i < 5; i++) {
    const r1 = await repo.create(`g${i}`, { groupId: `g${i}`, hostId: 'h1', generation: 1 });
    revs.set(`g${i}`, await repo.update(`g${i}`, { groupId: `g${i}`, hostId: 'h2', generation: 2 }, r1));
  }
  const seqs: number[] = [];
  for (let i = 0; i < 5; i++) seqs.push((await store.events.append(ev(`e${i}`))).seq);
  const { ref } = await (await ChunkStore.open(store.nc)).put(new TextEncoder().encode('layer bytes'));
  return { revs, seqs, chunk: ref };
}

async function verifyFixture(store: StateStore, f: { revs: Map<string, number>; seqs: number[]; chunk: ChunkRef }): Promise<void> {
  const repo = store.shardedRepository('groups', Placement);
  for (const [key, rev] of f.revs) {
    expect(await repo.get(key)).toEqual({ value: { groupId: key, hostId: 'h2', generation: 2 }, revision: rev });
  }
  const { events } = await store.events.read({ limit: 100 });
  expect(events.map((e) => [e.seq, e.event.id])).toEqual(f.seqs.map((s, i) => [s, `e${i}`]));
  // The chunk reads back digest-verified, and stays write-once.
  const chunks = await ChunkStore.open(store.nc);
  expect(new TextDecoder().decode(await chunks.get(f.chunk))).toBe('layer bytes');
  expect(await chunks.put(new TextEncoder().encode('layer bytes'))).toEqual({ ref: f.chunk, stored: false });
  // CAS continues from the stored revisions: stale ones are refused, current ones accepted.
  await expect(repo.update('g0', { groupId: 'g0', hostId: 'h3', generation: 3 }, (f.revs.get('g0') as number) - 1)).rejects.toBeInstanceOf(CasConflictError);
  const next = await repo.update('g0', { groupId: 'g0', hostId: 'h3', generation: 3 }, f.revs.get('g0') as number);
  expect(next).toBeGreaterThan(f.revs.get('g0') as number);
  // The event sequence continues after the last stored one; dedup survived the restart too.
  expect((await store.events.append(ev('e0'))).duplicate).toBe(true);
  expect((await store.events.append(ev('after-restart'))).seq).toBe((f.seqs.at(-1) as number) + 1);
}

describe('restart durability', () => {
  it('keeps KV values, revisions, events and chunks across a clean restart; clients reconnect', async () => {
    nats = await startTestNats();
    expect((await jsConfig(nats.server.monitorUrl as string)).sync_always).toBe(true);
    const nc = await nats.connect('restart-test');
    const store = await StateStore.open(nc);
    const fixture = await writeFixture(store);
    const port = nats.server.port;

    const reconnected = nextStatus(nc, 'reconnect');
    await nats.server.restart();
    expect(nats.server.port).toBe(port);
    await reconnected;
    // The same connection (and store) keeps working after reconnecting.
    const reopened = await StateStore.open(nc);
    await verifyFixture(reopened, fixture);
    // A brand-new client sees the same data.
    const fresh = await StateStore.open(await nats.connect('fresh'));
    expect((await fresh.shardedRepository('groups', Placement).get('g1'))?.revision).toBe(fixture.revs.get('g1'));
  });

  it('keeps every acknowledged write when the server is killed with SIGKILL', async () => {
    nats = await startTestNats();
    const store = await StateStore.open(await nats.connect('kill-test'));
    const fixture = await writeFixture(store);
    const pid = nats.server.pid as number;
    process.kill(pid, 'SIGKILL');
    for (let i = 0; i < 200 && nats.server.running; i++) await new Promise((r) => setTimeout(r, 10));
    expect(nats.server.running).toBe(false);
    await nats.server.start();
    await verifyFixture(await StateStore.open(await nats.connect('after-kill')), fixture);
  });

  it('reports store_unavailable while NATS is down (writes as ambiguous) and recovers after', async () => {
    nats = await startTestNats();
    const nc = await nats.connect('down-test');
    const store = await StateStore.open(nc, { timeoutMs: 1000 });
    const repo = store.shardedRepository('groups', Placement);
    const rev = await repo.create('g', { groupId: 'g', hostId: 'h1', generation: 1 });
    await nats.server.stop();
    const w = await repo.update('g', { groupId: 'g', hostId: 'h2', generation: 2 }, rev).catch((e: unknown) => e);
    expect(w).toBeInstanceOf(StoreUnavailableError);
    expect(w).toBeInstanceOf(Unavailable);
    expect((w as StoreUnavailableError).reason).toBe('store_unavailable');
    expect((w as StoreUnavailableError).ambiguous).toBe(true);
    const r = await repo.get('g').catch((e: unknown) => e);
    expect((r as StoreUnavailableError).ambiguous).toBe(false);
    const reconnected = nextStatus(nc, 'reconnect');
    await nats.server.start();
    await reconnected;
    // Ambiguity is resolved by re-reading: the write did not land, so the old revision still works.
    expect((await repo.get('g'))?.revision).toBe(rev);
    await repo.update('g', { groupId: 'g', hostId: 'h2', generation: 2 }, rev);
  });

  it('reports store_unavailable for a write no stream answers (no responders), never an unknown error', async () => {
    // A KV write published while no server holds its stream (a NATS node restarting, its streams
    // electing a leader) gets "no responders", which nats.js raises as JetStreamNotEnabled. Unmapped,
    // the runner API answered INTERNAL, which a runner does not retry (found by the chaos workload
    // over gRPC). Here the streams are deleted under an open repository to get the same answer.
    nats = await startTestNats();
    const nc = await nats.connect('no-stream');
    const store = await StateStore.open(nc, { timeoutMs: 1000 });
    const repo = store.shardedRepository('groups', Placement);
    const rev = await repo.create('g', { groupId: 'g', hostId: 'h1', generation: 1 });
    const jsm = await jetstreamManager(nc);
    for await (const name of jsm.streams.names()) if (name.startsWith('KV_')) await jsm.streams.delete(name);
    const w = await repo.update('g', { groupId: 'g', hostId: 'h2', generation: 2 }, rev).catch((e: unknown) => e);
    expect(w).toBeInstanceOf(StoreUnavailableError);
    expect((w as StoreUnavailableError).reason).toBe('store_unavailable');
    expect((w as StoreUnavailableError).ambiguous).toBe(true);
  });

  it('reports store_unavailable for a read in flight when its connection closes (a replica going down), never an unknown error', async () => {
    nats = await startTestNats();
    const nc = await nats.connect('closing');
    const store = await StateStore.open(nc, { timeoutMs: 5000 });
    const repo = store.shardedRepository('groups', Placement);
    await repo.create('g', { groupId: 'g', hostId: 'h1', generation: 1 });
    const pid = nats.server.pid as number;
    // The server frozen, so the read is still waiting for its answer when the connection closes.
    // Every thread of it stopped before the read goes out: the stop is not instant, and on a busy
    // machine the server answered a read sent right after kill() (2 runs in 8 here under load).
    process.kill(pid, 'SIGSTOP');
    try {
      await stopped(pid);
      const pending = repo.get('g').catch((e: unknown) => e);
      await new Promise((r) => setTimeout(r, 100));
      await nc.close();
      const r = await pending;
      expect(r).toBeInstanceOf(StoreUnavailableError);
      expect((r as StoreUnavailableError).ambiguous).toBe(false);
    } finally {
      process.kill(pid, 'SIGCONT');
    }
  });

  it('applies a configured fsync interval instead of always', async () => {
    nats = await startTestNats({ fsync: { intervalMs: 30_000 } });
    const cfg = await jsConfig(nats.server.monitorUrl as string);
    expect(cfg.sync_always ?? false).toBe(false);
    expect(cfg.sync_interval).toBe(30_000 * 1_000_000);
  });
});
