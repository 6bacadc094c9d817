// The runner contract as runner.proto states it, over the wire (issue 13): the runner SDK and raw
// gRPC clients over mTLS → ApiServer → the real control plane → a real nats-server, a real host
// agent and a real dockerd (fleet-harness.ts). Each case is a contract defect a new user found by
// driving the API by hand; each failed on the code before its fix:
// - a LOST conversation stays loud: OpenGroup is refused `conversation_lost` (with the group id and
//   its lost reason) unless the runner asks for a new conversation with `start_anew`;
// - a BeginTurn refused `turn_in_flight` does not replace the stored answer of the turn in flight,
//   so that turn's retry with its own key still gets its turn;
// - OpenGroup with another member set is refused `member_set_mismatch`;
// - CompleteTurn and StopGroup on a LOST group answer `context_lost` with the group's lost reason
//   (was: NOT_FOUND turn_not_found, and OK with an unspecified stop outcome);
// - every CompleteTurn stores its turn-end evidence in the same write (the last 8 per member),
//   shown by GetGroup(include_turns) and `sandboxctl turns`.
// The group is made LOST the way it happens in production: its container removed with the engine,
// then a stop that finds nothing (the control plane evacuates it as lost Docker data).
import * as grpc from '@grpc/grpc-js';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdminHandlers } from '../../../src/api/admin-handlers.ts';
import { readErrorDetail } from '../../../src/api/errors.ts';
import { ApiServer } from '../../../src/api/runner-server.ts';
import { runCli } from '../../../src/cli/commands.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { AdminServiceClient, GetGroupRequest, GetGroupResponse } from '../../../src/gen/sandboxfleet/v1/admin.ts';
import { CliKind, ContextState, GroupState, TurnEndKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { OpenGroupRequest, RunnerServiceClient, type OpenGroupResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError, type CliKind as SdkCli } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type CertPair, type TestPki } from '../../support/certs.ts';
import { successEvidence } from '../../support/evidence.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

const ok = successEvidence;
const HOST = 'host-a';

let fleet: Fleet;
let pki: TestPki;
let plane: ControlPlane;
let server: ApiServer;
let runner: RunnerClient;

function sdk(pair: CertPair, retry = { maxRetries: 8, initialDelayMs: 5, maxDelayMs: 100 }): RunnerClient {
  return new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pair.cert, key: pair.key }, deadlineMs: 60_000, retry });
}
const noRetry = (): RunnerClient => sdk(pki.runner, { maxRetries: 0, initialDelayMs: 1, maxDelayMs: 1 });

type Outcome<T> = { code: grpc.status; reason: string | undefined; metadata: Record<string, string>; response: T | undefined };

/** A raw unary call (fields the SDK does not send, e.g. start_anew); resolves with the status, never rejects. */
function unary<Req, Res>(client: grpc.Client, method: string, request: Req): Promise<Outcome<Res>> {
  const fn = (client as unknown as Record<string, (r: Req, md: grpc.Metadata, o: Partial<grpc.CallOptions>, cb: (e: grpc.ServiceError | null, r: Res) => void) => void>)[method]!;
  return new Promise((resolve) => {
    fn.call(client, request, new grpc.Metadata(), { deadline: Date.now() + 60_000 }, (e, r) => {
      const detail = e ? readErrorDetail(e.metadata) : undefined;
      resolve(e ? { code: e.code, reason: detail?.reason, metadata: { ...(detail?.metadata ?? {}) }, response: undefined } : { code: grpc.status.OK, reason: undefined, metadata: {}, response: r });
    });
  });
}

function rawRunner(): RunnerServiceClient {
  return new RunnerServiceClient(`127.0.0.1:${server.port}`, grpc.credentials.createSsl(pki.ca, pki.runner.key, pki.runner.cert));
}

function rawAdmin(): AdminServiceClient {
  return new AdminServiceClient(`127.0.0.1:${server.port}`, grpc.credentials.createSsl(pki.ca, pki.admin.key, pki.admin.cert));
}

async function refusal(p: Promise<unknown>): Promise<RunnerError> {
  const e = await p.then(() => undefined, (err: unknown) => err);
  expect(e, 'the call must be refused').toBeInstanceOf(RunnerError);
  return e as RunnerError;
}

async function expectRefused(p: Promise<unknown>, code: grpc.status, reason: string): Promise<RunnerError> {
  const e = await refusal(p);
  expect({ code: e.codeName, reason: e.reason }).toEqual({ code: grpc.status[code], reason });
  return e;
}

const claude = [{ memberId: 'm1', cli: 'claude-code' as SdkCli }];

