// A host declared DEAD comes back while its group is being moved off it (chaos soak seed 2025), with
// real parts: a real nats-server, two real dockerd hosts, real agents and a real control plane. The
// group is STOPPED clean with a checkpoint on host-a; host-a's agent stops, the host is declared DEAD
// and the group's restore on host-b begins. Right then host-a's agent starts again and registers:
// the group is still moving, so the registration's verdict keeps host-a's copy (the only good copy
// until the switch). Once the switch is written, the record proves host-a's copy is not the group's:
// the controller deletes it then. Before, nothing did until host-a registered once more — and a
// start command that reached host-a late (its answer lost) left that copy running beside the new one.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { SUCCESS, startFleet, type Fleet } from './fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let n = 0;
const key = () => `sbm-${++n}`;
let onRestore: (() => Promise<void>) | undefined;

beforeAll(async () => {
  fleet = await startFleet(2);
  plane = await fleet.startPlane({
    stepHook: async (step) => {
      if (step !== 'before_restore' || onRestore === undefined) return;
      const run = onRestore;
      onRestore = undefined;
      await run();
    },
  });
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
}, 240_000);

afterAll(async () => {
  await fleet?.cleanup();
});

const copiesOn = async (index: number, groupId: string) =>
  fleet.hosts[index]!.docker.listContainers({ all: true, filters: { label: [`sandboxfleet.group=${groupId}`] } });

describe('a DEAD host that registers again while its group moves off it', () => {
  it('keeps its copy until the switch, then the controller deletes it', async () => {
    const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId: 'conv-sbm', members: [{ memberId: 'm1', cli: 'claude_code' }] });
    const groupId = group.groupId;
    const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    await fleet.writeSession(begun.hostId, begun.containerId, 'sess-sbm');
    await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: 'sess-sbm', evidence: SUCCESS });
    expect((await plane.runner.stopGroup({ idempotencyKey: key(), groupId })).checkpointId).toBeDefined();
    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    const epochBefore = (await fleet.host('host-a')).lifecycle.epoch;

    let keptWhileMoving: number | undefined;
    onRestore = async () => {
      // The group is MIGRATING to host-b: host-a comes back now and registers at a new epoch.
      await fleet.startAgentOn('host-a', 0);
      await fleet.waitFor('host-a READY again', async () => {
        const h = await fleet.host('host-a');
        return h.lifecycle.state === 'READY' && h.lifecycle.epoch > epochBefore ? true : undefined;
      }, 60_000);
      keptWhileMoving = (await copiesOn(0, groupId)).length;
    };
    await fleet.stopAgent('host-a');

    const moved = await fleet.waitFor('the group moved to host-b', async () => {
      const g = await fleet.group(groupId);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? g : undefined;
    }, 120_000);
    expect(moved.lifecycle.generation).toBe(2);
    // The registration during the move kept host-a's copy (the group was still moving)...
    expect(keptWhileMoving).toBe(1);
    // ...and once the switch was written it is deleted, without host-a registering again.
    await fleet.waitFor('host-a\'s copy deleted', async () => ((await copiesOn(0, groupId)).length === 0 ? true : undefined), 30_000);
    expect((await copiesOn(1, groupId)).length).toBe(1);
    const next = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
    expect({ hostId: next.hostId, contextState: next.contextState, locator: next.locator }).toEqual({ hostId: 'host-b', contextState: 'RESTORED', locator: 'sess-sbm' });
  }, 300_000);
});
