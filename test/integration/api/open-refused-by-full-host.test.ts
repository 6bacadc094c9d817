// An open the control plane placed on a host whose agent then refused it for want of room (the
// agent counts the containers on its engine; the read model counts group records, and lags behind
// a placement made a moment ago or misses containers no record holds). Real nats-server, two real
// dockerds, real agents and control plane (fleet-harness.ts). The agent's answer is the authority:
// the refused group is withdrawn (DESTROYED before it held anything, never named by the
// conversation), the open tries the next host, and with none left it is RESOURCE_EXHAUSTED
// no_capacity — never INTERNAL, never a conversation pointing at a group that does not exist.
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { LABELS } from '../../../src/docker/runtime.ts';
import { isFleetError } from '../../../src/core/index.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

const MAX_MEMBERS = 2;
const two = [{ memberId: 'a', cli: 'pi' as const }, { memberId: 'b', cli: 'pi' as const }];

let fleet: Fleet;
let plane: ControlPlane;

/** The id the first open of a conversation gives its group (runner-backend.ts groupIdFor, attempt 0). */
const firstGroupId = (conversationId: string): string => `g-${createHash('sha256').update(`${conversationId}|`).digest('hex').slice(0, 24)}`;

/** Containers on host `index`'s engine that a group's agent would count as members. */
async function memberContainers(index: number): Promise<string[]> {
  return (await fleet.hosts[index]!.docker.listContainers({ all: true, filters: { label: [LABELS.group] } })).map((c) => c.Id);
}

/** Member containers no group record holds (left by an earlier life of the host): the agent counts them. */
async function leftovers(index: number, count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const c = await fleet.hosts[index]!.docker.createContainer({
      Image: fleet.image.imageId,
      Cmd: ['true'],
      Labels: { [LABELS.group]: 'g-leftover', [LABELS.member]: `m${i}`, [LABELS.cli]: 'pi', [LABELS.generation]: '1' },
      HostConfig: { NetworkMode: 'none' },
    });
    ids.push(c.id);
  }
  return ids;
}

async function refusal(p: Promise<unknown>): Promise<{ status: string; reason: string }> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(isFleetError(err), `refused with a FleetError, got ${String(err)}`).toBe(true);
  const e = err as { status: string; reason: string };
  return { status: e.status, reason: e.reason };
}

beforeAll(async () => {
  fleet = await startFleet(2);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0, { maxMembers: MAX_MEMBERS });
  await fleet.startAgentOn('host-b', 1, { maxMembers: MAX_MEMBERS });
  for (const h of ['host-a', 'host-b']) await fleet.waitFor(`${h} READY`, async () => ((await fleet.host(h)).lifecycle.state === 'READY' ? true : undefined));
}, 240_000);

afterAll(async () => {
  await fleet?.cleanup();
});

describe('an open its host refuses for want of room', () => {
  let left: string[] = [];

  it('is withdrawn and placed on the next host', async () => {
    // host-a is full on its engine, empty by the records: the placement (least loaded, then by id) picks it.
    left = await leftovers(0, MAX_MEMBERS);
    const opened = await plane.runner.openGroup({ idempotencyKey: 'open-1', conversationId: 'conv-1', members: two });
    expect(opened.created).toBe(true);
    expect(opened.group.hostId).toBe('host-b');
    expect(opened.group.groupId).not.toBe(firstGroupId('conv-1'));
    const withdrawn = await fleet.group(firstGroupId('conv-1'));
    expect(withdrawn.lifecycle).toMatchObject({ state: 'DESTROYED', hostId: 'host-a' });
    expect(withdrawn.openRefusedAtMs).toBeTypeOf('number');
    expect((await plane.runner.getGroupState({ conversationId: 'conv-1' })).groupId).toBe(opened.group.groupId);
    expect(await memberContainers(0), 'nothing created on the full host').toEqual(expect.arrayContaining(left));
    expect(await memberContainers(0)).toHaveLength(MAX_MEMBERS);
  });

  it('is RESOURCE_EXHAUSTED no_capacity when no host is left, creates nothing, and opens once there is room', async () => {
    // host-b is now full by the records, host-a still by its engine.
    expect(await refusal(plane.runner.openGroup({ idempotencyKey: 'open-2', conversationId: 'conv-2', members: two }))).toEqual({ status: 'RESOURCE_EXHAUSTED', reason: 'no_capacity' });
    expect(await refusal(plane.runner.getGroupState({ conversationId: 'conv-2' }))).toEqual({ status: 'NOT_FOUND', reason: 'group_not_found' });
    expect(await memberContainers(0)).toHaveLength(MAX_MEMBERS);
    // The same call again gets the same answer (stored under its key), not a second attempt.
    expect(await refusal(plane.runner.openGroup({ idempotencyKey: 'open-2', conversationId: 'conv-2', members: two }))).toEqual({ status: 'RESOURCE_EXHAUSTED', reason: 'no_capacity' });

    // Room is made on host-a: a new call opens the conversation there, past its withdrawn group.
    for (const id of left) await fleet.hosts[0]!.docker.getContainer(id).remove({ force: true });
    const opened = await plane.runner.openGroup({ idempotencyKey: 'open-3', conversationId: 'conv-2', members: two });
    expect(opened.created).toBe(true);
    expect(opened.group.hostId).toBe('host-a');
    expect((await fleet.group(firstGroupId('conv-2'))).lifecycle.state).toBe('DESTROYED');
    expect((await plane.runner.getGroupState({ conversationId: 'conv-2' })).groupId).toBe(opened.group.groupId);
    expect(await memberContainers(0)).toHaveLength(MAX_MEMBERS);
  });
});
