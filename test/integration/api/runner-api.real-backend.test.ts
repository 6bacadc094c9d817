// THE PRODUCT'S RUNNER BACKEND over the real stack (issue 19): the status-code, deadline,
// idempotency and CAS cases of the seam test (test/seam/runner-server.seam-backend.test.ts), asked
// of the runner SDK over mTLS → ApiServer → the real ControlPlane's RunnerBackend → a real
// nats-server (JetStream KV, compare-and-set), a real host agent and a real dockerd
// (fleet-harness.ts; nothing simulated, no test knobs inside the product). Faults are made the way
// they happen in production: a container removed with the engine, the nats-server stopped, a
// second writer on the same group record, a host that is full, deadlines shorter than the work.
// Where the product answers differently from the seam it says so (a repeated stop is answered, not
// refused). Not here: INTERNAL (no real fault produces it without an injected one; its mapping is
// the API layer's, proven at the seam).
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readErrorDetail } from '../../../src/api/errors.ts';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { GroupRecordSchema } from '../../../src/control-plane/records.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { CliKind, ContextState, GroupState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerServiceClient, type BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { CasConflictError } from '../../../src/store/errors.ts';
import { RunnerClient, RunnerError, type CliKind as SdkCli } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type CertPair, type TestPki } from '../../support/certs.ts';
import { successEvidence } from '../../support/evidence.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

const ok = successEvidence;
const HOST = 'host-a';
/** Members the host may hold: small, so the capacity case fills it with a few groups. */
const MAX_MEMBERS = 40;

let fleet: Fleet;
let pki: TestPki;
let plane: ControlPlane;
let server: ApiServer;
let runner: RunnerClient;

function sdk(pair: CertPair, retry = { maxRetries: 8, initialDelayMs: 5, maxDelayMs: 100 }): RunnerClient {
  return new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pair.cert, key: pair.key }, deadlineMs: 60_000, retry });
}
const noRetry = (): RunnerClient => sdk(pki.runner, { maxRetries: 0, initialDelayMs: 1, maxDelayMs: 1 });

function raw(): RunnerServiceClient {
  return new RunnerServiceClient(`127.0.0.1:${server.port}`, grpc.credentials.createSsl(pki.ca, pki.runner.key, pki.runner.cert));
}

