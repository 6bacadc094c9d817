// END TO END control plane with real parts (R-H2..R-H6, R-G2..R-G7, R-R1, R-R2): real nats-server,
// three real dockerd hosts, real host agents, one ControlPlane (leader) driven through its
// RunnerBackend and operator actions.
// 1. Drain host-a holding a running, a clean-stopped and an unclean-stopped group: the running one
//    is stopped cleanly and moved, the clean one moved, the unclean one LOST unclean_stop.
// 2. Kill host-b (agent stopped, dockerd stopped, data root deleted): a clean group with a recent
//    checkpoint is restored elsewhere; no checkpoint / stale / corrupted blob / running → LOST with
//    the matching reason; nothing is restored from the corrupted blob.
// 3. Zombie: the removed host-a keeps heartbeating with its old epoch (fenced, counted); after it
//    re-registers it gets a new epoch and deletes the containers of groups it no longer owns.
// 4. An agent with an unknown build SHA never becomes READY and never gets a placement.
import { rm } from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { CheckpointRecordSchema, GroupRecordSchema } from '../../../src/control-plane/records.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
const metrics = new FleetMetrics();
let n = 0;

beforeAll(async () => {
  fleet = await startFleet(3);
  plane = await fleet.startPlane({ metrics });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
});

afterAll(async () => {
  await fleet?.cleanup();
});

const key = () => `k-${++n}`;

async function open(conversationId: string) {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }] });
  return group.groupId;
}

async function turn(groupId: string, locator: string) {
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
  await fleet.writeSession(begun.hostId, begun.containerId, locator);
  const done = await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: SUCCESS });
  return { begun, done };
}

async function lostReason(groupId: string) {
  return fleet.waitFor(`${groupId} LOST`, async () => {
    const g = await fleet.group(groupId);
    return g.lifecycle.state === 'LOST' ? g.lifecycle.lostReason : undefined;
  });
}

async function settledOn(groupId: string, notHost: string) {
  return fleet.waitFor(`${groupId} moved off ${notHost}`, async () => {
    const g = await fleet.group(groupId);
    return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId !== notHost && g.evacuation === undefined ? g : undefined;
  }, 90_000);
}

async function metricValue(name: string, labels: Record<string, string>): Promise<number> {
  const m = (await metrics.registry.getSingleMetric(name)?.get())?.values ?? [];
  return m.filter((v) => Object.entries(labels).every(([k, val]) => v.labels[k] === val)).reduce((s, v) => s + v.value, 0);
}

let drained: { running: string; clean: string; unclean: string };

describe('planned departure: drain', () => {
  it('moves running and clean groups, declares the unclean one LOST unclean_stop', async () => {
    const running = await open('conv-running');
    const clean = await open('conv-clean');
    const unclean = await open('conv-unclean');
    for (const g of [running, clean, unclean]) expect((await fleet.group(g)).lifecycle.hostId).toBe('host-a');

    const first = await turn(running, 'sess-running-1');
    expect(first.begun.contextState).toBe('NEW');
    expect((await turn(running, 'sess-running-1')).begun.contextState).toBe('LIVE');
    await turn(clean, 'sess-clean-1');
    const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId: clean });
    expect(stopped.group.stopClean).toBe(true);
    expect(stopped.checkpointId).toBeDefined();
    // A turn in flight at the stop makes it unclean (R-G2).
    await turn(unclean, 'sess-unclean-1');
    await plane.runner.beginTurn({ idempotencyKey: key(), groupId: unclean, memberId: 'm1' });
    const uncleanStop = await plane.runner.stopGroup({ idempotencyKey: key(), groupId: unclean });
    expect(uncleanStop.group.stopClean).toBe(false);
    expect(uncleanStop.checkpointId).toBeUndefined();

    await Promise.all([fleet.startAgentOn('host-b', 1), fleet.startAgentOn('host-c', 2)]);
    await fleet.waitFor('b and c READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' && (await fleet.host('host-c')).lifecycle.state === 'READY' ? true : undefined));

    expect(await plane.drainHost('host-a')).toBe(true);
    const [r, c] = await Promise.all([settledOn(running, 'host-a'), settledOn(clean, 'host-a')]);
    expect(await lostReason(unclean)).toBe('unclean_stop');
    for (const g of [r, c]) {
      expect(g.lifecycle.generation).toBe(2);
      expect(g.lifecycle.stop).toEqual({ clean: true });
    }
    // The next turn attaches a new process to the retained native session on the new host (R-S1).
    const after = await turn(running, 'sess-running-1');
    expect(after.begun.contextState).toBe('RESTORED');
    expect(after.begun.hostId).toBe(r.lifecycle.hostId);
    expect(after.done.savedLocator).toBe('sess-running-1');
    // A locator change at the end is refused and the saved one kept (R-S2).
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId: running, memberId: 'm1' });
    expect(begun.contextState).toBe('LIVE');
    await expect(plane.runner.completeTurn({ idempotencyKey: key(), groupId: running, memberId: 'm1', turnId: begun.turnId, observedLocator: 'other-session', evidence: SUCCESS })).rejects.toMatchObject({ reason: 'locator_mismatch' });
    expect((await plane.runner.getGroupState({ groupId: running })).members[0]!.savedLocator).toBe('sess-running-1');

    await fleet.waitFor('host-a REMOVED', async () => ((await fleet.host('host-a')).lifecycle.state === 'REMOVED' ? true : undefined));
    expect(await metricValue('sandboxfleet_lost_sessions_total', { reason: 'unclean_stop' })).toBe(1);
    expect(await metricValue('sandboxfleet_migrations_total', { result: 'succeeded' })).toBe(2);
    const events = await fleet.store.events.read({ subjectKind: 'group', subjectId: unclean, limit: 100 });
    expect(events.events.some((e) => e.event.type === 'group_lost' && e.event.reason === 'unclean_stop')).toBe(true);
    drained = { running, clean, unclean };
  });
});

