// Group commands on a real dockerd through a real host agent over a real nats-server (R-G1, R-G2,
// R-H6): create/start/stop/delete, idempotency by command id and by deterministic container
// names, clean vs unclean stop evidence, fencing by epoch and placement generation, and R-H6
// zombie cleanup on re-registration.
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { CommandOutcome, ContainerState, CopyAction, type CopyVerdict, type Registration } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { CliKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { destroyAll, startDockerHost, type DockerHost } from '../../support/docker.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';
import { provisionSandboxImage, type SandboxImage } from '../../support/sandbox-image.ts';
import { heartbeats, okValue, registrationResponder, sendCommand, startAgent, type InProcessAgent, type RegistrationResponder } from '../../support/agent.ts';

const HOST = 'cmd-host';
let nats: TestNats | undefined;
let host: DockerHost | undefined;
let nc: NatsConnection;
let responder: RegistrationResponder;
let image: SandboxImage;
let agent: InProcessAgent | undefined;
let rt: DockerRuntime;
/** The verdicts the fake registration responder answers (none: every copy is kept). */
let verdicts: (reg: Registration) => CopyVerdict[] = () => [];

beforeAll(async () => {
  [nats, host] = await Promise.all([startTestNats(), startDockerHost({ name: 'agent-cmd' })]);
  nc = await nats.connect('control-plane-driver');
  responder = registrationResponder(nc, { firstEpoch: 1, copyVerdicts: (reg) => verdicts(reg) });
  image = await provisionSandboxImage([host.docker], { bridgeVersion: 4 });
  rt = new DockerRuntime(host.docker);
  agent = await startAgent(await nats.connect(HOST), {
    hostId: HOST,
    natsUrl: nats.server.url,
    host,
    imageRef: image.reference,
    // A Codex member whose PID 1 ignores SIGTERM: it must be killed, so its stop is unclean.
    overrides: { memberCommands: { codex: ['/bin/sleep', 'infinity'] } },
  });
});

afterAll(async () => {
  await agent?.stop();
  await nats?.cleanup();
  await destroyAll([host]);
});

const epoch = () => agent!.agent.epoch!;
const send = (generation: number, command: Parameters<typeof sendCommand>[2], commandId?: string) =>
  sendCommand(nc, { hostId: HOST, epoch: epoch(), generation, ...(commandId ? { commandId } : {}) }, command);
const create = (groupId: string, members: [string, CliKind][], generation = 1, commandId?: string) =>
  send(generation, { $case: 'createGroup', value: { groupId, conversationId: `conv-${groupId}`, members: members.map(([memberId, kind]) => ({ memberId, kind })), imageRef: image.reference, imageDigest: image.imageId } }, commandId);

const value = okValue;

async function states(groupId: string): Promise<Record<string, string>> {
  return Object.fromEntries((await rt.listMembers(groupId)).map((c) => [c.member!.memberId, c.status]));
}

describe('create / start / stop / delete', () => {
  it('creates member containers from the pinned image, once per command id and per name', async () => {
    const first = value(await create('g1', [['m1', CliKind.CLAUDE_CODE], ['m2', CliKind.PI]], 1, 'create-g1'), 'createGroup');
    expect(Object.keys(first.containerIds).sort()).toEqual(['m1', 'm2']);
    const repeat = await create('g1', [['m1', CliKind.CLAUDE_CODE], ['m2', CliKind.PI]], 1, 'create-g1');
    expect(value(repeat, 'createGroup').containerIds).toEqual(first.containerIds);
    // A new command id converges on the same deterministic containers.
    const again = value(await create('g1', [['m1', CliKind.CLAUDE_CODE], ['m2', CliKind.PI]], 1), 'createGroup');
    expect(again.containerIds).toEqual(first.containerIds);
    const members = await rt.listMembers('g1');
    expect(members).toHaveLength(2);
    for (const c of members) {
      expect(c.imageId).toBe(image.imageId);
      expect(c.member).toMatchObject({ groupId: 'g1', placementGeneration: 1 });
    }
    expect(members.find((c) => c.member!.memberId === 'm1')!.member!.cliKind).toBe('claude-code');
  });

  it('refuses a create for another base image, creating nothing', async () => {
    const r = await send(1, { $case: 'createGroup', value: { groupId: 'g-other', conversationId: 'c', members: [{ memberId: 'm1', kind: CliKind.CODEX }], imageRef: 'x', imageDigest: `sha256:${'0'.repeat(64)}` } });
    expect(r).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'image_mismatch' });
    expect(await rt.listMembers('g-other')).toEqual([]);
  });

  it('starts the group and reports it in heartbeats', async () => {
    const hb = heartbeats(nc, HOST);
    value(await send(1, { $case: 'startGroup', value: { groupId: 'g1', memberIds: [] } }), 'startGroup');
    expect(await states('g1')).toEqual({ m1: 'running', m2: 'running' });
    const beat = await hb.waitFor((h) => (h.inventory?.containers ?? []).filter((c) => c.groupId === 'g1' && c.state === ContainerState.RUNNING).length === 2, 10_000);
    const c = beat.inventory!.containers.find((x) => x.memberId === 'm1')!;
    expect(c).toMatchObject({ placementGeneration: 1, imageDigest: image.imageId, writableLayerPresent: true });
    await hb.stop();
  });

  it('stops cleanly when every member exits by itself on SIGTERM; layers stay (R-G2)', async () => {
    const r = await send(1, { $case: 'stopGroup', value: { groupId: 'g1', graceMs: 5000 } });
    const { evidence } = value(r, 'stopGroup');
    expect(r.message).toBe('clean');
    expect(evidence).toMatchObject({ clean: true, graceMs: 5000 });
    expect(evidence!.members).toHaveLength(2);
    for (const m of evidence!.members) {
      expect(m).toMatchObject({ exitCode: 0, exitedByItself: true, withinGrace: true, killed: false, signal: 'SIGTERM', containerPresent: true, writableLayerPresent: true });
      expect(m.exitedAtUnixMs).toBeGreaterThanOrEqual(m.sigtermAtUnixMs);
      expect(m.exitedAtUnixMs - m.sigtermAtUnixMs).toBeLessThan(5000);
    }
    expect(await states('g1')).toEqual({ m1: 'exited', m2: 'exited' });
  });

  it('calls a stop unclean when a member ignores SIGTERM and must be killed', async () => {
    value(await create('g2', [['quiet', CliKind.CLAUDE_CODE], ['stubborn', CliKind.CODEX]]), 'createGroup');
    value(await send(1, { $case: 'startGroup', value: { groupId: 'g2', memberIds: [] } }), 'startGroup');
    const r = await send(1, { $case: 'stopGroup', value: { groupId: 'g2', graceMs: 1000 } });
    const { evidence } = value(r, 'stopGroup');
    expect(evidence!.clean).toBe(false);
    expect(r.message).toContain('stubborn:killed');
    const stubborn = evidence!.members.find((m) => m.memberId === 'stubborn')!;
    expect(stubborn).toMatchObject({ killed: true, exitedByItself: false, signal: 'SIGKILL', exitCode: 137, containerPresent: true });
    expect(evidence!.members.find((m) => m.memberId === 'quiet')).toMatchObject({ exitedByItself: true, exitCode: 0 });
  });

  it('deletes a group with its layers, idempotently', async () => {
    const ids = value(await send(1, { $case: 'deleteGroup', value: { groupId: 'g2', reason: 'destroyed' } }, 'del-g2'), 'deleteGroup').removedContainerIds;
    expect(ids).toHaveLength(2);
    expect(value(await send(1, { $case: 'deleteGroup', value: { groupId: 'g2', reason: 'destroyed' } }, 'del-g2'), 'deleteGroup').removedContainerIds).toEqual(ids);
    expect(value(await send(1, { $case: 'deleteGroup', value: { groupId: 'g2', reason: 'destroyed' } }), 'deleteGroup').removedContainerIds).toEqual([]);
    expect(await rt.listMembers('g2')).toEqual([]);
  });

  it('restarts one member to reclaim its slot (R-S6) only while it still runs the named incarnation', async () => {
    const { containerIds } = value(await create('g3', [['m1', CliKind.CLAUDE_CODE]]), 'createGroup');
    value(await send(1, { $case: 'startGroup', value: { groupId: 'g3', memberIds: [] } }), 'startGroup');
    const id = containerIds['m1']!;
    const startedAt = async () => Date.parse((await rt.find(id))!.startedAt!);
    const first = await startedAt();
    const restart = (startedAtUnixMs: number, commandId?: string) =>
      send(1, { $case: 'restartMember', value: { groupId: 'g3', memberId: 'm1', containerId: id, startedAtUnixMs, graceMs: 2000 } }, commandId);
    const r1 = value(await restart(first, 'reclaim-g3-1'), 'restartMember');
    expect(r1).toMatchObject({ containerId: id, restarted: true });
    expect(r1.startedAtUnixMs).toBeGreaterThan(first);
    expect(r1.startedAtUnixMs).toBe(await startedAt());
    // The same command again is answered from the result cache; a new command for the gone incarnation
    // finds nothing to end and leaves the running container alone.
    expect(value(await restart(first, 'reclaim-g3-1'), 'restartMember')).toEqual(r1);
    expect(value(await restart(first), 'restartMember')).toEqual({ containerId: id, startedAtUnixMs: r1.startedAtUnixMs, restarted: false });
    expect(await startedAt()).toBe(r1.startedAtUnixMs);
    // An inventory about the group sent while a reclaim runs waits for it: it shows the member running
    // its new incarnation, never between the stop and the start (a turn begun on that view would have
    // no process to run in). Sent after the restart, so without the wait it lands mid-restart.
    const reclaim = restart(r1.startedAtUnixMs, 'reclaim-g3-2');
    await new Promise((r) => setTimeout(r, 50));
    const seen = value(await send(1, { $case: 'inventory', value: { groupId: 'g3' } }), 'inventory').containers.find((c) => c.containerId === id);
    const r2 = value(await reclaim, 'restartMember');
    expect(r2.restarted).toBe(true);
    expect({ state: seen?.state, startedAt: seen?.startedAtUnixMs }).toEqual({ state: ContainerState.RUNNING, startedAt: r2.startedAtUnixMs });
    // A stop that got in first stays a stop: nothing is started, and no incarnation is named.
    value(await send(1, { $case: 'stopGroup', value: { groupId: 'g3', graceMs: 2000 } }), 'stopGroup');
    expect(value(await restart(r1.startedAtUnixMs), 'restartMember')).toEqual({ containerId: id, startedAtUnixMs: 0, restarted: false });
    expect(await states('g3')).toEqual({ m1: 'exited' });
    expect(await send(1, { $case: 'restartMember', value: { groupId: 'g3', memberId: 'nobody', containerId: id, startedAtUnixMs: first, graceMs: 0 } })).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'member_not_found' });
    value(await send(1, { $case: 'deleteGroup', value: { groupId: 'g3', reason: 'destroyed' } }), 'deleteGroup');
  });
});