/** Calls a raw unary method and resolves with the status (OK or the error), never rejects. */
function callRaw<Req>(fn: (req: Req, md: grpc.Metadata, opts: Partial<grpc.CallOptions>, cb: (e: grpc.ServiceError | null, r: unknown) => void) => unknown, req: Req, deadline = Date.now() + 30_000) {
  return new Promise<{ code: grpc.status; reason: string | undefined; response: unknown }>((resolve) => {
    fn(req, new grpc.Metadata(), { deadline }, (e, r) =>
      resolve(e ? { code: e.code, reason: readErrorDetail(e.metadata)?.reason, response: undefined } : { code: grpc.status.OK, reason: undefined, response: r }),
    );
  });
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

let conversationSeq = 0;
async function openGroup(members: { memberId: string; cli: SdkCli }[] = [{ memberId: 'm1', cli: 'claude-code' }]): Promise<string> {
  const res = await runner.openGroup({ conversationId: `real-${++conversationSeq}`, members });
  return res.group?.groupId ?? '';
}

/** A completed turn with its native session written in the container (what a checkpoint needs). */
async function completedTurn(groupId: string, memberId: string, locator: string): Promise<void> {
  const t = await runner.beginTurn({ groupId, memberId });
  await fleet.writeSession(t.hostId, t.containerId, locator);
  await runner.completeTurn({ groupId, memberId, turnId: t.turnId, observedLocator: locator, evidence: ok() });
}

async function member(groupId: string, memberId: string) {
  const state = await runner.getGroupState({ groupId });
  return { group: state.group!, member: state.group!.members.find((m) => m.memberId === memberId)! };
}

async function containerRunning(containerId: string): Promise<boolean> {
  return (await fleet.hosts[0]!.docker.getContainer(containerId).inspect()).State.Running;
}

beforeAll(async () => {
  [fleet, pki] = await Promise.all([startFleet(1), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn(HOST, 0, { maxMembers: MAX_MEMBERS });
  await fleet.waitFor(`${HOST} READY`, async () => ((await fleet.host(HOST)).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({ runner: plane.runner, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = sdk(pki.runner);
}, 240_000);

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
});

describe('status codes and reasons per error class, real backend (R-I1)', () => {
  it('INVALID_ARGUMENT: missing idempotency key, bad ids, bad members, a reused key', async () => {
    const client = raw();
    const begin = client.beginTurn.bind(client) as never;
    const open = client.openGroup.bind(client) as never;
    expect(await callRaw(begin, { idempotencyKey: '', groupId: 'g', memberId: 'm' })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'empty_value' });
    expect(await callRaw(begin, { idempotencyKey: 'k', groupId: '../etc', memberId: 'm' })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'invalid_characters' });
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: [] })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'empty_value' });
    const nine = Array.from({ length: 9 }, (_, i) => ({ memberId: `m${i}`, kind: CliKind.PI }));
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: nine })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'too_many_entries' });
    const dup = [{ memberId: 'a', kind: CliKind.PI }, { memberId: 'a', kind: CliKind.CODEX }];
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: dup })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'malformed' });
    expect(await callRaw(open, { idempotencyKey: 'k', conversationId: 'c', members: [{ memberId: 'a', kind: 42 }] })).toMatchObject({ code: grpc.status.INVALID_ARGUMENT, reason: 'out_of_range' });
    client.close();
    // None of those created anything.
    await expectRefused(runner.getGroupState({ conversationId: 'c' }), grpc.status.NOT_FOUND, 'group_not_found');

    const groupId = await openGroup();
    const first = await runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'real-reused-key-1' });
    await expectRefused(runner.beginTurn({ groupId, memberId: 'm1', locator: 'x' }, { idempotencyKey: 'real-reused-key-1' }), grpc.status.INVALID_ARGUMENT, 'idempotency_key_reused');
    // The refused reuse changed nothing: the first call's turn is still the one in flight.
    expect((await member(groupId, 'm1')).member.turnInFlightId).toBe(first.turnId);
  });

  it('FAILED_PRECONDITION: turn in flight (R-S8), locator mismatch (R-S3), and after an unclean stop the context is LOST (R-S5)', async () => {
    const groupId = await openGroup();
    await completedTurn(groupId, 'm1', 'sess-fp');
    const t = await runner.beginTurn({ groupId, memberId: 'm1' });
    await expectRefused(runner.beginTurn({ groupId, memberId: 'm1' }), grpc.status.FAILED_PRECONDITION, 'turn_in_flight');
    const mismatch = await expectRefused(runner.completeTurn({ groupId, memberId: 'm1', turnId: t.turnId, observedLocator: 'sess-other', evidence: ok() }), grpc.status.FAILED_PRECONDITION, 'locator_mismatch');
    expect(mismatch.metadata.phase).toBe('end');
    await expectRefused(runner.beginTurn({ groupId, memberId: 'm1', locator: 'sess-other' }), grpc.status.FAILED_PRECONDITION, 'locator_mismatch');
    const t2 = await runner.beginTurn({ groupId, memberId: 'm1' });
    const stopped = await runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.UNCLEAN);
    // Where the seam refuses a second stop (invalid_transition), the product answers it: the group
    // is stopped, and the answer says how.
    const again = await runner.stopGroup({ groupId });
    expect({ outcome: again.outcome, state: again.group?.state }).toEqual({ outcome: StopOutcome.UNCLEAN, state: GroupState.STOPPED });
    const lost = await expectRefused(runner.beginTurn({ groupId, memberId: 'm1' }), grpc.status.FAILED_PRECONDITION, 'context_lost');
    expect(lost.metadata.lostReason).toBe('turn_unconfirmed');
    expect((await member(groupId, 'm1')).member.turnInFlightId).not.toBe(t2.turnId);
  });

  it('NOT_FOUND: group, member, turn, conversation', async () => {
    const groupId = await openGroup();
    await expectRefused(runner.beginTurn({ groupId: 'no-such-group', memberId: 'm1' }), grpc.status.NOT_FOUND, 'group_not_found');
    await expectRefused(runner.beginTurn({ groupId, memberId: 'nobody' }), grpc.status.NOT_FOUND, 'member_not_found');
    await expectRefused(runner.completeTurn({ groupId, memberId: 'm1', turnId: 't-unknown', observedLocator: 's', evidence: ok() }), grpc.status.NOT_FOUND, 'turn_not_found');
    await expectRefused(runner.getGroupState({ conversationId: 'never-opened' }), grpc.status.NOT_FOUND, 'group_not_found');
  });

  it('UNAVAILABLE: containers removed with the engine make a stop UNAVAILABLE container_missing (retry), then the group is LOST with its reason', async () => {
    const groupId = await openGroup();
    const t = await runner.beginTurn({ groupId, memberId: 'm1' });
    await fleet.writeSession(t.hostId, t.containerId, 'sess-gone');
    await runner.completeTurn({ groupId, memberId: 'm1', turnId: t.turnId, observedLocator: 'sess-gone', evidence: ok() });
    await fleet.hosts[0]!.docker.getContainer(t.containerId).remove({ force: true });
    const client = noRetry();
    try {
      await expectRefused(client.stopGroup({ groupId }), grpc.status.UNAVAILABLE, 'container_missing');
    } finally {
      client.close();
    }
    // A running group whose containers are gone cannot be recovered: LOST, with the reason, and the
    // runner is told so (never a silent new session).
    await fleet.waitFor('group LOST', async () => ((await runner.getGroupState({ groupId })).group?.state === GroupState.LOST ? true : undefined), 60_000);
    expect((await runner.getGroupState({ groupId })).group?.lossReason).toBe('host_lost_running');
    await expectRefused(runner.beginTurn({ groupId, memberId: 'm1' }), grpc.status.FAILED_PRECONDITION, 'context_lost');
  });

  it('a begin whose member container was removed is refused context_lost, not a new session (where the seam answers UNAVAILABLE)', async () => {
    const groupId = await openGroup();
    const t = await runner.beginTurn({ groupId, memberId: 'm1' });
    await fleet.writeSession(t.hostId, t.containerId, 'sess-gone-2');
    await runner.completeTurn({ groupId, memberId: 'm1', turnId: t.turnId, observedLocator: 'sess-gone-2', evidence: ok() });
    await fleet.hosts[0]!.docker.getContainer(t.containerId).remove({ force: true });
    // A heartbeat taken before the removal still proves the process LIVE for its freshness window
    // (the R-S1 fast path, runner-backend.ts: the same race a per-turn inventory has, a little
    // wider); this case is about the begin that follows, so it waits for a heartbeat that saw it gone.
    const removedAt = Date.now();
    await fleet.waitFor('a heartbeat after the removal', async () => {
      const hb = plane.fleet.heartbeat(t.hostId);
      return hb !== undefined && hb.receivedAtMs > removedAt + 50 && !hb.containers.some((c) => c.containerId === t.containerId) ? true : undefined;
    }, 10_000);
    const lost = await expectRefused(runner.beginTurn({ groupId, memberId: 'm1' }), grpc.status.FAILED_PRECONDITION, 'context_lost');
    console.info(`begin after the container was removed: context_lost, lostReason ${lost.metadata.lostReason}`);
    expect(lost.metadata.lostReason ?? '').not.toBe('');
    expect((await member(groupId, 'm1')).member.savedLocator).toBe('sess-gone-2');
  });
});