/** A completed turn with its native session written in the container. */
async function completedTurn(groupId: string, memberId: string, locator: string): Promise<string> {
  const t = await runner.beginTurn({ groupId, memberId });
  await fleet.writeSession(t.hostId, t.containerId, locator);
  await runner.completeTurn({ groupId, memberId, turnId: t.turnId, observedLocator: locator, evidence: ok() });
  return t.turnId;
}

beforeAll(async () => {
  [fleet, pki] = await Promise.all([startFleet(1), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn(HOST, 0, { maxMembers: 40 });
  await fleet.waitFor(`${HOST} READY`, async () => ((await fleet.host(HOST)).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({
    runner: plane.runner,
    admin: createAdminHandlers(plane),
    address: '127.0.0.1:0',
    security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } },
  });
  runner = sdk(pki.runner);
}, 240_000);

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
});

describe('a LOST conversation stays loud', () => {
  const conversationId = 'contract-lost';
  /** The conversation's group, made LOST with a turn in flight (the first test to need it makes it). */
  let lost: Promise<{ groupId: string; inFlightTurnId: string }> | undefined;
  const lostGroup = () => (lost ??= (async () => {
    const opened = await runner.openGroup({ conversationId, members: claude });
    const groupId = opened.group!.groupId;
    await completedTurn(groupId, 'm1', 'sess-lost-1');
    const t = await runner.beginTurn({ groupId, memberId: 'm1' });
    await fleet.hosts[0]!.docker.getContainer(t.containerId).remove({ force: true });
    const client = noRetry();
    try {
      await expectRefused(client.stopGroup({ groupId }), grpc.status.UNAVAILABLE, 'container_missing');
    } finally {
      client.close();
    }
    await fleet.waitFor('group LOST', async () => ((await runner.getGroupState({ groupId })).group?.state === GroupState.LOST ? true : undefined), 60_000);
    return { groupId, inFlightTurnId: t.turnId };
  })());

  it('OpenGroup is refused FAILED_PRECONDITION conversation_lost, naming the group and its lost reason; nothing is replaced', async () => {
    const { groupId } = await lostGroup();
    const e = await expectRefused(runner.openGroup({ conversationId, members: claude }), grpc.status.FAILED_PRECONDITION, 'conversation_lost');
    expect(e.metadata).toMatchObject({ groupId, groupState: 'LOST', lostReason: 'host_lost_running' });
    // The conversation still names its LOST group: the refusal created nothing.
    const state = await runner.getGroupState({ conversationId });
    expect({ groupId: state.group?.groupId, state: state.group?.state, lossReason: state.group?.lossReason }).toEqual({ groupId, state: GroupState.LOST, lossReason: 'host_lost_running' });
  }, 120_000);

  it('CompleteTurn of the turn that was in flight answers context_lost with the group lost reason (not turn_not_found)', async () => {
    const { groupId, inFlightTurnId } = await lostGroup();
    const e = await expectRefused(runner.completeTurn({ groupId, memberId: 'm1', turnId: inFlightTurnId, observedLocator: 'sess-lost-1', evidence: ok() }), grpc.status.FAILED_PRECONDITION, 'context_lost');
    expect(e.metadata).toMatchObject({ groupId, memberId: 'm1', groupState: 'LOST', lostReason: 'host_lost_running' });
  }, 120_000);

  it('StopGroup answers context_lost with the lost reason (not OK with an unspecified outcome)', async () => {
    const { groupId } = await lostGroup();
    const e = await expectRefused(runner.stopGroup({ groupId }), grpc.status.FAILED_PRECONDITION, 'context_lost');
    expect(e.metadata).toMatchObject({ groupId, groupState: 'LOST', lostReason: 'host_lost_running' });
  }, 120_000);

  it('start_anew opens a new, empty group and says so (created); a repeat answers the same; the old group stays LOST', async () => {
    const { groupId } = await lostGroup();
    const client = rawRunner();
    try {
      const request = OpenGroupRequest.fromPartial({ idempotencyKey: 'contract-anew-1', conversationId, members: [{ memberId: 'm1', kind: CliKind.CLAUDE_CODE }], startAnew: true });
      const anew = await unary<OpenGroupRequest, OpenGroupResponse>(client, 'openGroup', request);
      expect({ code: anew.code, reason: anew.reason }).toEqual({ code: grpc.status.OK, reason: undefined });
      const fresh = anew.response!.group!;
      expect({ created: anew.response!.created, state: fresh.state }).toEqual({ created: true, state: GroupState.RUNNING });
      expect(fresh.groupId).not.toBe(groupId);
      expect(anew.response!.group!.members.map((m) => [m.memberId, m.completedTurns, m.savedLocator])).toEqual([['m1', 0, '']]);
      // The same call again (a retry): the same answer.
      const repeat = await unary<OpenGroupRequest, OpenGroupResponse>(client, 'openGroup', request);
      expect({ created: repeat.response?.created, groupId: repeat.response?.group?.groupId }).toEqual({ created: true, groupId: fresh.groupId });
      // start_anew on a live group is just an open: the new group, not another one.
      const again = await unary<OpenGroupRequest, OpenGroupResponse>(client, 'openGroup', OpenGroupRequest.fromPartial({ ...request, idempotencyKey: 'contract-anew-2' }));
      expect({ created: again.response?.created, groupId: again.response?.group?.groupId }).toEqual({ created: false, groupId: fresh.groupId });
    } finally {
      client.close();
    }
    const reopened = await runner.openGroup({ conversationId, members: claude });
    expect(reopened.created).toBe(false);
    const t = await runner.beginTurn({ groupId: reopened.group!.groupId, memberId: 'm1' });
    expect(t.contextState).toBe(ContextState.NEW);
    expect((await runner.getGroupState({ groupId })).group?.state).toBe(GroupState.LOST);
  }, 120_000);
});

