// The turn hot path of the real runner backend (R-I1, R-S1, R-S8), with real NATS, a real dockerd
// host and a real agent:
// - a begin+complete pair is exactly two group-record writes, and no idempotency-bucket record;
// - idempotency rides in the group record: a retry gets the first answer, the same key with another
//   request and a key older than the member's last call are refused `idempotency_key_reused` —
//   never executed again (no second turn from a stale retry);
// - LIVE is decided from heartbeat evidence only when the heartbeat lists the very container
//   incarnation that ran the last turn; a container restarted behind our back is RESTORED once the
//   heartbeat shows the new incarnation, and NEW/RESTORED always ask the agent.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import type { ControlPlaneRunnerBackend } from '../../../src/control-plane/runner-backend.ts';
import { GroupRecordSchema } from '../../../src/control-plane/records.ts';
import { Keys, openRepositories } from '../../../src/control-plane/state.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let backend: ControlPlaneRunnerBackend;
let n = 0;
const key = () => `hp-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(1);
  plane = await fleet.startPlane();
  backend = plane.runner as ControlPlaneRunnerBackend;
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 180_000);

afterAll(async () => {
  await fleet?.cleanup();
});

async function revision(groupId: string): Promise<number> {
  return (await fleet.store.shardedRepository('groups', GroupRecordSchema).get(Keys.group(groupId)))!.revision;
}

async function idempotencyKeys(): Promise<string[]> {
  return [...(await openRepositories(fleet.store).idempotency.keys()).keys].sort();
}

/** Wait until a heartbeat received after `sinceMs` lists the member's container. */
async function heartbeatAfter(sinceMs: number): Promise<void> {
  // Heartbeats live in the control plane's read model (memory), not in a bucket.
  await fleet.waitFor('a newer heartbeat', async () => ((plane.fleet.heartbeat('host-a')?.receivedAtMs ?? 0) > sinceMs ? true : undefined), 10_000);
}

describe('turn hot path', () => {
  it('costs two group writes per pair and answers retries from the group record', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-hot', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const groupId = group.groupId;
    const before = await idempotencyKeys();

    const k1 = key();
    const first = await plane.runner.beginTurn({ idempotencyKey: k1, groupId, memberId: 'm1' });
    expect(first.contextState).toBe('NEW');
    expect(await plane.runner.beginTurn({ idempotencyKey: k1, groupId, memberId: 'm1' })).toEqual(first);
    await expect(plane.runner.beginTurn({ idempotencyKey: k1, groupId, memberId: 'm1', locator: 'sess-x' })).rejects.toMatchObject({ reason: 'idempotency_key_reused' });
    const c1 = key();
    const done = await plane.runner.completeTurn({ idempotencyKey: c1, groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 'sess-hot', evidence: SUCCESS });
    expect(done).toMatchObject({ outcome: 'completed', sessionKept: true, savedLocator: 'sess-hot', nextContextState: 'LIVE' });
    expect(await plane.runner.completeTurn({ idempotencyKey: c1, groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 'sess-hot', evidence: SUCCESS })).toEqual(done);

    await heartbeatAfter(Date.now());
    const counts0 = backend.beginEvidenceCounts;
    const r0 = await revision(groupId);
    for (let i = 0; i < 5; i++) {
      // A heartbeat at most ~400 ms old (evidence counts within 2 intervals = 1 s): on a loaded
      // machine a late beat would rightly send the begin to the agent instead.
      await heartbeatAfter(Date.now() - 400);
      const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
      expect(begun.contextState).toBe('LIVE');
      await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-hot', evidence: SUCCESS });
    }
    // Two compare-and-set writes per pair, the answers inside them; LIVE proven from heartbeats.
    expect((await revision(groupId)) - r0).toBe(10);
    expect(await idempotencyKeys()).toEqual(before);
    expect(backend.beginEvidenceCounts.heartbeat - counts0.heartbeat).toBe(5);
    expect(backend.beginEvidenceCounts.agent).toBe(counts0.agent);

    // A stale retry of the first begin (its answer no longer kept) is refused, never a new turn.
    const r1 = await revision(groupId);
    await expect(plane.runner.beginTurn({ idempotencyKey: k1, groupId, memberId: 'm1' })).rejects.toMatchObject({ reason: 'idempotency_key_reused' });
    await expect(plane.runner.completeTurn({ idempotencyKey: c1, groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 'sess-hot', evidence: SUCCESS })).rejects.toMatchObject({ reason: 'idempotency_key_reused' });
    expect(await revision(groupId)).toBe(r1);
    expect((await plane.runner.getGroupState({ groupId })).members[0]).toMatchObject({ phase: 'RETAINED', completedTurns: 6 });

    // A refusal is remembered too: the same key gets the same refusal without a second write.
    const busy = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    const kBusy = key();
    await expect(plane.runner.beginTurn({ idempotencyKey: kBusy, groupId, memberId: 'm1' })).rejects.toMatchObject({ reason: 'turn_in_flight' });
    const r2 = await revision(groupId);
    await expect(plane.runner.beginTurn({ idempotencyKey: kBusy, groupId, memberId: 'm1' })).rejects.toMatchObject({ reason: 'turn_in_flight' });
    expect(await revision(groupId)).toBe(r2);
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: busy.turnId, observedLocator: 'sess-hot', evidence: SUCCESS });
  }, 120_000);

  it('reports RESTORED, asking the agent, once the heartbeat shows another container incarnation', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-restart', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const groupId = group.groupId;
    const t1 = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: t1.turnId, observedLocator: 'sess-r', evidence: SUCCESS });
    // Restart the member's container behind the control plane's back (a new incarnation).
    await fleet.hosts[0]!.docker.getContainer(t1.containerId).restart({ t: 1 });
    await heartbeatAfter(Date.now());
    const agentBefore = backend.beginEvidenceCounts.agent;
    const t2 = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(t2.contextState).toBe('RESTORED');
    expect(backend.beginEvidenceCounts.agent).toBe(agentBefore + 1);
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: t2.turnId, observedLocator: 'sess-r', evidence: SUCCESS });
  }, 120_000);
});