describe('fencing (R-H6)', () => {
  it('refuses an older placement generation and changes nothing', async () => {
    // g1 is known at generation 1; a generation-0 command is from an earlier placement.
    const r = await send(0, { $case: 'startGroup', value: { groupId: 'g1', memberIds: [] } });
    expect(r).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'stale_generation' });
    const d = await send(0, { $case: 'deleteGroup', value: { groupId: 'g1', reason: 'destroyed' } });
    expect(d).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'stale_generation' });
    expect(await states('g1')).toEqual({ m1: 'exited', m2: 'exited' });
  });

  it('refuses an old epoch and changes nothing', async () => {
    const r = await sendCommand(nc, { hostId: HOST, epoch: epoch() - 1, generation: 1 }, { $case: 'startGroup', value: { groupId: 'g1', memberIds: [] } });
    expect(r).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'stale_epoch' });
    expect(await states('g1')).toEqual({ m1: 'exited', m2: 'exited' });
  });
});

describe('re-registration (R-H6, R-R6): only a positive verdict deletes', () => {
  it('names its group copies, deletes only what a DELETE verdict names (up to its generation), keeps the rest, and fences the old epoch', async () => {
    value(await create('g3', [['m1', CliKind.OPENCODE]]), 'createGroup');
    value(await create('g4', [['m1', CliKind.PI]]), 'createGroup');
    const before = epoch();
    verdicts = () => [
      { groupId: 'g3', action: CopyAction.DELETE, reason: 'placed_elsewhere', upToGeneration: 1 },
      // A delete about an older placement than the copy's never reaches it.
      { groupId: 'g4', action: CopyAction.DELETE, reason: 'placed_elsewhere', upToGeneration: 0 },
      { groupId: 'g1', action: CopyAction.KEEP, reason: 'owned', upToGeneration: 0 },
    ];
    const ack = await agent!.agent.reregister();
    const reg = responder.registrations.at(-1)!;
    expect(reg.groupCopies.map((c) => [c.groupId, c.maxGeneration]).sort()).toEqual([['g1', 1], ['g3', 1], ['g4', 1]]);
    expect(ack.hostEpoch).toBe(before + 1);
    expect(epoch()).toBe(before + 1);
    expect(await rt.listMembers('g3')).toEqual([]);
    expect(await rt.listMembers('g4')).toHaveLength(1);
    expect(await states('g1')).toEqual({ m1: 'exited', m2: 'exited' });
    const stale = await sendCommand(nc, { hostId: HOST, epoch: before, generation: 1 }, { $case: 'startGroup', value: { groupId: 'g1', memberIds: [] } });
    expect(stale).toMatchObject({ outcome: CommandOutcome.REFUSED, reason: 'stale_epoch' });

    // No verdict at all (the control plane knows nothing of them): everything stays.
    verdicts = () => [];
    await agent!.agent.reregister();
    expect((await rt.listMembers()).map((c) => c.member?.groupId).sort()).toEqual(['g1', 'g1', 'g4']);

    verdicts = (r) => r.groupCopies.map((c) => ({ groupId: c.groupId, action: CopyAction.DELETE, reason: 'destroyed', upToGeneration: c.maxGeneration }));
    await agent!.agent.reregister();
    expect(await rt.listMembers()).toEqual([]);
    expect(responder.registrations.filter((r) => r.hostId === HOST)).toHaveLength(4);
  });
});
