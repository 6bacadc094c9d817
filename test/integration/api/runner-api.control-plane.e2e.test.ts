// END TO END through gRPC (R-I1, R-S1..R-S3, R-G5, R-G6): the runner SDK client over mTLS → the API
// server → the real control plane's RunnerBackend → real NATS, real host agents and real dockerd
// hosts (fleet-harness.ts of the control-plane tests; nothing mocked). Conversation 1: NEW, LIVE,
// a locator mismatch refused at begin, RESTORED after stop/start, a mismatch refused at end with the
// saved locator intact. Conversation 2: RESTORED on another host after a drain migration, then LOST
// after that host dies with a turn running.
import * as grpc from '@grpc/grpc-js';
import { rm } from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { ContextState, GroupState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { TurnEndEvidence } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';
import { successEvidence } from '../../support/evidence.ts';

const SUCCESS: TurnEndEvidence = successEvidence();

let fleet: Fleet;
let plane: ControlPlane;
let pki: TestPki;
let server: ApiServer;
let runner: RunnerClient;
let groupId = '';

async function refusal(p: Promise<unknown>): Promise<RunnerError> {
  const e = await p.then(() => undefined, (err: unknown) => err);
  expect(e).toBeInstanceOf(RunnerError);
  return e as RunnerError;
}

beforeAll(async () => {
  [fleet, pki] = await Promise.all([startFleet(2), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({ runner: plane.runner, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 90_000 });
});

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
});

describe('runner API end to end against the control plane', () => {
  it('reports NEW, LIVE, RESTORED after stop/start, and refuses locator mismatches at begin and end keeping the saved one', async () => {
    const opened = await runner.openGroup({ conversationId: 'e2e-conv-1', members: [{ memberId: 'm1', cli: 'claude-code' }] });
    expect(opened.created).toBe(true);
    groupId = opened.group?.groupId ?? '';

    const t1 = await runner.beginTurn({ groupId, memberId: 'm1' });
    expect(t1.contextState).toBe(ContextState.NEW);
    expect(t1.hostId).toBe('host-a');
    // The e2e runner acts as the CLI too: it writes the native session file the checkpoint must find.
    await fleet.writeSession(t1.hostId, t1.containerId, 'sess-e2e-1');
    const c1 = await runner.completeTurn({ groupId, memberId: 'm1', turnId: t1.turnId, observedLocator: 'sess-e2e-1', evidence: SUCCESS });
    expect(c1).toMatchObject({ sessionKept: true, savedLocator: 'sess-e2e-1' });

    const t2 = await runner.beginTurn({ groupId, memberId: 'm1' });
    expect(t2).toMatchObject({ contextState: ContextState.LIVE, locator: 'sess-e2e-1' });
    await runner.completeTurn({ groupId, memberId: 'm1', turnId: t2.turnId, observedLocator: 'sess-e2e-1', evidence: SUCCESS });

    const atBegin = await refusal(runner.beginTurn({ groupId, memberId: 'm1', locator: 'sess-other' }));
    expect({ code: atBegin.codeName, reason: atBegin.reason }).toEqual({ code: 'FAILED_PRECONDITION', reason: 'locator_mismatch' });

    const stopped = await runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);

    const t3 = await runner.beginTurn({ groupId, memberId: 'm1' });
    expect(t3).toMatchObject({ contextState: ContextState.RESTORED, locator: 'sess-e2e-1' });
    const atEnd = await refusal(runner.completeTurn({ groupId, memberId: 'm1', turnId: t3.turnId, observedLocator: 'sess-other', evidence: SUCCESS }));
    expect({ code: atEnd.codeName, reason: atEnd.reason }).toEqual({ code: 'FAILED_PRECONDITION', reason: 'locator_mismatch' });
    const state = await runner.getGroupState({ groupId });
    expect(state.group?.members[0]?.savedLocator).toBe('sess-e2e-1');
  });

  it('reports RESTORED on the new host after a drain migrates the group', async () => {
    // A second conversation whose last turn ended normally (the first one ended on a refused turn).
    const opened = await runner.openGroup({ conversationId: 'e2e-conv-2', members: [{ memberId: 'm1', cli: 'claude-code' }] });
    groupId = opened.group?.groupId ?? '';
    const t1 = await runner.beginTurn({ groupId, memberId: 'm1' });
    expect(t1).toMatchObject({ contextState: ContextState.NEW, hostId: 'host-a' });
    await fleet.writeSession(t1.hostId, t1.containerId, 'sess-e2e-1');
    await runner.completeTurn({ groupId, memberId: 'm1', turnId: t1.turnId, observedLocator: 'sess-e2e-1', evidence: SUCCESS });
    await fleet.startAgentOn('host-b', 1);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    expect(await plane.drainHost('host-a')).toBe(true);
    await fleet.waitFor('group moved to host-b', async () => {
      const g = await fleet.group(groupId);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? true : undefined;
    }, 120_000);
    const t = await runner.beginTurn({ groupId, memberId: 'm1' });
    expect(t).toMatchObject({ contextState: ContextState.RESTORED, locator: 'sess-e2e-1', hostId: 'host-b' });
    expect(t.placementGeneration).toBeGreaterThan(1);
    await runner.completeTurn({ groupId, memberId: 'm1', turnId: t.turnId, observedLocator: 'sess-e2e-1', evidence: SUCCESS });
  });

  it('reports LOST (refused) after the host dies with a turn running', async () => {
    await runner.beginTurn({ groupId, memberId: 'm1' });
    await fleet.stopAgent('host-b');
    await fleet.hosts[1]?.stop();
    await rm(fleet.hosts[1]?.dataRoot ?? '/nonexistent', { recursive: true, force: true });
    await fleet.waitFor('group LOST', async () => ((await fleet.group(groupId)).lifecycle.state === 'LOST' ? true : undefined), 120_000);
    const state = await runner.getGroupState({ groupId });
    expect(state.group?.state).toBe(GroupState.LOST);
    expect(state.group?.lossReason).toBe('host_lost_running');
    const lost = await refusal(runner.beginTurn({ groupId, memberId: 'm1' }));
    expect(lost.code).toBe(grpc.status.FAILED_PRECONDITION);
    expect(lost.reason).toBe('context_lost');
  });
});
