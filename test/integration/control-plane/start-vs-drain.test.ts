// A start and a drain of the same STOPPED group never both act (the chaos test's drain-vs-start
// double run), with real parts: a real nats-server, two real dockerd hosts, real agents and a real
// control plane. A turn's begin starts a cleanly stopped group on host-a while host-a's dockerd is
// frozen (SIGSTOP), so its start command is held on the host; host-a is drained meanwhile. The start
// recorded its intent before sending the command (startingUntilMs), so no migration of the group
// begins while it is under way: once dockerd runs again the start finishes, the turn runs on host-a,
// and only then is the group stopped, checkpointed and moved — never running on both hosts. Before,
// the drain moved the group while the command was held, and the start then ran the old copy.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let n = 0;
const key = () => `svd-${++n}`;

beforeAll(async () => {
  fleet = await startFleet(2);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 240_000);

afterAll(async () => {
  try {
    process.kill(fleet.hosts[0]!.pid, 'SIGCONT');
  } catch { /* already gone */ }
  await fleet?.cleanup();
});

describe('a start of a stopped group racing a drain of its host', () => {
  it('holds the move until the start is done; the group then moves like a running one, never running on two hosts', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-svd', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const groupId = group.groupId;
    const first = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    await fleet.writeSession(first.hostId, first.containerId, 'sess-svd');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 'sess-svd', evidence: SUCCESS });
    const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId });
    expect(stopped.checkpointId).toBeDefined();
    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));

    // Sample where the group's containers run, all along.
    const runningOn = new Set<string>();
    let both = false;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const hosts: string[] = [];
        for (const h of fleet.hosts) {
          const list = await h.docker.listContainers({ filters: { label: [`sandboxfleet.group=${groupId}`] } }).catch(() => []);
          if (list.length > 0) hosts.push(h.name);
        }
        hosts.forEach((h) => runningOn.add(h));
        if (hosts.length > 1) both = true;
        await new Promise((r) => setTimeout(r, 100));
      }
    })();

    const dockerdA = fleet.hosts[0]!.pid;
    process.kill(dockerdA, 'SIGSTOP');
    let begun: Awaited<ReturnType<typeof plane.runner.beginTurn>> | undefined;
    let refused: unknown;
    const begin = plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' }).then((b) => { begun = b; }, (err: unknown) => { refused = err; });
    try {
      await fleet.waitFor('the start intent recorded', async () => ((await fleet.group(groupId)).startingUntilMs !== undefined ? true : undefined), 20_000);
      expect(await plane.drainHost('host-a')).toBe(true);
      // The drain marks the group, but does not move it while the start is under way.
      await fleet.waitFor('the group marked for evacuation', async () => ((await fleet.group(groupId)).evacuation !== undefined ? true : undefined), 20_000);
      await new Promise((r) => setTimeout(r, 3_000));
      const held = await fleet.group(groupId);
      expect({ state: held.lifecycle.state, hostId: held.lifecycle.hostId }).toEqual({ state: 'STOPPED', hostId: 'host-a' });
    } finally {
      process.kill(dockerdA, 'SIGCONT');
    }
    await begin;
    // The start finishes on host-a. The turn itself either began there (then it is completed and the
    // drain waits for it) or was refused as the group is now being moved (retry later): both are
    // the product's answers to a begin that meets a drain; the group is started either way.
    if (begun !== undefined) {
      expect(begun).toMatchObject({ hostId: 'host-a', contextState: 'RESTORED' });
      await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-svd', evidence: SUCCESS });
    } else {
      expect(refused).toMatchObject({ status: 'UNAVAILABLE' });
    }

    const moved = await fleet.waitFor('the group moved to host-b', async () => {
      const g = await fleet.group(groupId);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? g : undefined;
    }, 120_000);
    sampling = false;
    await sampler;
    expect(moved.lifecycle.stop).toEqual({ clean: true });
    expect(moved.startingUntilMs).toBeUndefined();
    expect(both, `running on ${[...runningOn].join(', ')} at once`).toBe(false);
    const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 1000 });
    const types = events.map((e) => e.event.type);
    // Started on host-a (the begin), stopped for the move, then moved: the start came first.
    const lastStart = types.lastIndexOf('group_started');
    const migration = types.indexOf('group_migration_started');
    expect(lastStart).toBeGreaterThanOrEqual(0);
    expect(migration).toBeGreaterThan(lastStart);
    expect(types.slice(lastStart, migration)).toContain('group_stopped');
    // The next turn runs on host-b with the same session.
    const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect({ hostId: next.hostId, contextState: next.contextState, locator: next.locator }).toEqual({ hostId: 'host-b', contextState: 'RESTORED', locator: 'sess-svd' });
  }, 300_000);
});