describe('removed host', () => {
  it('fences the drained host, which stays out until restarted; restarted, a LOST group\'s layers stay (stopped) on it', async () => {
    const agentA = fleet.agents.get('host-a')!;
    const oldEpoch = agentA.agent.epoch!;
    const docker = fleet.hosts[0]!.docker;
    const labelled = async () => (await docker.listContainers({ all: true })).filter((c) => Object.values(c.Labels ?? {}).includes(drained.unclean));
    expect((await labelled()).length).toBeGreaterThan(0);
    // The drained host is REMOVED (its epoch ended) while its agent still runs: its heartbeat is
    // fenced and recorded, and the agent, told it left on purpose, stops beating and takes no work.
    await fleet.waitFor('fenced heartbeats from the removed host', async () => ((await metricValue('sandboxfleet_fenced_reports_total', { kind: 'heartbeat' })) > 0 ? true : undefined));
    await fleet.waitFor('the fence recorded', async () => {
      const { events } = await fleet.store.events.read({ subjectKind: 'host', subjectId: 'host-a', limit: 1000 });
      return events.some((e) => e.event.type === 'host_report_fenced' && e.event.reason === 'host_retired') ? true : undefined;
    });
    const fenced = await metricValue('sandboxfleet_fenced_reports_total', { kind: 'heartbeat' });
    await new Promise((r) => setTimeout(r, 4 * 500)); // four heartbeat intervals
    expect(await metricValue('sandboxfleet_fenced_reports_total', { kind: 'heartbeat' })).toBeLessThanOrEqual(fenced + 1);
    expect((await fleet.host('host-a')).lifecycle.state).toBe('REMOVED');

    await fleet.stopAgent('host-a');
    await fleet.startAgentOn('host-a', 0);
    const host = await fleet.host('host-a');
    expect(host.lifecycle.epoch).toBeGreaterThan(oldEpoch);
    expect(host.lifecycle.state).toBe('READY');
    // The unclean group is LOST: its writable layers are kept for an operator (R-R6), its
    // containers stopped; nothing proves they may go before the retention period ends.
    const copies = await labelled();
    expect(copies.length).toBeGreaterThan(0);
    expect(copies.every((c) => c.State !== 'running')).toBe(true);
    const judged = (await fleet.store.events.read({ subjectKind: 'group', subjectId: drained.unclean, limit: 1000 })).events.map((e) => e.event);
    expect(judged.some((e) => e.type === 'host_copy_judged' && e.reason === 'lost_retained')).toBe(true);
  });
});

