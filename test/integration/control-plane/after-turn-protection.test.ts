// idle_stop_after 0 on the turn's path (R-G2, R-G3, R-G6) over the real stack: real nats-server, a
// real dockerd host, a real host agent and a leading ControlPlane. A CompleteTurn answers only once
// its group is stopped cleanly with a checkpoint of its state, so a runner that holds the answer
// holds a protected conversation (before, the stop ran off the turn's path and a host death right
// after the answer lost the group). A checkpoint that fails after the turn does not fail the turn:
// the answer stands, and the metric and a turn_end_unprotected event say the group is not protected
// yet. A chunk GC sweep that holds its lock when the turn ends is waited out (bounded): the answer
// still means protected. The fleet's default is `never` here, so nothing but the completion stops
// the groups. With protect_in_background the completion answers first and the same steps follow
// it (a next turn begun meanwhile wins, and its own completion protects the group).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ChunkGcLocks } from '../../../src/control-plane/chunk-gc-locks.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { Unavailable } from '../../../src/core/index.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

/** A `claude -p` turn per exec: the CLI process exited and the runner saw it exit. */
const EXITED = { ...SUCCESS, processExited: true, exitConfirmed: true };

let fleet: Fleet;
let plane: ControlPlane;
const metrics = new FleetMetrics();
let n = 0;
const key = () => `after-turn-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(1, { idleStopAfterMs: 'never', idleStopStartGraceMs: 60_000 });
  plane = await fleet.startPlane({ metrics });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 180_000);

afterAll(async () => {
  await fleet?.cleanup();
});

async function open(conversationId: string, idleStopAfterMs: number | 'never') {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }], idleStopAfterMs });
  return group.groupId;
}

/** The stored record right now: stopped cleanly, with a checkpoint of exactly its state? */
async function protectedNow(groupId: string): Promise<boolean> {
  const g = await fleet.group(groupId);
  if (g.lifecycle.state !== 'STOPPED' || g.lifecycle.stop?.clean !== true || g.latestCheckpointId === undefined) return false;
  return (await plane.ctx.checkpoints.get(groupId, g.latestCheckpointId))?.activityVersion === g.lifecycle.activityVersion;
}

async function idleStops(result: string): Promise<number> {
  return (await metrics.registry.getSingleMetric('sandboxfleet_idle_stops_total')?.get())?.values.find((v) => v.labels.result === result)?.value ?? 0;
}

describe('idle_stop_after 0: the completion answers once the group is protected', () => {
  it('CompleteTurn answers with the group already stopped cleanly and checkpointed; a repeat answers the same; the next turn is RESTORED', async () => {
    const g = await open('conv-after-turn', 0);
    for (let i = 0; i < 2; i++) {
      const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
      expect(begun.contextState).toBe(i === 0 ? 'NEW' : 'RESTORED');
      await fleet.writeSession(begun.hostId, begun.containerId, 'sess-after');
      const input = { idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-after', evidence: EXITED };
      const done = await plane.runner.completeTurn(input);
      // No waiting: the answer itself means protected.
      expect(await protectedNow(g)).toBe(true);
      expect(done).toMatchObject({ outcome: 'completed', savedLocator: 'sess-after', nextContextState: 'RESTORED', groupProtected: true });
      expect(await plane.runner.completeTurn(input)).toEqual(done);
    }
    expect(await idleStops('stopped')).toBeGreaterThanOrEqual(2);
  });

  it('a chunk GC sweep holding its lock when the turn ends is waited out: the answer still means protected', async () => {
    const g = await open('conv-after-gc', 0);
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-gc');
    let release!: () => void;
    const held = new Promise<void>((r) => { release = r; });
    let sweeping!: () => void;
    const started = new Promise<void>((r) => { sweeping = r; });
    // A real sweep lock in the store (no checkpoint runs now, so it is granted), held for 1.5 s.
    const sweep = new ChunkGcLocks(plane.ctx).trySweep(20_000, async () => {
      sweeping();
      await held;
      return true;
    });
    await Promise.race([started, sweep.then((r) => {
      if (r === undefined) throw new Error('the sweep lock was not granted');
    })]);
    const releaseTimer = setTimeout(release, 1_500);
    try {
      const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-gc', evidence: EXITED });
      expect(done.outcome).toBe('completed');
      expect(await protectedNow(g)).toBe(true);
    } finally {
      clearTimeout(releaseTimer);
      release();
    }
    expect(await sweep).toBe(true);
  });

  it('a setting other than 0 leaves the group running at the answer', async () => {
    const g = await open('conv-after-never', 'never');
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-never');
    const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-never', evidence: EXITED });
    expect(done.groupProtected).not.toBe(true);
    expect((await fleet.group(g)).lifecycle.state).toBe('RUNNING');
  });

  it('a checkpoint that fails after the turn: the turn is answered completed, reported unprotected, and the next completion protects it (seam: the agent client refuses checkpoint commands)', async () => {
    const g = await open('conv-after-fail', 0);
    const agents = plane.ctx.agents;
    const real = agents.send.bind(agents);
    const failing: typeof agents.send = (target, commandId, body, expect, timeoutMs) => (body.$case === 'checkpoint'
      ? Promise.reject(new Unavailable('host_unreachable', 'checkpoint refused by the test seam'))
      : real(target, commandId, body, expect, timeoutMs));
    const failedBefore = await idleStops('failed');
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-fail');
    (agents as { send: typeof agents.send }).send = failing;
    let done;
    try {
      done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-fail', evidence: EXITED });
    } finally {
      (agents as { send: typeof agents.send }).send = real;
    }
    expect(done).toMatchObject({ outcome: 'completed', savedLocator: 'sess-fail' });
    expect(done?.groupProtected).not.toBe(true);
    const rec = await fleet.group(g);
    expect(rec.lifecycle.state).toBe('STOPPED');
    expect(await protectedNow(g)).toBe(false);
    expect(await idleStops('failed')).toBe(failedBefore + 1);
    const events = (await fleet.store.events.read({ subjectKind: 'group', subjectId: g, limit: 100 })).events.map((e) => e.event);
    expect(events.find((e) => e.type === 'turn_end_unprotected')).toMatchObject({ reason: 'failed', detail: { memberId: 'm1', turnId: begun.turnId } });
    // The next turn (the seam gone) starts it again and its completion protects it.
    const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    expect(next.contextState).toBe('RESTORED');
    await fleet.writeSession(next.hostId, next.containerId, 'sess-fail');
    expect((await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: next.turnId, observedLocator: 'sess-fail', evidence: EXITED })).groupProtected).toBe(true);
    expect(await protectedNow(g)).toBe(true);
  });
});

describe('idle_stop_after 0 with protect_in_background: the completion answers first, the group is protected after', () => {
  async function waitProtected(groupId: string): Promise<void> {
    await fleet.waitFor(`${groupId} protected after the answer`, async () => ((await protectedNow(groupId)) ? true : undefined), 30_000);
  }

  it('answers protection_pending before the stop; the group is then stopped cleanly and checkpointed; the next turn is RESTORED with the same locator', async () => {
    const g = await open('conv-bg', 0);
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-bg');
    const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-bg', evidence: EXITED, protectInBackground: true });
    // The answer came before the clean stop: not protected yet, and it says so.
    expect(await protectedNow(g)).toBe(false);
    expect(done).toMatchObject({ outcome: 'completed', savedLocator: 'sess-bg', protectionPending: true });
    expect(done.groupProtected).not.toBe(true);
    await waitProtected(g);
    const rec = await fleet.group(g);
    expect(rec.lifecycle.stop?.clean).toBe(true);
    const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    expect(next.contextState).toBe('RESTORED');
    expect(next.locator).toBe('sess-bg');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: next.turnId, observedLocator: 'sess-bg', evidence: EXITED, protectInBackground: true });
    await waitProtected(g);
    await plane.whenIdle();
  });

  it('a next turn begun right after the answer wins the race: it runs to its end, no stop lands mid-turn, and its own completion protects the group', async () => {
    const g = await open('conv-bg-race', 0);
    for (let i = 0; i < 4; i++) {
      const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
      await fleet.writeSession(begun.hostId, begun.containerId, 'sess-bg-race');
      // The turn is in flight: whatever the background protection of the previous turn does, it
      // must leave the group running until this turn completes.
      const mid = await fleet.group(g);
      expect(mid.lifecycle.state).toBe('RUNNING');
      const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-bg-race', evidence: EXITED, protectInBackground: true });
      expect(done).toMatchObject({ outcome: 'completed', savedLocator: 'sess-bg-race', protectionPending: true });
    }
    await waitProtected(g);
    const events = (await fleet.store.events.read({ subjectKind: 'group', subjectId: g, limit: 200 })).events.map((e) => e.event);
    expect(events.filter((e) => e.type === 'turn_end_unprotected' && e.reason !== 'turn_in_flight')).toEqual([]);
    expect((await fleet.group(g)).lifecycle.stop?.clean).toBe(true);
  });

  it('is ignored with a setting other than 0: no protection pending, the group keeps running', async () => {
    const g = await open('conv-bg-never', 'never');
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-bg-never');
    const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-bg-never', evidence: EXITED, protectInBackground: true });
    expect(done.protectionPending).not.toBe(true);
    await plane.whenIdle();
    expect((await fleet.group(g)).lifecycle.state).toBe('RUNNING');
  });
});