describe('CAS on the real store (R-R2, R-S8)', () => {
  it('every member of one group begins at once while another writer rewrites the record, then retries and completes at once: each turn exactly once, and the conflicts were real', async () => {
    const members = Array.from({ length: 8 }, (_, i) => ({ memberId: `m${i}`, cli: 'pi' as const }));
    const groupId = await openGroup(members);
    const repo = fleet.store.shardedRepository('groups', GroupRecordSchema);
    let writing = true;
    let outsideWrites = 0;
    let writerLost = 0;
    // A second writer on the same record: rewrites it as it is (no change in meaning), as fast as it
    // can, by compare-and-set, so the backend's writes keep losing to it (and it to them).
    const writer = (async () => {
      while (writing) {
        const cur = await repo.get(Keys.group(groupId));
        if (cur === undefined) throw new Error(`group ${groupId} vanished`);
        try {
          await repo.update(Keys.group(groupId), cur.value, cur.revision);
          outsideWrites += 1;
        } catch (err) {
          if (!(err instanceof CasConflictError)) throw err;
          writerLost += 1;
        }
      }
    })();
    const oneShot = noRetry();
    let firsts: (BeginTurnResponse | RunnerError)[];
    try {
      // First attempts, all members at once, under the outside writer, from a client that does not
      // retry: each is OK, or ABORTED cas_conflict when the conflicts outlast the backend's retries.
      firsts = await Promise.all(members.map((m) => oneShot.beginTurn({ groupId, memberId: m.memberId }, { idempotencyKey: `cas-begin-${m.memberId}` }).catch((e: unknown) => e as RunnerError)));
    } finally {
      writing = false;
      await writer;
      oneShot.close();
    }
    const answers = firsts.map((f) => (f instanceof RunnerError ? `${f.codeName}/${f.reason}` : 'OK'));
    expect(answers.filter((a) => a !== 'OK' && a !== 'ABORTED/cas_conflict'), 'a first attempt fails only by a CAS conflict').toEqual([]);
    // The runner's retries (same keys, all members at once, still racing each other on the record):
    // the first answer where there was one, and each member's turn begins exactly once.
    const begins = await Promise.all(members.map((m) => runner.beginTurn({ groupId, memberId: m.memberId }, { idempotencyKey: `cas-begin-${m.memberId}` })));
    const state = (await runner.getGroupState({ groupId })).group!;
    for (const [i, m] of members.entries()) {
      if (!(firsts[i] instanceof RunnerError)) expect(begins[i], `${m.memberId}: the same key gets the first answer`).toEqual(firsts[i]);
      expect(begins[i]!.contextState).toBe(ContextState.NEW);
      expect(state.members.find((x) => x.memberId === m.memberId)!.turnInFlightId, `${m.memberId}: its one turn is the one in flight`).toBe(begins[i]!.turnId);
    }
    await Promise.all(members.map(async (m, i) => {
      const c = await runner.completeTurn({ groupId, memberId: m.memberId, turnId: begins[i]!.turnId, observedLocator: `sess-cas-${m.memberId}`, evidence: ok() }, { idempotencyKey: `cas-complete-${m.memberId}` });
      expect(c).toMatchObject({ sessionKept: true, savedLocator: `sess-cas-${m.memberId}` });
    }));
    const after = (await runner.getGroupState({ groupId })).group!;
    expect(after.members.map((m) => ({ id: m.memberId, completed: m.completedTurns, saved: m.savedLocator, inFlight: m.turnInFlightId })))
      .toEqual(members.map((m) => ({ id: m.memberId, completed: 1, saved: `sess-cas-${m.memberId}`, inFlight: '' })));
    // The contention was real: the backend lost races it could not win back (ABORTED first
    // attempts) or won races the outside writer then lost. (The plane's
    // sandboxfleet_state_cas_conflicts_total cannot tell: nothing in the product increments it.)
    const aborted = answers.filter((a) => a === 'ABORTED/cas_conflict').length;
    console.info(`CAS on the real store: ${outsideWrites} outside writes, ${writerLost} lost by the outside writer; first attempts: ${answers.join(', ')}`);
    expect(aborted + writerLost, 'compare-and-set races lost on either side').toBeGreaterThan(0);
  });
});