describe('BeginTurn idempotency around a turn in flight', () => {
  it('a begin refused turn_in_flight (another key) leaves the in-flight turn\'s answer: its retry with its own key gets the same turn', async () => {
    const groupId = (await runner.openGroup({ conversationId: 'contract-in-flight', members: claude })).group!.groupId;
    await completedTurn(groupId, 'm1', 'sess-in-flight');
    const first = await runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'contract-begin-k1' });
    await expectRefused(runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'contract-begin-k2' }), grpc.status.FAILED_PRECONDITION, 'turn_in_flight');
    // The retry of the turn in flight (its answer was lost, say): the same turn, not idempotency_key_reused.
    const retried = await runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'contract-begin-k1' });
    expect(retried).toEqual(first);
    // The refused call keeps its own answer too (a repeat is refused the same way, never executed).
    await expectRefused(runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'contract-begin-k2' }), grpc.status.FAILED_PRECONDITION, 'turn_in_flight');
    await runner.completeTurn({ groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 'sess-in-flight', evidence: ok() });
    await expectRefused(runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'contract-begin-k2' }), grpc.status.FAILED_PRECONDITION, 'turn_in_flight');
    const next = await runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'contract-begin-k3' });
    expect(next.contextState).not.toBe(ContextState.UNSPECIFIED);
    expect((await runner.getGroupState({ groupId })).group?.members[0]?.turnInFlightId).toBe(next.turnId);
  }, 120_000);
});

describe('OpenGroup with another member set', () => {
  it('is refused INVALID_ARGUMENT member_set_mismatch (other CLI kind, fewer, more or other ids); the same set in another order is the group', async () => {
    const conversationId = 'contract-members';
    const members = [{ memberId: 'a', cli: 'claude-code' as SdkCli }, { memberId: 'b', cli: 'pi' as SdkCli }];
    const opened = await runner.openGroup({ conversationId, members });
    const groupId = opened.group!.groupId;
    const others: { memberId: string; cli: SdkCli }[][] = [
      [{ memberId: 'a', cli: 'codex' }, { memberId: 'b', cli: 'pi' }],
      [{ memberId: 'a', cli: 'claude-code' }],
      [...members, { memberId: 'c', cli: 'kilo' }],
      [{ memberId: 'c', cli: 'claude-code' }, { memberId: 'b', cli: 'pi' }],
    ];
    for (const wanted of others) {
      const e = await expectRefused(runner.openGroup({ conversationId, members: wanted }), grpc.status.INVALID_ARGUMENT, 'member_set_mismatch');
      expect(e.metadata).toMatchObject({ groupId, field: 'members' });
    }
    const same = await runner.openGroup({ conversationId, members: [...members].reverse() });
    expect({ created: same.created, groupId: same.group?.groupId, members: same.group?.members.length }).toEqual({ created: false, groupId, members: 2 });
  }, 120_000);
});

