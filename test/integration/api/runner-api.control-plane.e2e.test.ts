// END TO END through gRPC (R-I1, R-S1..R-S3, R-G5, R-G6): the runner SDK client over mTLS → the API
// server → the real control plane's RunnerBackend → real NATS, real host agents and real dockerd
// hosts (fleet-harness.ts of the control-plane tests; nothing mocked). Conversation 1: NEW, LIVE,
// a locator mismatch refused at begin, RESTORED after stop/start, a mismatch refused at end with the
// saved locator intact. R-S6: after a Claude api_retry whose process exit the runner could not
// confirm, the next turn is RESTORED on a restarted container and the lingering process is gone; with
// the exit confirmed, nothing is restarted. Conversation 2: RESTORED on another host after a drain migration, then LOST
// after that host dies with a turn running.
import * as grpc from '@grpc/grpc-js';
import { rm } from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { ContextState, GroupState, StopOutcome, TurnEndKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
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

/** The member container's start time and whether a `sleep 7777` (the stand-in for a lingering CLI) runs in it. */
async function container(containerId: string): Promise<{ startedAt: string; lingering: boolean }> {
  const c = fleet.hosts[0]!.docker.getContainer(containerId);
  const info = await c.inspect();
  const top = info.State.Running ? await c.top({ ps_args: '-o pid,args' }) : { Processes: [] };
  return { startedAt: info.State.StartedAt, lingering: (top.Processes ?? []).some((p: string[]) => p.join(' ').includes('sleep 7777')) };
}

/** Start the stand-in CLI process the runner lost track of, detached, in the member container. */
async function startLingeringCli(containerId: string): Promise<void> {
  const exec = await fleet.hosts[0]!.docker.getContainer(containerId).exec({ Cmd: ['sleep', '7777'] });
  await exec.start({ Detach: true });
  await fleet.waitFor('stand-in CLI running', async () => ((await container(containerId)).lingering ? true : undefined), 10_000);
}

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

  it('R-S6: an api_retry turn whose exit is not confirmed gets its slot reclaimed (container restarted) before the next start; a confirmed exit does not', async () => {
    const opened = await runner.openGroup({ conversationId: 'e2e-conv-retry', members: [{ memberId: 'm1', cli: 'claude-code' }] });
    const gid = opened.group?.groupId ?? '';
    const t1 = await runner.beginTurn({ groupId: gid, memberId: 'm1' });
    await fleet.writeSession(t1.hostId, t1.containerId, 'sess-retry-1');
    await runner.completeTurn({ groupId: gid, memberId: 'm1', turnId: t1.turnId, observedLocator: 'sess-retry-1', evidence: SUCCESS });

    // Turn 2 hits the api_retry defect: the driver ends the turn and lets the CLI exit, but cannot see it exit.
    const t2 = await runner.beginTurn({ groupId: gid, memberId: 'm1' });
    expect(t2).toMatchObject({ contextState: ContextState.LIVE, slotReclaimed: false });
    await startLingeringCli(t2.containerId);
    const before = await container(t2.containerId);
    const retry = successEvidence({ kind: TurnEndKind.API_RETRY, succeeded: false, processExited: true, exitConfirmed: false });
    const c2 = await runner.completeTurn({ groupId: gid, memberId: 'm1', turnId: t2.turnId, observedLocator: 'sess-retry-1', evidence: retry });
    expect(c2).toMatchObject({ sessionKept: true, savedLocator: 'sess-retry-1', nextContextState: ContextState.RESTORED });

    const t3 = await runner.beginTurn({ groupId: gid, memberId: 'm1' });
    expect(t3).toMatchObject({ contextState: ContextState.RESTORED, locator: 'sess-retry-1', slotReclaimed: true, containerId: t2.containerId });
    const after = await container(t3.containerId);
    expect(after.lingering).toBe(false);
    expect(after.startedAt).not.toBe(before.startedAt);
    const { events } = await fleet.store.events.read({ subjectKind: 'group', subjectId: gid, limit: 100 });
    expect(events.map((e) => e.event.type)).toContain('member_slot_reclaimed');
    // The restarted container runs the new turn, which may be LIVE next time: the slot is clean.
    await runner.completeTurn({ groupId: gid, memberId: 'm1', turnId: t3.turnId, observedLocator: 'sess-retry-1', evidence: SUCCESS });
    const t4 = await runner.beginTurn({ groupId: gid, memberId: 'm1' });
    expect(t4).toMatchObject({ contextState: ContextState.LIVE, slotReclaimed: false });

    // Same defect, exit confirmed by the runner: RESTORED without touching the container.
    await startLingeringCli(t4.containerId); // not a CLI of this session any more once its exit was seen
    const confirmed = successEvidence({ kind: TurnEndKind.API_RETRY, succeeded: false, processExited: true, exitConfirmed: true, exitCode: 0 });
    await runner.completeTurn({ groupId: gid, memberId: 'm1', turnId: t4.turnId, observedLocator: 'sess-retry-1', evidence: confirmed });
    const untouched = await container(t4.containerId);
    const t5 = await runner.beginTurn({ groupId: gid, memberId: 'm1' });
    expect(t5).toMatchObject({ contextState: ContextState.RESTORED, slotReclaimed: false });
    expect(await container(t5.containerId)).toEqual(untouched);
    await runner.completeTurn({ groupId: gid, memberId: 'm1', turnId: t5.turnId, observedLocator: 'sess-retry-1', evidence: SUCCESS });
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