describe('deadlines (R-I1), real backend', () => {
  it('returns DEADLINE_EXCEEDED when the work outlasts the deadline, and the same key then begins the turn once', async () => {
    // A stopped 8-member group: a begin first starts eight containers on the engine, far longer than 50 ms.
    const members = Array.from({ length: 8 }, (_, i) => ({ memberId: `d${i}`, cli: 'codex' as const }));
    const groupId = await openGroup(members);
    await runner.stopGroup({ groupId });
    const client = noRetry();
    const started = Date.now();
    try {
      await expectRefused(client.beginTurn({ groupId, memberId: 'd0' }, { idempotencyKey: 'slow-begin', deadlineMs: 50 }), grpc.status.DEADLINE_EXCEEDED, 'deadline_exceeded');
    } finally {
      client.close();
    }
    expect(Date.now() - started, 'answered at the deadline, not when the work ended').toBeLessThan(350);
    const t = await runner.beginTurn({ groupId, memberId: 'd0' }, { idempotencyKey: 'slow-begin' });
    const again = await runner.beginTurn({ groupId, memberId: 'd0' }, { idempotencyKey: 'slow-begin' });
    expect(again).toEqual(t);
    const { group, member: d0 } = await member(groupId, 'd0');
    expect({ state: group.state, inFlight: d0.turnInFlightId }).toEqual({ state: GroupState.RUNNING, inFlight: t.turnId });
  });

  it('never starts work for a call whose deadline has already passed: a stopped group stays stopped', async () => {
    const groupId = await openGroup();
    const t = await runner.beginTurn({ groupId, memberId: 'm1' });
    await fleet.writeSession(t.hostId, t.containerId, 'sess-expired');
    await runner.completeTurn({ groupId, memberId: 'm1', turnId: t.turnId, observedLocator: 'sess-expired', evidence: ok() });
    await runner.stopGroup({ groupId });
    const { events: before } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 200 });
    const client = raw();
    const res = await callRaw(client.beginTurn.bind(client) as never, { idempotencyKey: 'k-expired', groupId, memberId: 'm1' }, Date.now() - 1);
    client.close();
    expect(res.code).toBe(grpc.status.DEADLINE_EXCEEDED);
    // Nothing happened: still stopped, container not started, no event, no turn.
    const { group, member: m1 } = await member(groupId, 'm1');
    expect({ state: group.state, inFlight: m1.turnInFlightId, running: await containerRunning(t.containerId) }).toEqual({ state: GroupState.STOPPED, inFlight: '', running: false });
    const { events: after } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 200 });
    expect(after.length).toBe(before.length);
    // And no answer was stored under the key: the same key now does the work for the first time.
    const later = await runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'k-expired' });
    expect(later).toMatchObject({ contextState: ContextState.RESTORED, locator: 'sess-expired' });
  });
});

