// Read model and leader-loop defects found in review (issue 12 follow-up), each on a real
// nats-server with the real FleetState / HostRegistry / ControlPlane (no Docker: host and group
// records are written to the KV buckets as the registry and the group store would). Where a test
// needs a fault no real part produces on demand, it goes through a named seam and says so:
// - a watch restart (a consumer lost, a reconnect) with a write landing while it reopens: a real
//   repository whose watch can be made to fail once (seam: the read model's repository);
// - a slow KV write behind heartbeats: a real lease repository whose reads are delayed (seam: the
//   registry's lease repository);
// - a leader whose lease renewal is blocked: an elector whose tick can be held (seam: Elector).
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ControlPlaneConfigSchema } from '../../../src/config/control-plane.ts';
import { AgentSubjects } from '../../../src/core/agent-subjects.ts';
import { CONTROL_PLANE_BUCKETS } from '../../../src/control-plane/buckets.ts';
import { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { FleetState } from '../../../src/control-plane/fleet-state.ts';
import { HostRegistry, policyFrom } from '../../../src/control-plane/host-registry.ts';
import { HostLeasePolicySchema, type HostLeasePolicy } from '../../../src/control-plane/hosts.ts';
import type { Elector } from '../../../src/control-plane/leader.ts';
import type { CheckpointRecord, GroupRecord, HostRecord } from '../../../src/control-plane/records.ts';
import { checkpointExposure, checkpointsDueForRefresh, dueForRefresh, exposureOf } from '../../../src/control-plane/retention.ts';
import { Keys, openRepositories, type Repositories } from '../../../src/control-plane/state.ts';
import { Heartbeat } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import { silentLogger } from '../../../src/observability/logger.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { DEFAULT_BUCKETS, StateStore } from '../../../src/store/connection.ts';
import { RecordInvalidError } from '../../../src/store/errors.ts';
import type { KvChange, KvRepository, Versioned } from '../../../src/store/kv-repository.ts';
import { shardIndex } from '../../../src/store/sharded-kv-repository.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;
let nc: NatsConnection;
let store: StateStore<typeof CONTROL_PLANE_BUCKETS>;
let chunks: ChunkStore;
let repos: Repositories;
const cleanups: (() => Promise<void> | void)[] = [];

beforeAll(async () => {
  nats = await startTestNats();
  nc = await nats.connect('control-plane');
  store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
  chunks = await ChunkStore.open(nc);
  repos = openRepositories(store);
}, 60_000);

afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  await nats?.cleanup();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, probe: () => T | undefined | Promise<T | undefined>, timeoutMs = 10_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

function host(hostId: string, state: HostRecord['lifecycle']['state'] = 'READY'): HostRecord {
  const now = Date.now();
  return {
    hostId, lifecycle: { state, epoch: 1, ...(state === 'DRAINING' ? { goingAway: 'operator_drain' as const } : {}) },
    attestation: { agentSha: 'a', apiSha: API_SHA, dockerVersion: '28', storageDriver: 'overlay2', imageRef: 'sandbox', imageDigest: 'sha256:00', bridgeVersion: 4, mismatches: [] },
    agentInstanceId: `${hostId}-1`, registeredAtMs: now, maxMembers: 8, updatedAtMs: now,
  };
}

function group(groupId: string, hostId: string): GroupRecord {
  const now = Date.now();
  return {
    groupId, conversationId: `conv-${groupId}`,
    lifecycle: { state: 'STOPPED', hostId, generation: 1, activityVersion: 1, lastActivityAtMs: now, stop: { clean: true } },
    members: [{ session: { memberId: 'm1', cli: 'claude_code', phase: 'RETAINED', savedLocator: `s-${groupId}`, completedTurns: 1 } as GroupRecord['members'][number]['session'] }],
    starts: 1, stops: 1, createdAtMs: now, updatedAtMs: now,
  };
}

/** Raw bytes under a group's key, as a newer schema (or a corruption) would leave them. */
async function putRawGroup(groupId: string, text: string): Promise<void> {
  const kv = await new Kvm(jetstream(nc)).open(`${DEFAULT_BUCKETS.groups.bucket}_${shardIndex(Keys.group(groupId), DEFAULT_BUCKETS.groups.shards)}`);
  await kv.put(Keys.group(groupId), new TextEncoder().encode(text));
}

async function deleteRawGroup(groupId: string): Promise<void> {
  const kv = await new Kvm(jetstream(nc)).open(`${DEFAULT_BUCKETS.groups.bucket}_${shardIndex(Keys.group(groupId), DEFAULT_BUCKETS.groups.shards)}`);
  await kv.delete(Keys.group(groupId));
}

/**
 * Seam: a real repository whose watch can be made to fail (as when its consumer is lost), with a
 * write run when the next watch opens — after anything the read model read before reopening it, and
 * before the new consumer exists.
 */
class WatchFailingRepository<T> {
  beforeNextWatch: (() => Promise<void>) | undefined;
  /** Each change the next watches deliver waits this long first (a slow catch-up). */
  deliveryDelayMs = 0;
  #fail: (() => void) | undefined;

  constructor(private readonly real: KvRepository<T>) {}

  get bucket(): string {
    return this.real.bucket;
  }

  lastRevision(): Promise<number> {
    return this.real.lastRevision();
  }

  get(key: string): Promise<Versioned<T> | undefined> {
    return this.real.get(key);
  }

  failWatch(): void {
    this.#fail?.();
  }

  async *watch(opts: { filter?: string; updatesOnly?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<KvChange<T>> {
    const hook = this.beforeNextWatch;
    this.beforeNextWatch = undefined;
    if (hook !== undefined) await hook();
    const inner = new AbortController();
    const onAbort = (): void => inner.abort();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    const failed = new Promise<never>((_, reject) => {
      this.#fail = () => {
        reject(new Error('seam: the watch failed'));
        inner.abort();
      };
    });
    failed.catch(() => undefined);
    const it = this.real.watch({ ...opts, signal: inner.signal })[Symbol.asyncIterator]();
    try {
      for (;;) {
        const r = await Promise.race([it.next(), failed]);
        if (r.done === true) return;
        if (this.deliveryDelayMs > 0) await sleep(this.deliveryDelayMs);
        yield r.value;
      }
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      await it.return?.(undefined);
    }
  }
}

describe('read model: a watch restart', () => {
  it('drops no live key and loses no heartbeat when a write lands while the watch reopens (seam: a watch made to fail)', async () => {
    const seam = new WatchFailingRepository(repos.hosts);
    const fleet = new FleetState({ hosts: seam as unknown as KvRepository<HostRecord>, groups: repos.groups.parts, checkpoints: repos.checkpoints }, silentLogger());
    cleanups.push(() => fleet.stop());
    await repos.hosts.create(Keys.host('wr-1'), host('wr-1'));
    await repos.hosts.create(Keys.host('wr-2'), host('wr-2'));
    await repos.hosts.create(Keys.host('wr-3'), host('wr-3'));
    await fleet.start();
    fleet.recordHeartbeat({ hostId: 'wr-1', epoch: 1, sequence: 7, receivedAtMs: Date.now(), usedMembers: 0, maxMembers: 8, containers: [] });
    const removed: string[] = [];
    fleet.onHostChange((key, _before, after) => {
      if (after === undefined) removed.push(key);
    });

    // While the watch reopens, wr-1 is written again (its newest value now comes after wr-3's, the
    // stream's last message before the restart), and wr-2 is deleted (a marker).
    let rewritten = 0;
    seam.beforeNextWatch = async () => {
      const cur = (await repos.hosts.get(Keys.host('wr-1')))!;
      rewritten = await repos.hosts.update(Keys.host('wr-1'), { ...cur.value, updatedAtMs: cur.value.updatedAtMs + 1 }, cur.revision);
      const gone = (await repos.hosts.get(Keys.host('wr-2')))!;
      await repos.hosts.delete(Keys.host('wr-2'), gone.revision);
    };
    const restarts = fleet.watchRestarts;
    seam.failWatch();
    await until('the watch restarted and caught up', () => fleet.watchRestarts > restarts && rewritten > 0 && fleet.host(Keys.host('wr-1'))?.revision === rewritten);
    await fleet.sync();
    await sleep(200);

    expect(removed, 'only the key deleted with a marker left the model').toEqual([Keys.host('wr-2')]);
    expect(fleet.host(Keys.host('wr-1'))?.revision).toBe(rewritten);
    expect(fleet.heartbeat('wr-1')?.sequence, 'the heartbeat of a live host survives the restart').toBe(7);
    expect(fleet.host(Keys.host('wr-2'))).toBeUndefined();
    expect(fleet.host(Keys.host('wr-3'))).toBeDefined();
  }, 30_000);
});

describe('read model: retention indexes', () => {
  /** The indexes against the same figures computed from the model's full lists, as the pass once did. */
  function expectIndexesMatch(fleet: FleetState, keep: number, what: string): void {
    const now = Date.now();
    const groups = [...fleet.groups()].map((e) => e.value);
    const cps = [...fleet.checkpoints()];
    expect(exposureOf(fleet.restorableCheckpoints(), now), `${what}: exposure`).toEqual(checkpointExposure(groups, cps.map((c) => c.record), now));
    const ready = new Set([...fleet.hosts()].filter((h) => h.value.lifecycle.state === 'READY').map((h) => h.value.hostId));
    const refreshAfterMs = 60_000;
    expect(dueForRefresh(fleet.restorableCheckpoints(), (k) => fleet.group(k)?.value, (h) => ready.has(h), now, refreshAfterMs, 1000), `${what}: refresh`)
      .toEqual(checkpointsDueForRefresh(groups, ready, cps.map((c) => c.record), now, refreshAfterMs, 1000));
    const count = new Map<string, number>();
    for (const c of cps) count.set(Keys.group(c.record.groupId), (count.get(Keys.group(c.record.groupId)) ?? 0) + 1);
    const candidates = [...count].filter(([k, n]) => {
      const state = fleet.group(k)?.value.lifecycle.state;
      return n > keep || state === 'LOST' || state === 'DESTROYED';
    }).map(([k]) => k).sort();
    expect([...fleet.cleanupCandidateGroupKeys()].sort(), `${what}: cleanup candidates`).toEqual(candidates);
    for (const c of cps) {
      const pinned = groups.some((g) => g.latestCheckpointId === c.record.checkpointId || g.lifecycle.migration?.checkpointId === c.record.checkpointId);
      expect(fleet.checkpointPinned(c.record.checkpointId), `${what}: ${c.record.checkpointId} pinned`).toBe(pinned);
    }
  }

  const ckpt = (groupId: string, checkpointId: string, ageMs: number, activityVersion = 1): CheckpointRecord => ({
    checkpointId, groupId, placementGeneration: 1, activityVersion, sourceHostId: 'ri-h', sourceEpoch: 1, createdAtMs: Date.now() - ageMs,
    baseImageDigest: 'sha256:00', bridgeVersion: 4, members: [{ memberId: 'm1', layerDigest: 'sha256:11', sizeBytes: 1 }], totalBytes: 1,
  });

  it('are built at the end of the first load and kept current on every group and checkpoint change', async () => {
    const keep = 2;
    await repos.hosts.create(Keys.host('ri-h'), host('ri-h'));
    const old = 3_600_000;
    // Before the model starts: a group with a usable old checkpoint (due for refresh), one with
    // three (a candidate), one whose latest is stale, one without, and an orphan checkpoint.
    const g = (id: string, latest?: string): GroupRecord => ({ ...group(id, 'ri-h'), lifecycle: { ...group(id, 'ri-h').lifecycle, lastActivityAtMs: Date.now() - 2 * old }, ...(latest ? { latestCheckpointId: latest } : {}) });
    await repos.groups.create(Keys.group('ri-a'), g('ri-a', 'ri-a-1'));
    await repos.checkpoints.create(Keys.checkpoint('ri-a', 'ri-a-1'), ckpt('ri-a', 'ri-a-1', old));
    await repos.groups.create(Keys.group('ri-b'), g('ri-b', 'ri-b-3'));
    for (const n of [1, 2, 3]) await repos.checkpoints.create(Keys.checkpoint('ri-b', `ri-b-${n}`), ckpt('ri-b', `ri-b-${n}`, old / n));
    await repos.groups.create(Keys.group('ri-c'), g('ri-c', 'ri-c-1'));
    await repos.checkpoints.create(Keys.checkpoint('ri-c', 'ri-c-1'), ckpt('ri-c', 'ri-c-1', old, 0));
    await repos.groups.create(Keys.group('ri-d'), g('ri-d'));
    for (const n of [1, 2, 3]) await repos.checkpoints.create(Keys.checkpoint('ri-orphan', `ri-o-${n}`), ckpt('ri-orphan', `ri-o-${n}`, old));

    const fleet = new FleetState({ hosts: repos.hosts, groups: repos.groups.parts, checkpoints: repos.checkpoints }, silentLogger(), undefined, { checkpointKeep: keep });
    cleanups.push(() => fleet.stop());
    await fleet.start();
    expect(fleet.restorableCheckpoints().get(Keys.group('ri-a')), 'built at the end of the load').toBeGreaterThan(0);
    expect(fleet.cleanupCandidateGroupKeys().has(Keys.group('ri-b'))).toBe(true);
    expect(fleet.cleanupCandidateGroupKeys().has(Keys.group('ri-orphan')), 'a group the model does not hold, by its count').toBe(true);
    expectIndexesMatch(fleet, keep, 'after the first load');

    // Changes after the load: a new latest checkpoint for ri-d (usable, then a 2nd and 3rd), ri-a's
    // activity moves past its checkpoint, ri-c becomes LOST, one of ri-b's checkpoints is deleted.
    for (const n of [1, 2, 3]) await repos.checkpoints.create(Keys.checkpoint('ri-d', `ri-d-${n}`), ckpt('ri-d', `ri-d-${n}`, 1000 * n));
    const d = (await repos.groups.get(Keys.group('ri-d')))!;
    await repos.groups.update(Keys.group('ri-d'), { ...d.value, latestCheckpointId: 'ri-d-1' }, d.revision);
    const a = (await repos.groups.get(Keys.group('ri-a')))!;
    await repos.groups.update(Keys.group('ri-a'), { ...a.value, lifecycle: { ...a.value.lifecycle, activityVersion: 2, lastActivityAtMs: Date.now() } }, a.revision);
    const c = (await repos.groups.get(Keys.group('ri-c')))!;
    await repos.groups.update(Keys.group('ri-c'), { ...c.value, lifecycle: { ...c.value.lifecycle, state: 'LOST', lostReason: 'no_checkpoint' } }, c.revision);
    const b1 = (await repos.checkpoints.get(Keys.checkpoint('ri-b', 'ri-b-1')))!;
    await repos.checkpoints.delete(Keys.checkpoint('ri-b', 'ri-b-1'), b1.revision);
    await fleet.sync();
    expect(fleet.cleanupCandidateGroupKeys().has(Keys.group('ri-b')), 'down to keep').toBe(false);
    expect(fleet.cleanupCandidateGroupKeys().has(Keys.group('ri-c')), 'LOST').toBe(true);
    expect(fleet.cleanupCandidateGroupKeys().has(Keys.group('ri-d')), 'three checkpoints').toBe(true);
    expect(fleet.restorableCheckpoints().get(Keys.group('ri-a')), 'stale now').toBeNull();
    expect(fleet.checkpointPinned('ri-b-1')).toBe(false);
    expectIndexesMatch(fleet, keep, 'after changes');
  }, 30_000);
});

describe('read model: the stall check', () => {
  it('does not restart a watch that is slowly re-delivering a bucket after a restart (seam: a watch made to fail, then slow)', async () => {
    for (let i = 0; i < 30; i++) await repos.hosts.create(Keys.host(`st-${i}`), host(`st-${i}`));
    const seam = new WatchFailingRepository(repos.hosts);
    const fleet = new FleetState({ hosts: seam as unknown as KvRepository<HostRecord>, groups: repos.groups.parts, checkpoints: repos.checkpoints }, silentLogger(), undefined, { revisionCheckMs: 250 });
    cleanups.push(() => fleet.stop());
    await fleet.start();
    // While the watch reopens, st-0 is written: the stream is ahead of the model until the new watch,
    // 60 ms a change, has re-delivered every host (~2 s, eight checks).
    let rewritten = 0;
    seam.beforeNextWatch = async () => {
      const cur = (await repos.hosts.get(Keys.host('st-0')))!;
      rewritten = await repos.hosts.update(Keys.host('st-0'), { ...cur.value, updatedAtMs: cur.value.updatedAtMs + 1 }, cur.revision);
    };
    seam.deliveryDelayMs = 60;
    const restarts = fleet.watchRestarts;
    seam.failWatch();
    await until('the write made while the watch reopened', () => rewritten > 0 && fleet.host(Keys.host('st-0'))?.revision === rewritten, 20_000);
    expect(fleet.watchRestarts, 'restarted again while catching up').toBe(restarts + 1);
  }, 40_000);
});

describe('read model: change listeners', () => {
  it('are all called when one unsubscribes itself or throws, and the watch keeps running', async () => {
    const metrics = new FleetMetrics();
    const fleet = new FleetState({ hosts: repos.hosts, groups: repos.groups.parts, checkpoints: repos.checkpoints }, silentLogger(), metrics);
    cleanups.push(() => fleet.stop());
    await fleet.start();
    const calls: string[] = [];
    const offA = fleet.onGroupChange(() => {
      calls.push('a');
      offA();
    });
    fleet.onGroupChange(() => calls.push('b'));
    fleet.onGroupChange(() => {
      calls.push('c');
      throw new Error('a listener bug');
    });
    fleet.onGroupChange(() => calls.push('d'));
    await repos.groups.create(Keys.group('ls-1'), group('ls-1', 'ls-host'));
    await Promise.race([fleet.sync(), sleep(5_000)]);
    expect(calls).toEqual(['a', 'b', 'c', 'd']);
    expect(fleet.watchRestarts).toBe(0);
    expect(fleet.group(Keys.group('ls-1'))).toBeDefined();
    // The next change reaches the remaining listeners again.
    const cur = (await repos.groups.get(Keys.group('ls-1')))!;
    await repos.groups.update(Keys.group('ls-1'), { ...cur.value, updatedAtMs: cur.value.updatedAtMs + 1 }, cur.revision);
    await Promise.race([fleet.sync(), sleep(5_000)]);
    expect(calls).toEqual(['a', 'b', 'c', 'd', 'b', 'c', 'd']);
    const failures = (await metrics.registry.getSingleMetric('sandboxfleet_reconciles_total')?.get())?.values.find((v) => v.labels.queue === 'read_model_listener' && v.labels.result === 'error')?.value;
    expect(failures).toBe(2);
  }, 30_000);
});

describe('read model: what it keeps', () => {
  it('reads groups without their turn-call state, which it neither keeps nor validates; the writers still refuse a record that is invalid there', async () => {
    const plane = new ControlPlane({ config: ControlPlaneConfigSchema.parse({}), nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'cp-keeps', autoReconcile: false });
    await plane.fleet.start();
    cleanups.push(() => plane.fleet.stop());
    const invalidBefore = plane.fleet.invalidGroupCount();
    const g = group('keeps-1', 'keeps-host');
    const text = JSON.stringify({ ...g, members: [{ ...g.members[0], calls: 'not turn-call state' }] });
    await putRawGroup('keeps-1', text);
    await plane.fleet.sync();
    const held = plane.fleet.group(Keys.group('keeps-1'));
    expect(held?.value.lifecycle.hostId).toBe('keeps-host');
    expect(held?.value.members[0]).not.toHaveProperty('calls');
    expect(plane.fleet.invalidGroupCount()).toBe(invalidBefore);
    // The store's full schema (what every write reads through) refuses it.
    await expect(repos.groups.get(Keys.group('keeps-1'))).rejects.toBeInstanceOf(RecordInvalidError);
    // Anything else invalid is kept aside as before.
    await putRawGroup('keeps-2', JSON.stringify({ ...group('keeps-2', 'keeps-host'), lifecycle: { state: 'NOT_A_STATE' } }));
    await plane.fleet.sync();
    expect(plane.fleet.group(Keys.group('keeps-2'))).toBeUndefined();
    expect(plane.fleet.invalidGroupCount()).toBe(invalidBefore + 1);
    // Gone again: an invalid group never seen valid counts as held by every draining host (below).
    await deleteRawGroup('keeps-1');
    await deleteRawGroup('keeps-2');
    await plane.fleet.sync();
    expect(plane.fleet.invalidGroupCount()).toBe(invalidBefore);
  }, 30_000);
});

describe('heartbeats', () => {
  it('are recorded in memory at once while an earlier beat\'s writes are slow, and pending writes coalesce per host (seam: a slow lease repository)', async () => {
    const config = ControlPlaneConfigSchema.parse({});
    const plane = new ControlPlane({ config, nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'cp-hb', autoReconcile: false });
    await plane.fleet.start();
    cleanups.push(() => plane.fleet.stop());
    await repos.hosts.create(Keys.host('hb-1'), host('hb-1'));
    await plane.fleet.sync();

    // Every accepted beat of a READY host looks up its lease policy (none is stored: each beat
    // reads it again), and each read takes 1.5 s.
    const real = store.repository('hostLeases', HostLeasePolicySchema);
    let reads = 0;
    const slowLeases = {
      bucket: real.bucket,
      async get(key: string): Promise<Versioned<HostLeasePolicy> | undefined> {
        reads += 1;
        await sleep(1_500);
        return real.get(key);
      },
    } as unknown as KvRepository<HostLeasePolicy>;
    const registry = new HostRegistry(plane.ctx, policyFrom(plane.ctx, undefined), slowLeases);
    const hbNc = await nats.connect('hb-1');
    registry.start(nc);
    // The registry's subscriptions reach the server before the first beat is published on another
    // connection (else beat 1 can be dropped under load and the test times out waiting for it).
    await nc.flush();
    let stopped = false;
    cleanups.push(async () => {
      if (!stopped) await registry.stop();
    });

    const beat = (sequence: number): void => {
      hbNc.publish(AgentSubjects.heartbeat('hb-1'), Heartbeat.encode(Heartbeat.fromPartial({
        hostId: 'hb-1', hostEpoch: 1, sequence, sentAtUnixMs: Date.now(), inventory: { containers: [] }, capacity: { usedMembers: 0, maxMembers: 8 },
      })).finish());
    };
    beat(1);
    await until('beat 1 recorded', () => plane.fleet.heartbeat('hb-1')?.sequence === 1, 5_000);
    beat(2);
    const sent = Date.now();
    await until('beat 2 recorded', () => plane.fleet.heartbeat('hb-1')?.sequence === 2, 5_000);
    expect(Date.now() - sent, 'beat 2 waited for beat 1\'s lease read').toBeLessThan(700);

    // Twenty more beats while the reads are slow: writes coalesce to the newest pending one.
    for (let s = 3; s <= 22; s++) {
      beat(s);
      await sleep(20);
    }
    await until('beat 22 recorded', () => plane.fleet.heartbeat('hb-1')?.sequence === 22, 2_000);
    const t = Date.now();
    stopped = true;
    await registry.stop();
    expect(Date.now() - t, 'stop waited for a backlog of chained writes').toBeLessThan(5_000);
    expect(reads).toBeLessThanOrEqual(4);
  }, 90_000);
});

/** Seam: an elector that leads, and whose tick (the lease renewal) can be held, as a blocked pass would. */
class HoldableElector implements Elector {
  isLeader = false;
  term = 1;
  #held: Promise<void> | undefined;
  #release: (() => void) | undefined;

  hold(): void {
    this.#held = new Promise((r) => { this.#release = r; });
  }

  release(): void {
    this.#release?.();
    this.#held = undefined;
  }

  async tick(): Promise<boolean> {
    if (this.#held !== undefined) await this.#held;
    this.isLeader = true;
    return true;
  }

  async resign(): Promise<void> {
    this.isLeader = false;
  }
}

describe('leader-only queues', () => {
  it('stop running while the lease is not being renewed, and resume once it is (seam: an elector whose renewal is held)', async () => {
    // The lease lasts 2 s (the Kubernetes Lease setting; the elector itself is the seam).
    const config = ControlPlaneConfigSchema.parse({ reconcileIntervalMs: 100, leaderElection: 'kubernetes-lease', leaseDurationSeconds: 2 });
    const elector = new HoldableElector();
    const plane = new ControlPlane({ config, nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'cp-lease', elector });
    await plane.start();
    let stopped = false;
    cleanups.push(async () => {
      elector.release();
      if (!stopped) await plane.stop();
    });
    const state = async (hostId: string) => (await repos.hosts.get(Keys.host(hostId)))?.value.lifecycle.state;

    // Leading: a drained host with no groups is removed.
    await repos.hosts.create(Keys.host('lq-1'), host('lq-1', 'DRAINING'));
    await until('lq-1 REMOVED', async () => (await state('lq-1')) === 'REMOVED');

    // The renewal is blocked past the lease: another replica may lead now; this one must not act.
    elector.hold();
    await sleep(2_500);
    await repos.hosts.create(Keys.host('lq-2'), host('lq-2', 'DRAINING'));
    await sleep(2_000);
    expect(await state('lq-2'), 'a queue acted without a valid lease').toBe('DRAINING');

    elector.release();
    await until('lq-2 REMOVED after renewal', async () => (await state('lq-2')) === 'REMOVED');
    const t = Date.now();
    stopped = true;
    await plane.stop();
    expect(Date.now() - t).toBeLessThan(10_000);
  }, 60_000);
});

describe('a drained host', () => {
  it('is not REMOVED while it still holds a group whose record fails validation', async () => {
    const config = ControlPlaneConfigSchema.parse({});
    const plane = new ControlPlane({ config, nc, store, chunks, metrics: new FleetMetrics(), logger: silentLogger(), apiSha: API_SHA, replicaId: 'cp-drain', autoReconcile: false });
    await plane.fleet.start();
    cleanups.push(() => plane.fleet.stop());
    const state = async (hostId: string) => (await repos.hosts.get(Keys.host(hostId)))?.value.lifecycle.state;

    // A group read valid on the host, then overwritten by a record this version cannot read.
    await repos.hosts.create(Keys.host('dr-1'), host('dr-1', 'DRAINING'));
    await repos.groups.create(Keys.group('dr-g1'), group('dr-g1', 'dr-1'));
    await plane.fleet.sync();
    await putRawGroup('dr-g1', '{"groupId": 42, "lifecycle": {"hostId": "dr-1"}}');
    await plane.fleet.sync();
    expect(plane.fleet.groupInvalid(Keys.group('dr-g1'))).toBe(true);
    await plane.controller.reconcileDrainingHost('dr-1');
    expect(await state('dr-1'), 'removed while holding a group whose record is invalid').toBe('DRAINING');

    // A record invalid since the model first saw it: whose host it names is unknown, so no drained
    // host is removed while it exists.
    await repos.hosts.create(Keys.host('dr-2'), host('dr-2', 'DRAINING'));
    await putRawGroup('dr-g2', 'not json');
    await plane.fleet.sync();
    await plane.controller.reconcileDrainingHost('dr-2');
    expect(await state('dr-2')).toBe('DRAINING');

    // Once the records are gone (deleted: markers), the hosts are removed.
    await deleteRawGroup('dr-g1');
    await deleteRawGroup('dr-g2');
    await plane.fleet.sync();
    await plane.controller.reconcileDrainingHost('dr-1');
    await plane.controller.reconcileDrainingHost('dr-2');
    expect(await state('dr-1')).toBe('REMOVED');
    expect(await state('dr-2')).toBe('REMOVED');
  }, 30_000);
});