describe('unplanned loss: host killed', () => {
  it('restores the clean recent group and declares every other group LOST with its reason', async () => {
    // Put five groups on host-b: drain the others out of placement by draining nothing — instead
    // open groups until five land on host-b (placement spreads by load).
    const onB: string[] = [];
    for (let i = 0; onB.length < 5 && i < 40; i++) {
      const g = await open(`conv-b-${i}`);
      if ((await fleet.group(g)).lifecycle.hostId === 'host-b') onB.push(g);
    }
    expect(onB.length).toBe(5);
    const [recent, noCheckpoint, stale, corrupt, runningGroup] = onB as [string, string, string, string, string];
    for (const g of onB) await turn(g, `sess-${g}`);
    for (const g of [recent, noCheckpoint, stale, corrupt]) {
      const s = await plane.runner.stopGroup({ idempotencyKey: key(), groupId: g });
      expect(s.checkpointId).toBeDefined();
    }
    const groups = fleet.store.shardedRepository('groups', GroupRecordSchema);
    const checkpoints = fleet.store.repository('checkpoints', CheckpointRecordSchema);
    // no checkpoint: the index entry and manifest are gone (a checkpoint without a manifest does not exist).
    {
      const g = await groups.get(Keys.group(noCheckpoint));
      await fleet.chunks.deleteManifest(g!.value.lifecycle.hostId, noCheckpoint, g!.value.latestCheckpointId!);
      const { latestCheckpointId: _drop, ...rest } = g!.value;
      await groups.update(Keys.group(noCheckpoint), rest, g!.revision);
    }
    // stale: the group ran another turn and stopped again, and that second checkpoint failed —
    // the group still points at the first one, taken before its last completed turn.
    {
      const firstCheckpoint = (await fleet.group(stale)).latestCheckpointId!;
      await turn(stale, `sess-${stale}`);
      await plane.runner.stopGroup({ idempotencyKey: key(), groupId: stale });
      const g = await groups.get(Keys.group(stale));
      const second = g!.value.latestCheckpointId!;
      expect(second).not.toBe(firstCheckpoint);
      await fleet.chunks.deleteManifest(g!.value.lifecycle.hostId, stale, second);
      const rec = await checkpoints.get(Keys.checkpoint(stale, second));
      await checkpoints.delete(Keys.checkpoint(stale, second), rec!.revision);
      await groups.update(Keys.group(stale), { ...g!.value, latestCheckpointId: firstCheckpoint }, g!.revision);
    }
    // corrupt: one chunk of its layer is replaced by other bytes under the same digest subject.
    const corruptCheckpoint = (await fleet.group(corrupt)).latestCheckpointId!;
    {
      const manifest = await fleet.chunks.getManifest((await fleet.group(corrupt)).lifecycle.hostId, corrupt, corruptCheckpoint);
      const chunk = manifest.members[0]!.layer.chunks[0]!;
      await fleet.chunks.delete(chunk.digest);
      await fleet.store.js.publish(`sf.chunk.${chunk.digest.slice(7)}`, new TextEncoder().encode('not the layer you are looking for'));
      await expect(fleet.chunks.get(chunk)).rejects.toMatchObject({ reason: 'chunk_digest_mismatch' });
    }

    // Kill host-b: agent gone, dockerd stopped, data root deleted.
    await fleet.stopAgent('host-b');
    await fleet.hosts[1]!.stop();
    await rm(fleet.hosts[1]!.dataRoot, { recursive: true, force: true });

    const restored = await settledOn(recent, 'host-b');
    expect(restored.lifecycle.generation).toBeGreaterThan(1);
    expect(await lostReason(noCheckpoint)).toBe('no_checkpoint');
    expect(await lostReason(stale)).toBe('stale_checkpoint');
    expect(await lostReason(corrupt)).toBe('checkpoint_corrupt');
    expect(await lostReason(runningGroup)).toBe('host_lost_running');
    // Decided without I/O, mark and LOST are one write; the audit stream still says both, in order,
    // and the record carries what declareLost writes.
    for (const [id, reason] of [[noCheckpoint, 'no_checkpoint'], [runningGroup, 'host_lost_running']] as const) {
      const types = (await fleet.store.events.read({ subjectKind: 'group', subjectId: id, limit: 200 })).events.map((e) => e.event);
      const started = types.findIndex((e) => e.type === 'evacuation_started' && e.reason === 'heartbeat_lost');
      const lost = types.findIndex((e) => e.type === 'group_lost' && e.reason === reason);
      expect(started, `${id}: evacuation_started`).toBeGreaterThanOrEqual(0);
      expect(lost, `${id}: group_lost after evacuation_started`).toBeGreaterThan(started);
      const g = await fleet.group(id);
      expect(g.evacuation).toBeUndefined();
      expect(g.lostAtMs).toBeGreaterThan(0);
      expect(g.members.every((m) => m.session.phase === 'LOST')).toBe(true);
    }
    expect((await fleet.host('host-b')).lifecycle.state).toBe('DEAD');
    // Never restored from the corrupted blob: no migration was ever started for it.
    const events = await fleet.store.events.read({ subjectKind: 'group', subjectId: corrupt, limit: 200 });
    expect(events.events.some((e) => e.event.type === 'group_migration_started')).toBe(false);
    // The restored group's next turn is RESTORED on its new host.
    expect((await turn(recent, `sess-${recent}`)).begun.contextState).toBe('RESTORED');
  });
});

describe('attestation', () => {
  it('never admits an agent with an unknown build SHA, nor places groups on it', async () => {
    await fleet.stopAgent('host-c');
    await fleet.startAgentOn('host-c', 2, { agentSha: 'f'.repeat(40) }).catch(() => undefined);
    const host = await fleet.waitFor('host-c UNATTESTED', async () => {
      const h = await fleet.host('host-c');
      return h.lifecycle.state === 'UNATTESTED' ? h : undefined;
    });
    expect(host.lifecycle.refusals).toContain('agent_sha_unknown');
    expect(await metricValue('sandboxfleet_attestation_refusals_total', { reason: 'agent_sha_unknown' })).toBeGreaterThan(0);
    for (let i = 0; i < 4; i++) expect((await fleet.group(await open(`conv-att-${i}`))).lifecycle.hostId).not.toBe('host-c');
  });
});
