// Idle auto-stop over the real stack (R-G2, R-G3, R-G6): real nats-server, a real dockerd host, a
// real host agent and a leading ControlPlane with its keyed idle-stop queue.
// 1. idle_stop_after 0: the group is stopped cleanly and checkpointed right after a completed turn
//    (exit confirmed, as `claude -p` per turn); the next BeginTurn starts it again RESTORED with the
//    same locator; the unprotected-groups gauge counts it while it runs and not once it is saved.
// 2. The fleet default (2 s here): a turn in flight is never stopped; a process kept idle for a LIVE
//    turn is stopped with its group (the next turn is RESTORED); `never` stays running.
// 3. Races decided by CAS: back-to-back turns against idle_stop_after 0 — every turn completes (no
//    stop lands mid-turn, no unclean stop); and with the read model held stale (a named seam: the
//    model's copy is replaced by an older one) the stop's compare-and-set sees the turn that got in
//    first and is not taken.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

/** A `claude -p` turn per exec: the CLI process exited and the runner saw it exit. */
const EXITED = { ...SUCCESS, processExited: true, exitConfirmed: true };

let fleet: Fleet;
let plane: ControlPlane;
const metrics = new FleetMetrics();
let n = 0;
const key = () => `idle-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(1, { idleStopAfterMs: 2_000, idleStopStartGraceMs: 1_500, unprotectedAlertAfterMs: 60_000 });
  plane = await fleet.startPlane({ metrics });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 180_000);

afterAll(async () => {
  await fleet?.cleanup();
});

async function open(conversationId: string, idleStopAfterMs?: number | 'never') {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }], ...(idleStopAfterMs !== undefined ? { idleStopAfterMs } : {}) });
  return group.groupId;
}

async function turn(groupId: string, locator: string, evidence = EXITED) {
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
  await fleet.writeSession(begun.hostId, begun.containerId, locator);
  const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence });
  return { begun, done };
}

async function savedByIdleStop(groupId: string, timeoutMs = 30_000) {
  return fleet.waitFor(`${groupId} stopped cleanly and checkpointed`, async () => {
    const g = await fleet.group(groupId);
    if (g.lifecycle.state !== 'STOPPED' || g.lifecycle.stop?.clean !== true || g.latestCheckpointId === undefined) return undefined;
    const cp = await plane.ctx.checkpoints.get(groupId, g.latestCheckpointId);
    return cp?.activityVersion === g.lifecycle.activityVersion ? g : undefined;
  }, timeoutMs);
}

async function gauge(name: string, host: string): Promise<number> {
  const m = (await metrics.registry.getSingleMetric(name)?.get())?.values ?? [];
  return m.filter((v) => v.labels.host === host).reduce((s, v) => s + v.value, 0);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('idle_stop_after 0: stopped and checkpointed after every completed turn', () => {
  it('saves the group after its turn, and the next turn starts it again RESTORED with the same locator', async () => {
    const g = await open('conv-idle0', 0);
    const first = await turn(g, 'sess-idle0');
    expect(first.begun.contextState).toBe('NEW');
    const saved = await savedByIdleStop(g);
    expect(saved.members[0]!.session.savedLocator).toBe('sess-idle0');
    expect(plane.protection.isUnprotected(g)).toBe(false);
    const events = (await fleet.store.events.read({ subjectKind: 'group', subjectId: g, limit: 100 })).events.map((e) => e.event);
    expect(events.some((e) => e.type === 'group_stop_requested' && String((e.detail as { why?: string }).why).startsWith('idle stop'))).toBe(true);

    // The next turn: BeginTurn on the stopped group starts it; the session is the same one.
    const second = await turn(g, 'sess-idle0');
    expect(second.begun.contextState).toBe('RESTORED');
    expect(second.done.savedLocator).toBe('sess-idle0');
    expect(second.done.outcome).toBe('completed');
    await savedByIdleStop(g);
    expect(await metrics.registry.getSingleMetric('sandboxfleet_idle_stops_total')?.get().then((m) => m.values.find((v) => v.labels.result === 'stopped')?.value)).toBeGreaterThanOrEqual(2);
  });
});

describe('the fleet default and the blockers', () => {
  it('never stops a turn in flight; stops once it completed and the group was idle for idleStopAfter', async () => {
    const g = await open('conv-default');
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-default');
    // Running, a turn in flight: unprotected (a host loss now would make it LOST).
    await fleet.waitFor('unprotected gauge counts the group', async () => ((await gauge('sandboxfleet_unprotected_groups', 'host-a')) >= 1 ? true : undefined), 10_000);
    expect(plane.protection.isUnprotected(g)).toBe(true);
    expect(await gauge('sandboxfleet_unprotected_group_oldest_age_seconds', 'host-a')).toBeGreaterThan(0);
    await sleep(4_000); // twice idleStopAfter
    expect((await fleet.group(g)).lifecycle.state).toBe('RUNNING');
    const completedAt = Date.now();
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-default', evidence: EXITED });
    const saved = await savedByIdleStop(g);
    // Not before its idle time ran out (the stop's event time).
    const stopEvent = (await fleet.store.events.read({ subjectKind: 'group', subjectId: g, limit: 100 })).events.map((e) => e.event).find((e) => e.type === 'group_stop_requested');
    expect(stopEvent!.timeMs - completedAt).toBeGreaterThanOrEqual(1_900);
    expect(saved.lifecycle.stop?.clean).toBe(true);
  });

  it('stops a group whose last turn kept its process idle (the next turn is RESTORED); leaves one set to never running', async () => {
    const live = await open('conv-live');
    await turn(live, 'sess-live', SUCCESS); // process kept for a LIVE next turn
    expect((await turn(live, 'sess-live', SUCCESS)).begun.contextState).toBe('LIVE');
    const never = await open('conv-never', 'never');
    await turn(never, 'sess-never');
    // The kept process is idle: its turn provably ended, the clean stop ends it.
    const saved = await savedByIdleStop(live);
    expect(saved.lifecycle.stop?.clean).toBe(true);
    expect((await turn(live, 'sess-live', SUCCESS)).begun.contextState).toBe('RESTORED');
    await sleep(3_000);
    expect((await fleet.group(never)).lifecycle.state).toBe('RUNNING');
    // Reopening with a setting changes it: the group is then saved.
    await open('conv-never', 0);
    expect((await fleet.group(never)).idleStopAfterMs).toBe(0);
    await turn(never, 'sess-never');
    await savedByIdleStop(never);
  });

  it('refuses an out-of-range setting', async () => {
    await expect(plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-bad', members: [{ memberId: 'm1', cli: 'claude_code' }], idleStopAfterMs: -5 })).rejects.toMatchObject({ reason: 'out_of_range' });
  });
});

describe('races with BeginTurn, decided by compare-and-set', () => {
  it('back-to-back turns against idle_stop_after 0: every turn completes, no stop lands mid-turn', async () => {
    const g = await open('conv-race', 0);
    const states: string[] = [];
    for (let i = 0; i < 8; i++) {
      const t = await turn(g, 'sess-race');
      states.push(t.begun.contextState);
      expect(t.done.outcome).toBe('completed');
      // Sometimes right away (racing the stop), sometimes after the stop got going.
      if (i % 2 === 1) await sleep(150 + Math.random() * 400);
    }
    const rec = await fleet.group(g);
    expect(rec.members[0]!.session.phase).not.toBe('UNCONFIRMED');
    expect(rec.lifecycle.state === 'LOST').toBe(false);
    const events = (await fleet.store.events.read({ subjectKind: 'group', subjectId: g, limit: 500 })).events.map((e) => e.event);
    expect(events.filter((e) => e.type === 'group_stopped' && e.reason === 'unclean')).toEqual([]);
    expect(states.slice(1).every((s) => s === 'RESTORED')).toBe(true);
  });

  it('a turn that got in first wins: the stop re-checks the stored record and is not taken (seam: read model held stale)', async () => {
    const g = await open('conv-first', 'never');
    await turn(g, 'sess-first');
    await plane.fleet.sync();
    // The model's copy as it is now: RUNNING, idle, the last turn long ago as far as it says.
    const stale = plane.fleet.group(Keys.group(g))!;
    const idleCopy = { ...stale, value: { ...stale.value, idleStopAfterMs: 0, lastTurnCompletedAtMs: 1, lifecycle: { ...stale.value.lifecycle, lastActivityAtMs: 1 } } };
    // The group is set to 0 in the store too, and a turn begins (IN_TURN in the store).
    await open('conv-first', 0);
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1' });
    const realGroup = plane.fleet.group.bind(plane.fleet);
    plane.fleet.group = (k: string) => (k === Keys.group(g) ? idleCopy : realGroup(k));
    const races = await metrics.registry.getSingleMetric('sandboxfleet_idle_stops_total')?.get().then((m) => m.values.find((v) => v.labels.result === 'lost_race')?.value ?? 0);
    await sleep(300); // past the stop pacing (10 per second in this fleet)
    try {
      await plane.idle.reconcile(g);
    } finally {
      plane.fleet.group = realGroup;
    }
    expect((await fleet.group(g)).lifecycle.state).toBe('RUNNING');
    expect((await fleet.group(g)).members[0]!.session.phase).toBe('IN_TURN');
    expect(await metrics.registry.getSingleMetric('sandboxfleet_idle_stops_total')?.get().then((m) => m.values.find((v) => v.labels.result === 'lost_race')?.value)).toBeGreaterThan(races!);
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-first');
    const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId: g, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-first', evidence: EXITED });
    expect(done.outcome).toBe('completed');
    await savedByIdleStop(g);
  });
});
