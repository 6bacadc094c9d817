// An idle conversation stays recoverable (R-G4, R-G6, R-R1), with real parts: real nats-server, three
// real dockerd hosts, real host agents, one ControlPlane. A group that stays cleanly STOPPED gets no
// new checkpoint from its own activity, so without refreshes its checkpoint ages past the maximum and
// a host loss makes it LOST `stale_checkpoint`. With the maximum at 20 s and refreshes after a
// quarter of it, the group is stopped, left idle past the maximum, and its host is killed (agent
// stopped, dockerd stopped, data root deleted): it is restored on the other host and its next turn is
// RESTORED with its locator. A refresh that finds a stopped group's containers gone from a live host
// recovers the group from its checkpoint on another host, with nobody calling.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { CheckpointRecordSchema } from '../../../src/control-plane/records.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { startFleet, stoppedAfterOneTurn, type Fleet } from './fleet-harness.ts';

const MAX_AGE_MS = 20_000;
let fleet: Fleet;
let plane: ControlPlane;
const metrics = new FleetMetrics();
let n = 0;
const key = () => `k-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(3, { checkpointMaxAgeMs: MAX_AGE_MS, checkpointRefreshFraction: 0.25 });
  plane = await fleet.startPlane({ metrics });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
});

afterAll(async () => {
  await fleet?.cleanup();
});

describe('checkpoint refresh of cleanly stopped groups', () => {
  it('keeps an idle group restorable after a host loss beyond the checkpoint maximum age', async () => {
    const { groupId, begun } = await stoppedAfterOneTurn(fleet, plane, 'conv-idle', 'sess-idle');
    const stopped = await fleet.group(groupId);
    const first = stopped.latestCheckpointId!;
    expect(first).toBeDefined();
    const checkpoints = fleet.store.repository('checkpoints', CheckpointRecordSchema);
    const firstCreatedAt = (await checkpoints.get(Keys.checkpoint(groupId, first)))!.value.createdAtMs;

    // Retaken while the group stays stopped: a new latest checkpoint of the same state, newer.
    const refreshed = await fleet.waitFor('a refreshed checkpoint', async () => {
      const g = await fleet.group(groupId);
      return g.latestCheckpointId !== first ? g : undefined;
    }, 60_000);
    expect(refreshed.lifecycle).toMatchObject({ state: 'STOPPED', activityVersion: stopped.lifecycle.activityVersion, generation: stopped.lifecycle.generation });
    const retaken = (await checkpoints.get(Keys.checkpoint(groupId, refreshed.latestCheckpointId!)))!.value;
    expect(retaken.createdAtMs).toBeGreaterThan(firstCreatedAt);
    const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 100 });
    expect(events.filter((e) => e.event.type === 'checkpoint_created').map((e) => e.event.reason)).toContain('refresh');
    // The host agent read the layer in full the first time (no index yet) and reused it unread the
    // second: its metrics say so, by mode and why.
    const captures = (await fleet.agents.get(begun.hostId)!.metrics.registry.getSingleMetric('sandboxfleet_layer_captures_total')!.get()).values;
    const capturesOf = (mode: string, why: string): number => captures.find((v) => v.labels.mode === mode && v.labels.why === why)?.value ?? 0;
    expect(capturesOf('full', 'no_index')).toBeGreaterThanOrEqual(1);
    expect(capturesOf('incremental', 'incremental')).toBeGreaterThanOrEqual(1);
    // Stopping the stopped group again answers the refreshed checkpoint: latest never moves back.
    const again = await plane.runner.stopGroup({ idempotencyKey: key(), groupId });
    expect(again.checkpointId).toBe(refreshed.latestCheckpointId);
    expect((await fleet.group(groupId)).latestCheckpointId).toBe(refreshed.latestCheckpointId);

    // Idle past the maximum age of the first checkpoint, then the host dies.
    await fleet.startReadyAgentOn('host-b', 1);
    const idleUntil = firstCreatedAt + MAX_AGE_MS + 2_000;
    await new Promise((r) => setTimeout(r, Math.max(0, idleUntil - Date.now())));
    await fleet.killHost('host-a');

    const moved = await fleet.waitFor('group restored on host-b', async () => {
      const g = await fleet.group(groupId);
      if (g.lifecycle.state === 'LOST') throw new Error(`group LOST: ${g.lifecycle.lostReason}`);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? g : undefined;
    }, 90_000);
    expect(moved.lifecycle.generation).toBeGreaterThan(stopped.lifecycle.generation);
    const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(next).toMatchObject({ contextState: 'RESTORED', locator: 'sess-idle', hostId: 'host-b' });
    const ok = (await metrics.registry.getSingleMetric('sandboxfleet_checkpoint_refreshes_total')?.get())?.values.find((v) => v.labels.result === 'ok')?.value ?? 0;
    expect(ok).toBeGreaterThanOrEqual(1);
  });

  it('a refresh that finds the containers of a stopped group gone from a live host recovers the group from its checkpoint elsewhere', async () => {
    // host-a is dead (previous test); host-c joins, and the group's host loses its containers.
    await fleet.startReadyAgentOn('host-c', 2);
    const { groupId, begun } = await stoppedAfterOneTurn(fleet, plane, 'conv-idle-gone', 'sess-idle-gone');
    const lostOn = begun.hostId;
    const stopped = await fleet.group(groupId);
    const docker = fleet.hosts[lostOn === 'host-b' ? 1 : 2]!.docker;
    for (const c of await docker.listContainers({ all: true, filters: { label: [`sandboxfleet.group=${groupId}`] } })) await docker.getContainer(c.Id).remove({ force: true });

    // Nobody calls: the next refresh finds nothing to capture and evacuates the group.
    const recovered = await fleet.waitFor('group recovered on the other host', async () => {
      const g = await fleet.group(groupId);
      if (g.lifecycle.state === 'LOST') throw new Error(`group LOST: ${g.lifecycle.lostReason}`);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.generation > stopped.lifecycle.generation && g.evacuation === undefined ? g : undefined;
    }, 90_000);
    expect(recovered.lifecycle.hostId).not.toBe(lostOn);
    const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 100 });
    expect(events.find((e) => e.event.type === 'evacuation_started')?.event.reason).toBe('docker_data_lost');
    const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect(next).toMatchObject({ contextState: 'RESTORED', locator: 'sess-idle-gone', hostId: recovered.lifecycle.hostId });
  });
});