describe('per-turn evidence (stored with CompleteTurn, the last 8 per member)', () => {
  it('GetGroup(include_turns) and `sandboxctl turns` show what each turn end reported and what was decided', async () => {
    const groupId = (await runner.openGroup({ conversationId: 'contract-evidence', members: claude })).group!.groupId;
    const begun: string[] = [];
    const contexts: ContextState[] = [];
    for (let i = 1; i <= 10; i++) {
      const t = await runner.beginTurn({ groupId, memberId: 'm1' });
      begun.push(t.turnId);
      contexts.push(t.contextState);
      if (i === 1) await fleet.writeSession(t.hostId, t.containerId, 'sess-evidence');
      // The tenth turn reports another session: refused locator_mismatch, and recorded as such.
      const observed = i === 10 ? 'sess-other' : 'sess-evidence';
      const evidence = ok({ inputBytes: 100 * i, outputBytes: 1000 * i, ...(i === 9 ? { kind: TurnEndKind.RESULT, processExited: true, exitConfirmed: true, exitCode: 0 } : {}) });
      const done = runner.completeTurn({ groupId, memberId: 'm1', turnId: t.turnId, observedLocator: observed, evidence });
      if (i === 10) await expectRefused(done, grpc.status.FAILED_PRECONDITION, 'locator_mismatch');
      else await done;
    }
    const admin = rawAdmin();
    let answer: GetGroupResponse;
    try {
      const got = await unary<GetGroupRequest, GetGroupResponse>(admin, 'getGroup', GetGroupRequest.fromPartial({ groupId, includeTurns: true }));
      expect(got.code).toBe(grpc.status.OK);
      answer = got.response!;
      // Without include_turns the answer carries none (GetGroup stays small).
      const plain = await unary<GetGroupRequest, GetGroupResponse>(admin, 'getGroup', GetGroupRequest.fromPartial({ groupId }));
      expect(plain.response?.turns).toBeUndefined();
    } finally {
      admin.close();
    }
    const turns = answer.turns?.members.find((m) => m.memberId === 'm1')?.turns ?? [];
    expect(turns.map((t) => t.turnId)).toEqual(begun.slice(-8));
    // What each BeginTurn answered; the ninth turn's process exited (confirmed), so the tenth is RESTORED.
    expect(turns.map((t) => t.contextState)).toEqual(contexts.slice(-8));
    expect(contexts[9]).toBe(ContextState.RESTORED);
    const last = turns[7]!;
    expect({ outcome: last.outcome, refusal: last.refusal, observed: last.observedLocator, kind: last.endKind, ended: last.nativeTurnEnded, inputBytes: last.inputBytes, outputBytes: last.outputBytes })
      .toEqual({ outcome: 'locator_mismatch', refusal: 'locator_mismatch', observed: 'sess-other', kind: TurnEndKind.RESULT, ended: true, inputBytes: 1000, outputBytes: 10000 });
    const ninth = turns[6]!;
    expect({ outcome: ninth.outcome, refusal: ninth.refusal, exited: ninth.processExited, confirmed: ninth.exitConfirmed, exitCode: ninth.exitCode, succeeded: ninth.succeeded })
      .toEqual({ outcome: 'completed', refusal: '', exited: true, confirmed: true, exitCode: 0, succeeded: true });
    for (const t of turns) {
      expect(t.completedAtUnixMs).toBeGreaterThanOrEqual(t.beganAtUnixMs);
      expect(t.beganAtUnixMs).toBeGreaterThan(0);
      expect(t.placementGeneration).toBe(answer.group!.placementGeneration);
    }
    // Stored in the group record itself (the same write as the member change) ...
    const stored = await fleet.group(groupId);
    expect(stored.members[0]!.turns?.map((t) => t.turnId)).toEqual(begun.slice(-8));
    // ... and kept out of the read model's memory (fleet-state.ts projectGroup).
    await plane.ctx.fleet.sync();
    expect(plane.ctx.fleet.group(Keys.group(groupId))?.value.members[0]?.turns).toBeUndefined();

    // sandboxctl turns <group>: a table per member, and the same as JSON.
    const dir = pki.dir;
    const tls = ['--server', `127.0.0.1:${server.port}`, '--ca', join(dir, 'fleet-ca.crt'), '--cert', join(dir, 'admin-1.crt'), '--key', join(dir, 'admin-1.key')];
    let out = '';
    let err = '';
    const io = { out: (s: string) => (out += `${s}\n`), err: (s: string) => (err += `${s}\n`) };
    expect(await runCli([...tls, 'turns', groupId], io, {}), err).toBe(0);
    for (const id of begun.slice(-8)) expect(out).toContain(id);
    expect(out).not.toContain(begun[1]!);
    expect(out).toMatch(/locator_mismatch/);
    expect(out).toContain('sess-other');
    out = '';
    expect(await runCli([...tls, '-o', 'json', 'turns', groupId], io, {}), err).toBe(0);
    const json = JSON.parse(out) as { turns: { members: { memberId: string; turns: { turnId: string }[] }[] } };
    expect(json.turns.members[0]?.turns.map((t) => t.turnId)).toEqual(begun.slice(-8));
  }, 180_000);
});
