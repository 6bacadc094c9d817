// A host that is fine but no longer has a stopped group's containers (R-G6 for one group: its
// Docker data dir was replaced, e.g. the local fleet restarted on fresh data roots, or the
// containers were removed by hand), with real parts: real nats-server, two real dockerd hosts, real
// host agents, one ControlPlane. The next turn's start finds nothing to start: instead of an
// INTERNAL error, the runner is told to retry (UNAVAILABLE container_missing) while the group is
// recovered from its checkpoint, and its retry is RESTORED with its locator. Without a usable
// checkpoint the group is LOST with the reason, and the turn refused context_lost. A running group
// whose containers are gone is LOST host_lost_running when stopped (a drain would otherwise retry
// its stop forever) or at its next begin (it would otherwise stay RUNNING with its member LOST).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { CheckpointRecordSchema } from '../../../src/control-plane/records.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let n = 0;
const key = () => `cg-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(2);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
});

afterAll(async () => {
  await fleet?.cleanup();
});

/** A conversation with one completed turn, cleanly stopped (so checkpointed) on host-a. */
async function stoppedGroup(conversationId: string, locator: string): Promise<string> {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }] });
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
  await fleet.writeSession(begun.hostId, begun.containerId, locator);
  await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: SUCCESS });
  await plane.runner.stopGroup({ idempotencyKey: key(), groupId: group.groupId });
  return group.groupId;
}

/** The engine of each host the agents run as (startAgentOn above and in the first test). */
const HOST_INDEX: Record<string, number> = { 'host-a': 0, 'host-b': 1 };

/** What a fresh Docker data root does to a group: its containers (and writable layers) are gone. */
async function removeContainers(groupId: string): Promise<void> {
  const docker = fleet.hosts[HOST_INDEX[(await fleet.group(groupId)).lifecycle.hostId]!]!.docker;
  const list = await docker.listContainers({ all: true, filters: { label: [`sandboxfleet.group=${groupId}`] } });
  expect(list.length).toBeGreaterThan(0);
  for (const c of list) await docker.getContainer(c.Id).remove({ force: true });
}

async function beginOutcome(groupId: string): Promise<{ ok: true; value: Awaited<ReturnType<ControlPlane['runner']['beginTurn']>> } | { ok: false; error: { status?: string; reason?: string } }> {
  try {
    return { ok: true, value: await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' }) };
  } catch (err) {
    return { ok: false, error: err as { status?: string; reason?: string } };
  }
}

describe('a stopped group whose containers are gone from a live host', () => {
  it('is recovered from its checkpoint: the runner is told to retry, then the turn is RESTORED with its locator', async () => {
    const groupId = await stoppedGroup('conv-gone', 'sess-gone');
    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    const before = await fleet.group(groupId);
    await removeContainers(groupId);

    const first = await beginOutcome(groupId);
    expect(first.ok).toBe(false);
    if (!first.ok) expect(first.error).toMatchObject({ status: 'UNAVAILABLE', reason: 'container_missing' });
    const turn = await fleet.waitFor('a turn on the recovered group', async () => {
      const r = await beginOutcome(groupId);
      if (!r.ok && r.error.status !== 'UNAVAILABLE') throw new Error(`refused: ${r.error.status} ${r.error.reason}`);
      return r.ok ? r.value : undefined;
    }, 90_000);
    expect(turn).toMatchObject({ contextState: 'RESTORED', locator: 'sess-gone' });
    const after = await fleet.group(groupId);
    expect(after.lifecycle.generation).toBeGreaterThan(before.lifecycle.generation);
    const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 100 });
    expect(events.find((e) => e.event.type === 'evacuation_started')?.event.reason).toBe('docker_data_lost');
  });

  it('a running group whose containers are gone is LOST host_lost_running when it is stopped, never stuck', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-gone-running', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-gone-3', evidence: SUCCESS });
    await removeContainers(group.groupId);
    await expect(plane.runner.stopGroup({ idempotencyKey: key(), groupId: group.groupId })).rejects.toMatchObject({ status: 'UNAVAILABLE', reason: 'container_missing' });
    const lost = await fleet.waitFor('group LOST', async () => {
      const x = await fleet.group(group.groupId);
      return x.lifecycle.state === 'LOST' ? x.lifecycle.lostReason : undefined;
    }, 60_000);
    expect(lost).toBe('host_lost_running');
  });

  it('a running group whose containers are gone is LOST host_lost_running at its next begin, not left RUNNING with its member LOST', async () => {
    // The chaos soak's seed 7154: a host's engine came back on an empty data root while a group ran
    // on it. The begin's fresh inventory lists nothing of the group; before, only the member was
    // marked LOST container_missing and the group stayed RUNNING on containers that do not exist.
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-gone-begin', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-gone-4', evidence: SUCCESS });
    expect((await fleet.group(group.groupId)).lifecycle.state).toBe('RUNNING');
    await removeContainers(group.groupId);
    // A heartbeat after the removal, so the begin cannot be decided from evidence older than it.
    await fleet.waitFor('a heartbeat without the group', async () => {
      const hb = plane.fleet.heartbeat(begun.hostId);
      return hb !== undefined && !hb.containers.some((c) => c.groupId === group.groupId) ? true : undefined;
    });

    expect(await beginOutcome(group.groupId)).toMatchObject({ ok: false, error: { status: 'UNAVAILABLE', reason: 'container_missing' } });
    const lost = await fleet.waitFor('group LOST', async () => {
      const x = await fleet.group(group.groupId);
      return x.lifecycle.state === 'LOST' ? x.lifecycle.lostReason : undefined;
    }, 60_000);
    expect(lost).toBe('host_lost_running');
    expect(await beginOutcome(group.groupId)).toMatchObject({ ok: false, error: { reason: 'context_lost' } });
    const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: group.groupId, limit: 100 });
    expect(events.find((e) => e.event.type === 'evacuation_started')?.event.reason).toBe('docker_data_lost');
    expect(events.some((e) => e.event.toState === 'LOST' && e.event.reason === 'host_lost_running')).toBe(true);
  });

  it('without a usable checkpoint is LOST with the reason, and its turn is refused context_lost', async () => {
    const groupId = await stoppedGroup('conv-gone-nockpt', 'sess-gone-2');
    const g = await fleet.group(groupId);
    const checkpoints = fleet.store.repository('checkpoints', CheckpointRecordSchema);
    const rec = await checkpoints.get(Keys.checkpoint(groupId, g.latestCheckpointId!));
    await fleet.chunks.deleteManifest(g.lifecycle.hostId, groupId, g.latestCheckpointId!);
    await checkpoints.delete(Keys.checkpoint(groupId, g.latestCheckpointId!), rec!.revision);
    await removeContainers(groupId);

    expect(await beginOutcome(groupId)).toMatchObject({ ok: false, error: { status: 'UNAVAILABLE', reason: 'container_missing' } });
    const lost = await fleet.waitFor('group LOST', async () => {
      const x = await fleet.group(groupId);
      return x.lifecycle.state === 'LOST' ? x.lifecycle.lostReason : undefined;
    }, 60_000);
    expect(lost).toBe('no_checkpoint');
    expect(await beginOutcome(groupId)).toMatchObject({ ok: false, error: { reason: 'context_lost' } });
  });
});
