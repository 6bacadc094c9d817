// Regression (R-S2, R-G2, R-G3, R-H5): a group whose last turn was refused AT END for a locator
// mismatch keeps its saved locator and its member RETAINED; the group is RUNNING, so draining its
// host must stop it cleanly, checkpoint it and migrate it — never declare it LOST `no_checkpoint`.
// Real nats-server, two real dockerd hosts, real agents, one ControlPlane leader.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let n = 0;
const key = () => `mm-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(3);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 180_000);

afterAll(async () => {
  await fleet?.cleanup();
});

describe('locator mismatch at turn end, then drain', () => {
  it('keeps the member RETAINED and migrates the group cleanly', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-mismatch', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const groupId = group.groupId;
    expect(group.hostId).toBe('host-a');

    const first = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(first.contextState).toBe('NEW');
    await fleet.writeSession(first.hostId, first.containerId, 'sess-1');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 'sess-1', evidence: SUCCESS });

    const live = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(live.contextState).toBe('LIVE');
    await fleet.writeSession(live.hostId, live.containerId, 'sess-1');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: live.turnId, observedLocator: 'sess-1', evidence: SUCCESS });
    await expect(plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1', locator: 'sess-other' })).rejects.toMatchObject({ reason: 'locator_mismatch' });
    // The end-to-end sequence: a clean stop (and its checkpoint) before the refused turn, which then
    // runs RESTORED on the restarted containers.
    const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId });
    expect(stopped.group.stopClean).toBe(true);
    expect(stopped.checkpointId).toBeDefined();
    const second = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(second.contextState).toBe('RESTORED');
    const refusedKey = key();
    const refusedCall = { idempotencyKey: refusedKey, groupId, memberId: 'm1', turnId: second.turnId, observedLocator: 'sess-other', evidence: SUCCESS };
    await expect(plane.runner.completeTurn(refusedCall)).rejects.toMatchObject({ reason: 'locator_mismatch' });
    // A retry of the refused call gets the same refusal (R-I1), and the record is unchanged by it.
    await expect(plane.runner.completeTurn(refusedCall)).rejects.toMatchObject({ reason: 'locator_mismatch' });
    // ... and so does a repeat of that end under a new key (core: a refused end is refused again).
    await expect(plane.runner.completeTurn({ ...refusedCall, idempotencyKey: key() })).rejects.toMatchObject({ reason: 'locator_mismatch' });

    const state = await plane.runner.getGroupState({ groupId });
    expect(state.state).toBe('RUNNING');
    expect(state.members[0]).toMatchObject({ phase: 'RETAINED', savedLocator: 'sess-1' });

    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    expect(await plane.drainHost('host-a')).toBe(true);

    const moved = await fleet.waitFor(`${groupId} moved to host-b`, async () => {
      const g = await fleet.group(groupId);
      if (g.lifecycle.state === 'LOST') throw new Error(`group LOST ${g.lifecycle.lostReason}`);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? g : undefined;
    }, 90_000).catch(async (err: unknown) => {
      const g = await fleet.group(groupId);
      throw new Error(`${String(err)}; group now ${g.lifecycle.state} ${g.lifecycle.lostReason ?? ''}`);
    });
    expect(moved.lifecycle.stop).toEqual({ clean: true });
    expect(moved.lifecycle.generation).toBe(2);
    expect(moved.members[0]!.session).toMatchObject({ phase: 'RETAINED', savedLocator: 'sess-1' });

    // The next turn resumes the saved session with a new process on the new host (R-S1).
    const after = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(after.contextState).toBe('RESTORED');
    expect(after.locator).toBe('sess-1');
    expect(after.hostId).toBe('host-b');
    await fleet.writeSession(after.hostId, after.containerId, 'sess-1');
    const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: after.turnId, observedLocator: 'sess-1', evidence: SUCCESS });
    expect(done.savedLocator).toBe('sess-1');
  }, 180_000);

  it('migrates cleanly when the refused end arrives while the drain waits for the turn', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-mismatch-during-drain', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const groupId = group.groupId;
    expect(group.hostId).toBe('host-b');
    const first = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    await fleet.writeSession(first.hostId, first.containerId, 'sess-2');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 'sess-2', evidence: SUCCESS });
    const live = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(live.contextState).toBe('LIVE');

    await fleet.startAgentOn('host-c', 2);
    await fleet.waitFor('host-c READY', async () => ((await fleet.host('host-c')).lifecycle.state === 'READY' ? true : undefined));
    expect(await plane.drainHost('host-b')).toBe(true);
    // The controller waits (bounded, turnWaitMs) for the turn in flight; it ends refused meanwhile.
    await fleet.waitFor('evacuation marked', async () => ((await fleet.group(groupId)).evacuation !== undefined ? true : undefined), 10_000);
    await expect(plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: live.turnId, observedLocator: 'sess-other', evidence: SUCCESS })).rejects.toMatchObject({ reason: 'locator_mismatch' });

    const moved = await fleet.waitFor(`${groupId} moved to host-c`, async () => {
      const g = await fleet.group(groupId);
      if (g.lifecycle.state === 'LOST') throw new Error(`group LOST ${g.lifecycle.lostReason}`);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-c' && g.evacuation === undefined ? g : undefined;
    }, 90_000);
    expect(moved.lifecycle.stop).toEqual({ clean: true });
    expect(moved.members[0]!.session).toMatchObject({ phase: 'RETAINED', savedLocator: 'sess-2' });
    expect((await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' })).contextState).toBe('RESTORED');
  }, 180_000);
});
