// RunTurn's driver lease (R-I9, turn-runner.ts, runner-backend.ts) with real parts: a real
// nats-server and state store, a real dockerd host and agent, the control plane, the runner API over
// mTLS and the runner SDK. A turn whose driving call is gone is made the way a replica that died
// right after its begin leaves it: the begin written with that call's driver token and lease
// (ControlPlaneRunnerBackend.beginTurn, as RunTurn calls it), and nothing driving it. No CLI runs
// in these tests: a repeat of the call never drives a turn another call began.
// Covered: the lease is written by the begin, renewed only by its own driver, and a completion that
// takes the turn over is refused while it holds; a repeat of the call completes the turn as not
// ended once the lease lapsed (not after the fleet's longest turn); a repeat waits while the lease
// holds and answers the driver's own end; the SDK's RunTurn has no per-call default deadline.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import type { ControlPlaneRunnerBackend } from '../../../src/control-plane/runner-backend.ts';
import { ContextState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse, RunTurnEnd, RunTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let pki: TestPki;
let server: ApiServer;
let runner: RunnerClient;

beforeAll(async () => {
  [fleet, pki] = await Promise.all([startFleet(1), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({ runner: plane.runner, exec: plane.exec, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = client({ deadlineMs: 60_000 });
}, 240_000);

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
});

function client(options: { deadlineMs?: number } = {}): RunnerClient {
  return new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, ...options });
}

const backend = (): ControlPlaneRunnerBackend => plane.runner as ControlPlaneRunnerBackend;

async function openMember(conversationId: string): Promise<string> {
  return (await runner.openGroup({ conversationId, members: [{ memberId: 'claude', cli: 'claude-code' }] })).group!.groupId;
}

/** The begin of a RunTurn call whose replica then died: its driver token and lease, nothing driving. */
function beginAsDeadDriver(groupId: string, key: string, token: string, leaseMs: number) {
  return backend().beginTurn({ idempotencyKey: key, groupId, memberId: 'claude' }, { commandDigest: 'digest-of-a-turn-process', driver: { token, leaseMs } });
}

async function repeat(c: RunnerClient, groupId: string, key: string): Promise<{ begun: BeginTurnResponse; end: RunTurnEnd }> {
  let begun: BeginTurnResponse | undefined;
  let end: RunTurnEnd | undefined;
  for await (const e of c.runTurn({ groupId, memberId: 'claude', prompt: 'Please remember MARK-REPEAT.' }, { idempotencyKey: key }) as AsyncIterable<RunTurnResponse>) {
    if (e.event?.$case === 'begun') begun = e.event.value;
    else if (e.event?.$case === 'end') end = e.event.value;
  }
  expect(begun).toBeDefined();
  expect(end).toBeDefined();
  return { begun: begun!, end: end! };
}

async function memberRecord(groupId: string) {
  return (await fleet.group(groupId)).members.find((m) => m.session.memberId === 'claude')!;
}

describe('RunTurn\'s driver lease', () => {
  it('the begin writes the lease; only its driver renews it; a take-over is refused while it holds', async () => {
    const groupId = await openMember('driver-lease-rules');
    const begun = await beginAsDeadDriver(groupId, 'lease-rules-1', 'driver-token-0001', 5_000);
    expect(begun.driverToken).toBe('driver-token-0001');
    const m = await memberRecord(groupId);
    expect(m.turnDriver).toMatchObject({ turnId: begun.turnId, token: 'driver-token-0001', replicaId: plane.ctx.replicaId });
    // A repeat of the begin answers the same token: the repeat learns it did not create the turn.
    expect((await backend().beginTurn({ idempotencyKey: 'lease-rules-1', groupId, memberId: 'claude' }, { commandDigest: 'digest-of-a-turn-process', driver: { token: 'driver-token-0002', leaseMs: 5_000 } })).driverToken).toBe('driver-token-0001');
    expect(await backend().renewTurnDriver(groupId, 'claude', begun.turnId, 'driver-token-0002', 60_000)).toBe(false);
    expect(await backend().renewTurnDriver(groupId, 'claude', begun.turnId, 'driver-token-0001', 60_000)).toBe(true);
    expect((await memberRecord(groupId)).turnDriver!.leaseUntilMs).toBeGreaterThan(m.turnDriver!.leaseUntilMs + 50_000);
    const evidence = { kind: 'disconnect' as const, nativeTurnEnded: false, succeeded: false, cleanupFinished: true, transportUsable: false, locatorUsable: false, processExited: false, exitConfirmed: false };
    const refused = await backend().completeTurn({ idempotencyKey: 'lease-rules-1:takeover', groupId, memberId: 'claude', turnId: begun.turnId, evidence }, { takeOverFrom: 'driver-token-0001' }).then(() => undefined, (e: unknown) => e);
    expect(refused).toMatchObject({ reason: 'turn_in_flight' });
    expect((await memberRecord(groupId)).session.phase).toBe('IN_TURN');
  });

  it('a repeat completes a turn whose driver died as not ended once its lease lapsed, not after the longest turn', async () => {
    const groupId = await openMember('driver-dead');
    const begun = await beginAsDeadDriver(groupId, 'dead-driver-1', 'dead-replica-token', 3_000);
    const t0 = Date.now();
    const r = await repeat(runner, groupId, 'dead-driver-1');
    const waited = Date.now() - t0;
    expect(r.begun.turnId).toBe(begun.turnId);
    expect(r.end.evidence).toMatchObject({ nativeTurnEnded: false });
    expect(r.end.completion).toMatchObject({ sessionKept: false, nextContextState: ContextState.LOST });
    // Not before the lease (3 s) and its skew margin (5 s) ran out; long before the 60 s a repeat waits.
    expect(waited).toBeGreaterThan(3_000);
    expect(waited).toBeLessThan(20_000);
    expect((await memberRecord(groupId)).session).toMatchObject({ phase: 'UNCONFIRMED' });
    expect((await memberRecord(groupId)).turnDriver).toBeUndefined();
  }, 60_000);

  it('a repeat waits while the lease holds and answers the driver\'s own end; the SDK sets no deadline of its own on RunTurn', async () => {
    const groupId = await openMember('driver-alive');
    const begun = await beginAsDeadDriver(groupId, 'alive-driver-1', 'alive-driver-token', 60_000);
    // The client's default deadline (10 s) is for short calls: a RunTurn call outlives it.
    const plain = client();
    try {
      const t0 = Date.now();
      const call = repeat(plain, groupId, 'alive-driver-1');
      await new Promise((r) => setTimeout(r, 12_000));
      expect((await memberRecord(groupId)).session.phase).toBe('IN_TURN');
      // The driver ends the turn (as RunTurn's drive does): the waiting repeat answers that end.
      const locator = '0b1c7e5d-0000-4000-8000-00000000abcd';
      await backend().completeTurn({
        idempotencyKey: 'alive-driver-1:complete', groupId, memberId: 'claude', turnId: begun.turnId, observedLocator: locator,
        evidence: { kind: 'result', nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: true, exitConfirmed: true, exitCode: 0 },
      });
      const r = await call;
      expect(Date.now() - t0).toBeGreaterThan(12_000);
      expect(r.begun.turnId).toBe(begun.turnId);
      expect(r.end.completion).toMatchObject({ sessionKept: true, savedLocator: locator });
      expect(r.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true });
    } catch (err) {
      if (err instanceof RunnerError) throw new Error(`the repeat failed: ${err.codeName} ${err.reason} ${err.message}`);
      throw err;
    } finally {
      plain.close();
    }
  }, 60_000);
});
