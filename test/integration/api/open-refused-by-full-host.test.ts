// An open the control plane placed on a host whose agent then refused it for want of room (the
// agent counts the containers on its engine; the read model counts group records, and lags behind
// a placement made a moment ago or misses containers no record holds). Real nats-server, two real
// dockerds, real agents and control plane (fleet-harness.ts). The placement counts what a host's
// heartbeat says it holds, and the agent's answer is the authority: a refused group is withdrawn
// (DESTROYED before it held anything, never named by the conversation), the open tries the next
// host, and with none left it is RESOURCE_EXHAUSTED no_capacity — never INTERNAL, never a
// conversation pointing at a group that does not exist.
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { ControlPlaneRunnerBackend } from '../../../src/control-plane/runner-backend.ts';
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

describe('an open on a host that is full', () => {
  let left: string[] = [];

  it('filled between the placement and the create (seam: the engine fills just before the create reaches it): two concurrent opens are withdrawn and placed on the next host, as one group', async () => {
    // SEAM: every createGroup for host-a waits until host-a's engine holds MAX_MEMBERS containers
    // that no record names — what a heartbeat reports a moment later, which the placement could not
    // have seen yet. The agent, the engine and the store are real.
    let filled: Promise<string[]> | undefined;
    const backend = new ControlPlaneRunnerBackend({
      ...plane.ctx,
      agents: {
        ...plane.ctx.agents,
        send: (async (...args: Parameters<typeof plane.ctx.agents.send>) => {
          const [target, , body] = args;
          if (body.$case === 'createGroup' && target.hostId === 'host-a') left = await (filled ??= leftovers(0, MAX_MEMBERS));
          return plane.ctx.agents.send(...args);
        }) as typeof plane.ctx.agents.send,
      },
    });
    const [a, b] = await Promise.all([
      backend.openGroup({ idempotencyKey: 'open-1a', conversationId: 'conv-1', members: two }),
      backend.openGroup({ idempotencyKey: 'open-1b', conversationId: 'conv-1', members: two }),
    ]);
    expect(filled, 'the placement chose host-a, whose engine was empty by the records').toBeDefined();
    expect(a.group.groupId).toBe(b.group.groupId);
    expect(a.group.hostId).toBe('host-b');
    expect(a.group.groupId).not.toBe(firstGroupId('conv-1'));
    const withdrawn = await fleet.group(firstGroupId('conv-1'));
    expect(withdrawn.lifecycle).toMatchObject({ state: 'DESTROYED', hostId: 'host-a' });
    expect(withdrawn.openRefusedAtMs).toBeTypeOf('number');
    expect((await plane.runner.getGroupState({ conversationId: 'conv-1' })).groupId).toBe(a.group.groupId);
    expect(await memberContainers(0), 'nothing created on the full host').toEqual(expect.arrayContaining(left));
    expect(await memberContainers(0)).toHaveLength(MAX_MEMBERS);
  });

  it('as its heartbeat says is passed over without asking it; with no host left the open is RESOURCE_EXHAUSTED no_capacity and creates nothing, then opens once there is room', async () => {
    const usedOn = async (hostId: string) => plane.ctx.fleet.heartbeat(hostId)?.usedMembers;
    await fleet.waitFor('host-a\'s heartbeat counts the containers no record names', async () => ((await usedOn('host-a')) === MAX_MEMBERS ? true : undefined), 15_000);
    // host-b is full by the records (conv-1), host-a by its heartbeat.
    expect(await refusal(plane.runner.openGroup({ idempotencyKey: 'open-2', conversationId: 'conv-2', members: two }))).toEqual({ status: 'RESOURCE_EXHAUSTED', reason: 'no_capacity' });
    expect(await refusal(plane.runner.getGroupState({ conversationId: 'conv-2' }))).toEqual({ status: 'NOT_FOUND', reason: 'group_not_found' });
    expect(await memberContainers(0)).toHaveLength(MAX_MEMBERS);
    // The same call again gets the same answer (stored under its key), not a second attempt.
    expect(await refusal(plane.runner.openGroup({ idempotencyKey: 'open-2', conversationId: 'conv-2', members: two }))).toEqual({ status: 'RESOURCE_EXHAUSTED', reason: 'no_capacity' });

    // Room is made on host-a: once its heartbeat says so, a new call opens the conversation there.
    for (const id of left) await fleet.hosts[0]!.docker.getContainer(id).remove({ force: true });
    await fleet.waitFor('host-a\'s heartbeat shows the room', async () => ((await usedOn('host-a')) === 0 ? true : undefined), 15_000);
    const opened = await plane.runner.openGroup({ idempotencyKey: 'open-3', conversationId: 'conv-2', members: two });
    expect(opened.created).toBe(true);
    expect(opened.group.hostId).toBe('host-a');
    expect(opened.group.groupId).toBe(firstGroupId('conv-2'));
    expect((await plane.runner.getGroupState({ conversationId: 'conv-2' })).groupId).toBe(opened.group.groupId);
    expect(await memberContainers(0)).toHaveLength(MAX_MEMBERS);
  });
});
