// Request-history regression with the PINNED native CLI (SPEC §7.1, R-S1..R-S6, R-G3, R-G5): the
// real Claude Code 2.1.220 binary runs in member containers and talks to a loopback fake of the
// Messages API (no credentials, no cost); the runner side is the runner SDK (its Claude Code
// turn-end detector and gRPC client over mTLS) against the real control plane, NATS, host agents
// and dockerd hosts. What is compared is what the model API RECEIVES: user and assistant text,
// roles, order and duplicate counts, turn after turn:
//   1. a new conversation (NEW), a follow-up in the same container (history sent once);
//   2. close immediately (clean stop, checkpoint), then resume on the same host (RESTORED);
//   3. the host is drained: the checkpoint moves the writable layer to another host, and the resumed
//      CLI there sends the whole history, with the same session id (RESTORED);
//   4. a failed model call (HTTP 500, the CLI retries internally and reports `system/api_retry`):
//      the detector ends the turn (R-S6) and the session id is kept; the next turn's request holds
//      the history once, no duplicate of the failed prompt's retries;
//   5. the control plane refuses a locator change at begin, and the saved one is intact.
// Member containers use the host network (loopback only) so the CLI reaches the fake.
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiServer } from '../../../src/api/runner-server.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { DockerRuntime } from '../../../src/docker/runtime.ts';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerClient, RunnerError, completeTurnEvidence, createClaudeCodeDetector, driveDetector, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';
import { createTestPki, type TestPki } from '../../support/certs.ts';
import { CLAUDE_CODE_VERSION, CLAUDE_PATH, claudeCodeEnv, claudeCodeImageFiles } from '../../support/claude-code.ts';
import { ackMarker, history, promptRequest, startFakeModelApi, type FakeModelApi, type RecordedRequest } from '../../support/fake-model-api.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let fleet: Fleet;
let plane: ControlPlane;
let pki: TestPki;
let server: ApiServer;
let runner: RunnerClient;
let api: FakeModelApi;
let groupId = '';

const AGENT = { memberNetworkMode: 'host' };

beforeAll(async () => {
  // The model answers every prompt with a fixed acknowledgement of its marker word.
  api = await startFakeModelApi(ackMarker);
  [fleet, pki] = await Promise.all([startFleet(2, {}, { image: { bridgeVersion: 4, extraFiles: claudeCodeImageFiles(), tagSuffix: `claude-code-${CLAUDE_CODE_VERSION}` } }), createTestPki()]);
  plane = await fleet.startPlane();
  await fleet.startAgentOn('host-a', 0, AGENT);
  await fleet.waitFor('host-a READY', async () => ((await fleet.host('host-a')).lifecycle.state === 'READY' ? true : undefined));
  server = await ApiServer.start({ runner: plane.runner, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } } });
  runner = new RunnerClient({ address: `127.0.0.1:${server.port}`, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key }, deadlineMs: 120_000 });
}, 300_000);

afterAll(async () => {
  runner?.close();
  await server?.shutdown(1_000);
  await fleet?.cleanup();
  await pki?.cleanup();
  await api?.close();
});

/** One turn as a runner drives it: begin, run the CLI (resuming the locator it was given), detect the end, complete. */
async function turn(marker: string): Promise<{ begun: BeginTurnResponse; evidence: TurnEndEvidence; requests: RecordedRequest[] }> {
  const begun = await runner.beginTurn({ groupId, memberId: 'claude' });
  const before = api.requests.length;
  const host = fleet.hosts.find((h) => h.name === begun.hostId)!;
  const args = ['-p', `Please remember ${marker}.`, '--output-format', 'stream-json', '--verbose', ...(begun.locator !== '' ? ['--resume', begun.locator] : [])];
  const run = await new DockerRuntime(host.docker).exec(begun.containerId, [CLAUDE_PATH, ...args], { env: claudeCodeEnv(api.url), timeoutMs: 120_000, maxOutputBytes: 8 * 1024 * 1024 });
  const detector = createClaudeCodeDetector(begun.locator !== '' ? { expectedLocator: begun.locator } : {});
  const { evidence } = await driveDetector(Readable.from([run.stdout]), detector);
  await runner.completeTurn({ groupId, memberId: 'claude', turnId: begun.turnId, ...completeTurnEvidence(evidence, { cleanupFinished: true, exitConfirmed: true, exitCode: run.exitCode }) });
  return { begun, evidence, requests: api.requests.slice(before) };
}

