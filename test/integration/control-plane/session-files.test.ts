// Native session files in checkpoints (R-G3, R-G5, R-R1): the host agent finds each member's session
// file by its CLI's layout and names it in the manifest, and the restore on the new host proves it.
// A group whose saved session is NOT in its writable layer (the CLI never wrote it, or it was
// deleted) can never be restored with its memory: draining its host declares it LOST
// `session_files_missing` at once — loudly (event, metric) — instead of "restoring" a container whose
// next `--resume` would start a fresh session under the old locator.
// Real nats-server, two real dockerd hosts, real agents, one ControlPlane leader.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { nativeSessionPath } from '../../support/native-session.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
const metrics = new FleetMetrics();
let n = 0;
const key = () => `sf-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(2);
  plane = await fleet.startPlane({ metrics });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 180_000);

afterAll(async () => {
  await fleet?.cleanup();
});

/** A group with one member of `cli` that completed a turn as `locator`, its session file written (or not), stopped cleanly. */
async function stoppedGroup(conversationId: string, cli: 'claude_code' | 'pi', locator: string, writeFile: boolean): Promise<string> {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli }] });
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1' });
  if (writeFile) await fleet.writeSession(begun.hostId, begun.containerId, locator, cli);
  await plane.runner.completeTurn({ idempotencyKey: key(), groupId: group.groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: SUCCESS });
  await plane.runner.stopGroup({ idempotencyKey: key(), groupId: group.groupId });
  return group.groupId;
}

describe('native session files through a drain', () => {
  it('names the session files the agent found, restores and proves them; a group without its session file is LOST session_files_missing', async () => {
    const kept = await stoppedGroup('conv-kept', 'claude_code', '5b1e0c7a-3d2f-4a9b-8e6c-1f0a2b3c4d5e', true);
    const keptPi = await stoppedGroup('conv-kept-pi', 'pi', '9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d', true);
    const missing = await stoppedGroup('conv-missing', 'claude_code', '0d9c8b7a-6f5e-4d3c-8b2a-190817263544', false);
    const lostBefore = (await metrics.registry.getSingleMetric('sandboxfleet_lost_sessions_total')?.get())?.values.find((v) => v.labels.reason === 'session_files_missing')?.value ?? 0;

    // The checkpoint taken right after each clean stop names the file found by the CLI's layout.
    const g = await fleet.group(kept);
    const record = (await plane.repos.checkpoints.get(Keys.checkpoint(kept, g.latestCheckpointId!)))!.value;
    const manifest = await fleet.chunks.getManifest(record.sourceHostId, kept, record.checkpointId);
    expect(manifest.members[0]!.nativeSessionPaths).toEqual([nativeSessionPath('claude_code', '5b1e0c7a-3d2f-4a9b-8e6c-1f0a2b3c4d5e')]);
    expect((await fleet.group(missing)).latestCheckpointId).toBeUndefined();

    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    expect(await plane.drainHost('host-a')).toBe(true);

    const lost = await fleet.waitFor(`${missing} LOST`, async () => {
      const x = await fleet.group(missing);
      return x.lifecycle.state === 'LOST' ? x.lifecycle : undefined;
    }, 60_000);
    expect(lost.lostReason).toBe('session_files_missing');
    for (const id of [kept, keptPi]) {
      await fleet.waitFor(`${id} on host-b`, async () => {
        const x = await fleet.group(id);
        return x.lifecycle.state === 'STOPPED' && x.lifecycle.hostId === 'host-b' && x.evacuation === undefined ? true : undefined;
      }, 90_000);
      const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: id, memberId: 'm1' });
      expect(next).toMatchObject({ contextState: 'RESTORED', hostId: 'host-b' });
    }
    const lostAfter = (await metrics.registry.getSingleMetric('sandboxfleet_lost_sessions_total')?.get())?.values.find((v) => v.labels.reason === 'session_files_missing')?.value ?? 0;
    expect(lostAfter - lostBefore).toBeGreaterThanOrEqual(1);
    const events = await fleet.store.events.read({ subjectKind: 'group', subjectId: missing, limit: 200 });
    expect(events.events.some((e) => e.event.type === 'group_lost' && e.event.reason === 'session_files_missing')).toBe(true);
    await expect(plane.runner.beginTurn({ idempotencyKey: key(), groupId: missing, memberId: 'm1' })).rejects.toMatchObject({ reason: 'context_lost' });
  });
});
