// Positive ownership (R-H6, R-R6) with real parts: a real nats-server, two real dockerd hosts, real
// host agents and a real control plane. A host that registers again deletes a group's containers
// only on positive, fenced proof read from that group's own record — never because the group is
// missing from a listing (more records than a listing returns), unreadable (a record this version
// cannot validate), or under an evacuation that has not finished. Each case below deleted live
// writable layers before (the agent deleted every group the registration ack did not list).
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { GroupRecordSchema, type GroupRecord } from '../../../src/control-plane/records.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { DEFAULT_BUCKETS } from '../../../src/store/connection.ts';
import { shardIndex } from '../../../src/store/sharded-kv-repository.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let n = 0;
const key = () => `own-${++n}`;

beforeAll(async () => {
  // A short evacuation deadline: the "restore cannot happen" case ends LOST within the test.
  fleet = await startFleet(2, { evacuationDeadlineMs: 8_000 });
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 240_000);

afterAll(async () => {
  await fleet?.cleanup();
});

/** A conversation on host-a with one completed turn; cleanly stopped (so checkpointed) if `stop`. */
async function groupOnA(conversationId: string, stop: boolean): Promise<string> {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }] });
  expect(group.hostId).toBe('host-a');
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
  const locator = `sess-${conversationId}`;
  await fleet.writeSession(begun.hostId, begun.containerId, locator);
  await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: SUCCESS });
  if (stop) expect((await plane.runner.stopGroup({ idempotencyKey: key(), groupId: group.groupId })).checkpointId).toBeDefined();
  return group.groupId;
}

/** The group's containers on host index `i` (its dockerd), as the engine lists them. */
async function copiesOn(i: number, groupId: string): Promise<{ id: string; running: boolean }[]> {
  const list = await fleet.hosts[i]!.docker.listContainers({ all: true, filters: { label: [`sandboxfleet.group=${groupId}`] } });
  return list.map((c) => ({ id: c.Id, running: c.State === 'running' }));
}

async function restartAgentA(): Promise<void> {
  const before = (await fleet.host('host-a')).lifecycle.epoch;
  await fleet.stopAgent('host-a');
  await fleet.startAgentOn('host-a', 0);
  expect((await fleet.host('host-a')).lifecycle.epoch).toBeGreaterThan(before);
}

async function hostState(hostId: string, state: string, timeoutMs = 60_000): Promise<void> {
  await fleet.waitFor(`${hostId} ${state}`, async () => ((await fleet.host(hostId)).lifecycle.state === state ? true : undefined), timeoutMs);
}

