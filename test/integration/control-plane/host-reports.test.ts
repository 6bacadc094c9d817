// Host ids and host reports end to end (R-H1, R-H5, R-H6, R-I2): real nats-server admitting only
// per-host nkeys, two real dockerd hosts, real agents, one ControlPlane leader.
// 1. A host named like an EKS node (`ip-10-0-1-23.ec2.internal`, dots and all) registers on its own
//    credentials, becomes READY and runs a group (its command subject carries the mapped token).
// 2. host-b's Docker data root is destroyed: the agent's report makes it DEAD at once (unplanned,
//    `docker_data_lost` in the audit log, never a planned drain): its running group is LOST
//    host_lost_running, its cleanly stopped one is restored from its checkpoint.
// 3. Notices from a previous incarnation of the dotted host (old epoch) are rejected and counted.
// 4. A spot notice from the current incarnation still drains the host (spot_preemption).
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentSubjects } from '../../../src/core/agent-subjects.ts';
import { eventSubjectToken } from '../../../src/control-plane/admin-ops.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { ReclaimNotice } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

const EKS = 'ip-10-0-1-23.ec2.internal';
const B = 'host-b';
const noticeFile = join(mkdtempSync(join(tmpdir(), 'sf-notice-')), 'reclaim');

let fleet: Fleet;
let plane: ControlPlane;
const metrics = new FleetMetrics();
let n = 0;
const key = () => `hr-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(2, {}, { auth: true, hostIds: [EKS, B] });
  plane = await fleet.startPlane({ metrics });
}, 180_000);

afterAll(async () => {
  await fleet?.cleanup();
});

async function state(hostId: string): Promise<string> {
  return (await fleet.host(hostId)).lifecycle.state;
}

async function ready(hostId: string): Promise<void> {
  await fleet.waitFor(`${hostId} READY`, async () => ((await state(hostId)) === 'READY' ? true : undefined));
}

async function open(conversationId: string): Promise<string> {
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }] });
  return group.groupId;
}

async function turn(groupId: string, locator: string) {
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
  await fleet.writeSession(begun.hostId, begun.containerId, locator);
  await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: SUCCESS });
  return begun;
}

async function hostEvents(hostId: string) {
  return (await fleet.store.events.read({ subjectKind: 'host', subjectId: eventSubjectToken(hostId), limit: 200 })).events.map((e) => e.event);
}

async function fenced(kind: string): Promise<number> {
  const values = (await metrics.registry.getSingleMetric('sandboxfleet_fenced_reports_total')?.get())?.values ?? [];
  return values.filter((v) => v.labels.kind === kind).reduce((s, v) => s + v.value, 0);
}

let onEks: string;

describe('a host named by its Kubernetes node name (R-H1)', () => {
  it('registers on its own NATS credentials, becomes READY and runs a group', async () => {
    await fleet.startAgentOn(EKS, 0, { reclaimNoticeFile: noticeFile });
    await ready(EKS);
    expect(AgentSubjects.commands(EKS)).toBe('sf.host.ip-10-0-1-23~ec2~internal.cmd');
    onEks = await open('conv-eks');
    expect((await fleet.group(onEks)).lifecycle.hostId).toBe(EKS);
    // A turn runs in a container the agent started on a command sent to its own subject.
    const begun = await turn(onEks, 'sess-eks');
    expect(begun.hostId).toBe(EKS);
    expect(begun.contextState).toBe('NEW');
    expect((await fleet.group(onEks)).lifecycle.state).toBe('RUNNING');
    expect(await fenced('heartbeat')).toBe(0);
  });
});

describe('Docker data lost (R-H5, R-G6)', () => {
  it('makes the host DEAD at once with its own reason: never a planned drain', async () => {
    await fleet.startAgentOn(B, 1);
    await ready(B);
    const onB: string[] = [];
    for (let i = 0; onB.length < 2 && i < 10; i++) {
      const g = await open(`conv-b-${i}`);
      if ((await fleet.group(g)).lifecycle.hostId === B) onB.push(g);
    }
    expect(onB).toHaveLength(2);
    const [running, clean] = onB as [string, string];
    await turn(running, 'sess-running');
    await turn(clean, 'sess-clean');
    const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId: clean });
    expect(stopped.checkpointId).toBeDefined();

    // The engine goes and its data root with it; the agent keeps running and says so.
    await fleet.hosts[1]!.destroy();
    const dead = await fleet.waitFor('host-b DEAD', async () => {
      const h = await fleet.host(B);
      return h.lifecycle.state === 'DEAD' ? h : undefined;
    });
    expect(dead.lifecycle.goingAway).toBe('docker_data_lost');

    const lost = await fleet.waitFor(`${running} LOST`, async () => {
      const g = await fleet.group(running);
      return g.lifecycle.state === 'LOST' ? g.lifecycle.lostReason : undefined;
    });
    expect(lost).toBe('host_lost_running');
    const restored = await fleet.waitFor(`${clean} restored`, async () => {
      const g = await fleet.group(clean);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === EKS && g.evacuation === undefined ? g : undefined;
    }, 90_000);
    expect(restored.lifecycle.generation).toBeGreaterThan(1);

    // The audit log says what happened: DEAD for docker_data_lost, straight from READY. No planned
    // drain was ever started (the notice arrives before the heartbeat that repeats it).
    const events = await hostEvents(B);
    expect(events.filter((e) => e.type === 'host_drain_requested')).toEqual([]);
    const deadEvents = events.filter((e) => e.type === 'host_declared_dead');
    expect(deadEvents).toHaveLength(1);
    expect(deadEvents[0]).toMatchObject({ fromState: 'READY', toState: 'DEAD' });
    expect(deadEvents[0]!.reason).toMatch(/^docker_data_lost: /);
    const groupEvents = (await fleet.store.events.read({ subjectKind: 'group', subjectId: running, limit: 200 })).events.map((e) => e.event);
    expect(groupEvents.find((e) => e.type === 'group_lost')?.reason).toBe('host_lost_running');
  });
});

describe('notices are fenced by epoch (R-H6)', () => {
  it('rejects and counts notices from a previous incarnation of the host, and applies none', async () => {
    const first = (await fleet.host(EKS)).lifecycle.epoch;
    await fleet.stopAgent(EKS);
    await fleet.startAgentOn(EKS, 0, { reclaimNoticeFile: noticeFile });
    await ready(EKS);
    const current = (await fleet.host(EKS)).lifecycle.epoch;
    expect(current).toBeGreaterThan(first);

    const before = await fenced('notice');
    // What the old incarnation would still send: a preemption notice and a data-loss report. The
    // test's connection stands in for it (the host's own credentials allow this subject too).
    for (const source of ['preemption', 'docker_data_lost']) {
      fleet.nc.publish(AgentSubjects.notices(EKS), ReclaimNotice.encode({ source, deadlineUnixMs: 0, hostEpoch: first }).finish());
    }
    // ... and one from an epoch the control plane never granted.
    fleet.nc.publish(AgentSubjects.notices(EKS), ReclaimNotice.encode({ source: 'spot', deadlineUnixMs: 0, hostEpoch: current + 1 }).finish());
    await fleet.waitFor('three fenced notices', async () => ((await fenced('notice')) === before + 3 ? true : undefined), 10_000);
    const host = await fleet.host(EKS);
    expect(host.lifecycle).toMatchObject({ state: 'READY', epoch: current });
    expect(host.lifecycle.goingAway).toBeUndefined();
    expect((await hostEvents(EKS)).some((e) => e.type === 'host_drain_requested' || e.type === 'host_declared_dead')).toBe(false);
  });

  it('still drains on a spot notice of the current epoch', async () => {
    const epoch = (await fleet.host(EKS)).lifecycle.epoch;
    const before = await fenced('notice');
    writeFileSync(noticeFile, JSON.stringify({ source: 'spot', deadlineUnixMs: Date.now() + 120_000 }));
    const draining = await fleet.waitFor(`${EKS} DRAINING`, async () => {
      const h = await fleet.host(EKS);
      return h.lifecycle.state === 'DRAINING' ? h : undefined;
    });
    expect(draining.lifecycle).toMatchObject({ epoch, goingAway: 'spot_preemption' });
    const drain = (await hostEvents(EKS)).find((e) => e.type === 'host_drain_requested');
    expect(drain?.reason).toBe('spot_preemption: reclaim notice "spot"');
    expect(await fenced('notice')).toBe(before);
  });
});