describe('idempotency over the wire (R-I1), real backend', () => {
  it('answers a repeat with the same key with the first answer, and does the work once', async () => {
    const groupId = await openGroup();
    const first = await runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'real-begin-once' });
    await fleet.writeSession(first.hostId, first.containerId, 's-1');
    const again = await runner.beginTurn({ groupId, memberId: 'm1' }, { idempotencyKey: 'real-begin-once' });
    expect(again).toEqual(first);
    const done = await runner.completeTurn({ groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 's-1', evidence: ok() }, { idempotencyKey: 'real-complete-once' });
    const doneAgain = await runner.completeTurn({ groupId, memberId: 'm1', turnId: first.turnId, observedLocator: 's-1', evidence: ok() }, { idempotencyKey: 'real-complete-once' });
    expect(doneAgain).toEqual(done);
    expect(Number((await member(groupId, 'm1')).member.completedTurns)).toBe(1);
    const stop = await runner.stopGroup({ groupId }, { idempotencyKey: 'real-stop-once' });
    const stopAgain = await runner.stopGroup({ groupId }, { idempotencyKey: 'real-stop-once' });
    expect(stopAgain).toEqual(stop);
    const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: groupId, limit: 200 });
    expect(events.filter((e) => e.event.type === 'group_stopped')).toHaveLength(1);
  });

  it('converges concurrent duplicates on one answer; concurrent different keys get one turn (R-S8)', async () => {
    const opened = await Promise.all(Array.from({ length: 8 }, () => runner.openGroup({ conversationId: 'real-conv-dup', members: [{ memberId: 'codex', cli: 'codex' }] }, { idempotencyKey: 'real-open-dup' })));
    expect(new Set(opened.map((o) => JSON.stringify(o))).size).toBe(1);
    expect(opened[0]!.created).toBe(true);
    const groupId = opened[0]!.group!.groupId;
    // One container on the engine for the one member (the group was created once).
    const containers = await fleet.hosts[0]!.docker.listContainers({ all: true });
    expect(containers.filter((c) => Object.values(c.Labels ?? {}).includes(groupId))).toHaveLength(1);

    const begins = await Promise.all(Array.from({ length: 8 }, () => runner.beginTurn({ groupId, memberId: 'codex' }, { idempotencyKey: 'real-begin-dup' })));
    expect(new Set(begins.map((b) => JSON.stringify(b))).size).toBe(1);

    const other = await openGroup([{ memberId: 'pi', cli: 'pi' }]);
    const races = await Promise.allSettled(Array.from({ length: 8 }, () => runner.beginTurn({ groupId: other, memberId: 'pi' })));
    const won = races.filter((r) => r.status === 'fulfilled');
    expect(won).toHaveLength(1);
    for (const r of races) if (r.status === 'rejected') expect((r.reason as RunnerError).reason).toBe('turn_in_flight');
    expect((await member(other, 'pi')).member.turnInFlightId).toBe((won[0] as PromiseFulfilledResult<{ turnId: string }>).value.turnId);
  });
});