describe('a host that registers again deletes nothing on absence', () => {
  it('keeps live groups past the 10,000 records a listing returns, and a group whose record fails validation', async () => {
    const live = await groupOnA('conv-live', false);
    const corrupt = await groupOnA('conv-corrupt', false);
    // 10,050 other group records whose ids sort before the live ones (a listing is cut at 10,000).
    const repo = fleet.store.shardedRepository('groups', GroupRecordSchema);
    const now = Date.now();
    const filler = (i: number): GroupRecord => ({
      groupId: `a-filler-${String(i).padStart(6, '0')}`, conversationId: `filler-${i}`,
      lifecycle: { state: 'STOPPED', hostId: 'host-gone', generation: 1, activityVersion: 1, lastActivityAtMs: now, stop: { clean: true } },
      members: [{ session: { memberId: 'm1', cli: 'claude_code', phase: 'RETAINED', savedLocator: `s-${i}`, completedTurns: 1 } as GroupRecord['members'][number]['session'] }],
      starts: 1, stops: 1, createdAtMs: now, updatedAtMs: now,
    });
    const total = 10_050;
    for (let next = 0; next < total;) {
      const batch = Array.from({ length: Math.min(256, total - next) }, (_, j) => next + j);
      next += batch.length;
      await Promise.all(batch.map((i) => repo.create(Keys.group(filler(i).groupId), filler(i))));
    }
    expect(Keys.group(filler(total - 1).groupId) < Keys.group(live)).toBe(true);
    // A record this version cannot read (e.g. written by a newer schema): raw bytes under its key.
    const shards = DEFAULT_BUCKETS.groups.shards;
    const kv = await new Kvm(jetstream(fleet.nc)).open(`${DEFAULT_BUCKETS.groups.bucket}_${shardIndex(Keys.group(corrupt), shards)}`);
    await kv.put(Keys.group(corrupt), new TextEncoder().encode('{"groupId": 42}'));

    expect(await copiesOn(0, live)).toHaveLength(1);
    expect(await copiesOn(0, corrupt)).toHaveLength(1);
    await restartAgentA();
    expect(await copiesOn(0, live), 'a live group beyond the listing limit').toEqual([expect.objectContaining({ running: true })]);
    expect(await copiesOn(0, corrupt), 'a group whose record cannot be read').toEqual([expect.objectContaining({ running: true })]);
    // The unreadable record is visible to operators, not read as "absent".
    await fleet.waitFor('the read model counts the invalid record', async () => (plane.fleet.invalidGroupCount() >= 1 ? true : undefined));
  }, 240_000);

  it('keeps the copy of a group whose host came back from DEAD while its restore is pending, and after it failed; deletes it once restored elsewhere', async () => {
    const pending = await groupOnA('conv-pending', true);
    // host-a goes silent: DEAD after TTL + grace; the clean group is marked for an unplanned
    // evacuation, and no other host can take it (host-b is not registered).
    await fleet.stopAgent('host-a');
    await hostState('host-a', 'DEAD');
    await fleet.waitFor('evacuation marked', async () => ((await fleet.group(pending)).evacuation?.kind === 'unplanned' ? true : undefined));
    await fleet.startAgentOn('host-a', 0);
    await hostState('host-a', 'READY', 10_000);
    expect((await fleet.group(pending)).lifecycle.hostId).toBe('host-a');
    expect(await copiesOn(0, pending), 'restore pending: the only good copy stays').toHaveLength(1);

    // Nowhere to restore it before the deadline: LOST. Its layers stay for an operator.
    const lost = await fleet.waitFor('LOST no_eligible_host', async () => {
      const g = await fleet.group(pending);
      return g.lifecycle.state === 'LOST' ? g : undefined;
    }, 60_000);
    expect(lost.lifecycle.lostReason).toBe('no_eligible_host');
    expect(lost.lostAtMs).toBeDefined();
    await restartAgentA();
    expect(await copiesOn(0, pending), 'restore failed: the layers stay (LOST retention)').toEqual([expect.objectContaining({ running: false })]);

    // A group restored on host-b: host-a's copy is proven not needed and goes.
    const moved = await groupOnA('conv-moved', true);
    await fleet.startAgentOn('host-b', 1);
    await hostState('host-b', 'READY', 10_000);
    await fleet.stopAgent('host-a');
    await fleet.waitFor('restored on host-b', async () => {
      const g = await fleet.group(moved);
      return g.lifecycle.hostId === 'host-b' && g.lifecycle.state === 'STOPPED' ? true : undefined;
    }, 90_000);
    expect(await copiesOn(0, moved), 'host-a was silent: its copy is still there').toHaveLength(1);
    await fleet.startAgentOn('host-a', 0);
    await fleet.waitFor('host-a copy deleted', async () => ((await copiesOn(0, moved)).length === 0 ? true : undefined), 10_000);
    expect(await copiesOn(1, moved)).toHaveLength(1);
    expect(await copiesOn(0, pending), 'the LOST group is untouched').toHaveLength(1);
    const judged = (await fleet.store.events.read({ subjectKind: 'group', subjectId: moved, limit: 1000 })).events.map((e) => e.event);
    expect(judged.some((e) => e.type === 'host_copy_judged' && e.reason === 'placed_elsewhere')).toBe(true);
  }, 300_000);
});
