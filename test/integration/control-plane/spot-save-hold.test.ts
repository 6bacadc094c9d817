// The groups queue and the spot evacuator share one hold per group (MigrationController
// #inProgress), with real parts: a real nats-server, a real dockerd host, a real agent and a real
// control plane whose loops are off (autoReconcile: false), so this test alone calls the controller.
// A groups-queue run that finds the group held by the spot evacuator's save must ask to look again,
// not drop the key: the save's last write may already have been heard, so no later change brings
// the key back, and the group then waited for the 10-minute resync at "planned, 0 attempts" before
// its restore (bench/survival's spot part: one of 100 groups restored after 553 s).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { GroupRecordSchema } from '../../../src/control-plane/records.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let n = 0;
const key = () => `ssh-${++n}`;
/** Set by the test: runs at the save's after_checkpoint step, i.e. after its last write. */
let atCheckpointed: ((groupId: string) => Promise<void>) | undefined;

beforeAll(async () => {
  // A long evacuation deadline: the group must still be waiting for a target at the end, not LOST.
  fleet = await startFleet(1, { evacuationDeadlineMs: 300_000 });
  plane = await fleet.startPlane({
    autoReconcile: false,
    stepHook: async (step, groupId) => {
      if (step === 'after_checkpoint') await atCheckpointed?.(groupId);
    },
  });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 240_000);

afterAll(async () => {
  await fleet?.cleanup();
});

describe('a group the spot evacuator is saving', () => {
  it('is looked at again by the groups queue, not dropped, while the save holds it', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-ssh', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const groupId = group.groupId;
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-ssh');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-ssh', evidence: SUCCESS });
    expect((await fleet.group(groupId)).lifecycle.state).toBe('RUNNING');

    expect(await plane.drainHost('host-a', 'spot_preemption')).toBe(true);
    await fleet.waitFor('the read model shows host-a draining', async () => (plane.fleet.host(Keys.host('host-a'))?.value.lifecycle.state === 'DRAINING' ? true : undefined));

    let release!: () => void;
    const released = new Promise<void>((resolve) => { release = resolve; });
    let reached!: () => void;
    const checkpointed = new Promise<void>((resolve) => { reached = resolve; });
    atCheckpointed = async (id) => {
      if (id !== groupId) return;
      atCheckpointed = undefined;
      reached();
      await released;
    };
    const saving = plane.controller.saveBeforeDeparture(groupId);
    await checkpointed;
    // The save's last write (the checkpoint on the group record) is in the store and then in the
    // read model: the change that would have queued the key has come and gone.
    await fleet.waitFor('the read model shows the checkpoint', async () => (plane.fleet.group(Keys.group(groupId))?.value.latestCheckpointId !== undefined ? true : undefined));

    const before = await fleet.store.shardedRepository('groups', GroupRecordSchema).get(Keys.group(groupId));
    let saved = false;
    void saving.then(() => { saved = true; });
    const whileHeld = await plane.controller.reconcileGroup(groupId);
    expect(whileHeld.requeueAfterMs).toBeGreaterThan(0);
    // It was held, not merely waiting for a target: the save is still paused and nothing was written.
    expect(saved).toBe(false);
    expect((await fleet.store.shardedRepository('groups', GroupRecordSchema).get(Keys.group(groupId)))?.revision).toBe(before?.revision);

    release();
    expect(await saving).toBe('saved');
    const g = await fleet.group(groupId);
    expect({ state: g.lifecycle.state, clean: g.lifecycle.stop?.clean, evacuation: g.evacuation?.kind, attempts: g.evacuation?.attempts }).toEqual({ state: 'STOPPED', clean: true, evacuation: 'planned', attempts: 0 });
    // Released: the next look proceeds (no other READY host here, so it waits for one).
    expect((await plane.controller.reconcileGroup(groupId)).requeueAfterMs).toBeGreaterThan(0);
  }, 240_000);
});