describe('store and capacity, real backend (run last: they take the store down and fill the host)', () => {
  it('UNAVAILABLE store_unavailable while the nats-server is down; the same calls work once it is back', async () => {
    const groupId = await openGroup();
    const client = noRetry();
    await fleet.nats.server.stop();
    try {
      await expectRefused(client.openGroup({ conversationId: 'real-store-down', members: [{ memberId: 'pi', cli: 'pi' }] }, { idempotencyKey: 'store-down-open' }), grpc.status.UNAVAILABLE, 'store_unavailable');
    } finally {
      await fleet.nats.server.start();
      client.close();
    }
    await fleet.waitFor(`${HOST} READY again`, async () => ((await fleet.host(HOST)).lifecycle.state === 'READY' ? true : undefined), 60_000);
    // The runner's retry (same key) now succeeds, once; the earlier group is intact.
    const opened = await runner.openGroup({ conversationId: 'real-store-down', members: [{ memberId: 'pi', cli: 'pi' }] }, { idempotencyKey: 'store-down-open' });
    expect(opened.created).toBe(true);
    expect((await runner.getGroupState({ groupId })).group?.state).toBe(GroupState.RUNNING);
  });

  it('RESOURCE_EXHAUSTED no_capacity once the host is full; the refused open creates nothing', async () => {
    const eight = Array.from({ length: 8 }, (_, i) => ({ memberId: `c${i}`, cli: 'kilo' as const }));
    let refused: RunnerError | undefined;
    let opened = 0;
    for (let i = 0; i < MAX_MEMBERS / 8 + 1 && refused === undefined; i++) {
      refused = await runner.openGroup({ conversationId: `real-full-${i}`, members: eight }).then(() => {
        opened += 1;
        return undefined;
      }, (e: unknown) => e as RunnerError);
      if (refused !== undefined) {
        expect({ code: refused.codeName, reason: refused.reason }).toEqual({ code: 'RESOURCE_EXHAUSTED', reason: 'no_capacity' });
        await expectRefused(runner.getGroupState({ conversationId: `real-full-${i}` }), grpc.status.NOT_FOUND, 'group_not_found');
      }
    }
    expect(refused, `refused after ${opened} more groups of 8`).toBeDefined();
    const containers = await fleet.hosts[0]!.docker.listContainers({ all: true });
    expect(containers.length, 'never more containers than the host takes').toBeLessThanOrEqual(MAX_MEMBERS);
  });
});