describe(`pinned Claude Code ${CLAUDE_CODE_VERSION} against a loopback model API`, () => {
  it('NEW, then a follow-up that sends the history once', async () => {
    const opened = await runner.openGroup({ conversationId: 'history-claude', members: [{ memberId: 'claude', cli: 'claude-code' }] });
    groupId = opened.group?.groupId ?? '';
    const t1 = await turn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    expect(t1.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'result' });
    expect(t1.evidence.observedLocator).toMatch(/^[0-9a-f-]{36}$/);
    expect(t1.evidence.assistantText).toBe('ack MARK-ONE');
    expect(history(promptRequest(t1.requests, 'MARK-ONE'))).toEqual(['user:MARK-ONE']);

    const t2 = await turn('MARK-TWO');
    expect(t2.begun.locator).toBe(t1.evidence.observedLocator);
    expect(t2.evidence.observedLocator).toBe(t1.evidence.observedLocator);
    expect(history(promptRequest(t2.requests, 'MARK-TWO'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO']);
  });

  it('close immediately, then resume: RESTORED with the whole history', async () => {
    const stopped = await runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    expect(stopped.checkpointId).not.toBe('');
    const t3 = await turn('MARK-THREE');
    expect(t3.begun.contextState).toBe(ContextState.RESTORED);
    expect(history(promptRequest(t3.requests, 'MARK-THREE'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
  });

  it('after a drain moves the writable layer to another host, the resumed CLI there sends the same history under the same session id', async () => {
    const locator = (await runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    await runner.stopGroup({ groupId });
    await fleet.startAgentOn('host-b', 1, AGENT);
    await fleet.waitFor('host-b READY', async () => ((await fleet.host('host-b')).lifecycle.state === 'READY' ? true : undefined));
    expect(await plane.drainHost('host-a')).toBe(true);
    await fleet.waitFor('group moved to host-b', async () => {
      const g = await fleet.group(groupId);
      if (g.lifecycle.state === 'LOST') throw new Error(`group LOST: ${g.lifecycle.lostReason}`);
      return g.lifecycle.state === 'STOPPED' && g.lifecycle.hostId === 'host-b' && g.evacuation === undefined ? true : undefined;
    }, 120_000);
    const t4 = await turn('MARK-FOUR');
    expect(t4.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
    expect(t4.evidence.observedLocator).toBe(locator);
    expect(history(promptRequest(t4.requests, 'MARK-FOUR'))).toEqual([
      'user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE', 'assistant:MARK-THREE', 'user:MARK-FOUR',
    ]);
  });

  it('a failed model call the CLI retries ends the turn at api_retry, keeps the session, and the next turn carries no duplicates', async () => {
    api.failNext(1, 500);
    const t5 = await turn('MARK-FIVE');
    expect(t5.evidence).toMatchObject({ nativeTurnEnded: true, endKind: 'api_retry', processWillExit: true });
    const locator = t5.begun.locator;
    expect(t5.evidence.observedLocator).toBe(locator);
    const t6 = await turn('MARK-SIX');
    expect(t6.begun.locator).toBe(locator);
    const sent = history(promptRequest(t6.requests, 'MARK-SIX'));
    expect(sent.slice(-2)).toEqual(['assistant:MARK-FIVE', 'user:MARK-SIX']);
    for (const m of ['MARK-ONE', 'MARK-FOUR', 'MARK-FIVE']) expect(sent.filter((s) => s === `user:${m}`)).toHaveLength(1);
  });

  it('refuses a locator change at begin and keeps the saved one', async () => {
    const saved = (await runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    const refused = await runner.beginTurn({ groupId, memberId: 'claude', locator: '00000000-0000-4000-8000-000000000000' }).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(RunnerError);
    expect((refused as RunnerError).reason).toBe('locator_mismatch');
    expect((await runner.getGroupState({ groupId })).group?.members[0]?.savedLocator).toBe(saved);
  });
});
