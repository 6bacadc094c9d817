// Request-history regression with the PINNED Pi coding agent (SPEC §7.1, R-S1..R-S5, R-G3, R-G5):
// the real @mariozechner/pi-coding-agent 0.73.1 (Node.js) runs in member containers in
// `--mode json -p`, reaching the loopback fake Messages API through a custom provider; the runner
// side is the runner SDK (its Pi turn-end detector: `agent_end` + the last assistant stopReason,
// locator from the `session` header) over mTLS against the real control plane, NATS, agents and
// dockerd hosts. Checked on what the model API receives: a follow-up resumes the session
// (`--session <id>`) and sends the history once; after a drain moves the writable layer to another
// host (the checkpoint finds and proves Pi's session file by its layout), the resumed Pi there
// sends the same history under the same session id; a failing model API is a failed turn, never
// an empty success.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { completeTurnEvidence, createPiDetector, driveDetector, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';
import { history, promptRequest, type RecordedRequest } from '../../support/fake-model-api.ts';
import { PI_PATH, PI_VERSION, piImageContent, piModelsJson } from '../../support/pi-cli.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';
const launcherDir = mkdtempSync(join(tmpdir(), 'sf-pi-launcher-'));

beforeAll(async () => {
  const content = piImageContent(launcherDir);
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: content.files, extraTrees: content.trees, tagSuffix: `pi-${PI_VERSION}` });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
  rmSync(launcherDir, { recursive: true, force: true });
});

/** One turn as a runner drives Pi: begin, point Pi at the fake, run it (resuming the locator), detect the end, complete. */
async function turn(marker: string): Promise<{ begun: BeginTurnResponse; evidence: TurnEndEvidence; requests: RecordedRequest[] }> {
  const begun = await h.runner.beginTurn({ groupId, memberId: 'pi' });
  const before = h.api.requests.length;
  const rt = h.runtimeOf(begun.hostId);
  const setup = await rt.exec(begun.containerId, ['/bin/sh', '-c', 'mkdir -p /root/.pi/agent && printf "%s" "$1" > /root/.pi/agent/models.json', 'sh', piModelsJson(h.api.url)]);
  expect(setup.exitCode, setup.stderr).toBe(0);
  const args = ['--mode', 'json', '-p', '--provider', 'fake', '--model', 'fake-model', ...(begun.locator !== '' ? ['--session', begun.locator] : []), `Please remember ${marker}.`];
  const run = await rt.exec(begun.containerId, [PI_PATH, ...args], { env: { HOME: '/root' }, timeoutMs: 120_000, maxOutputBytes: 8 * 1024 * 1024 });
  const { evidence } = await driveDetector(Readable.from([run.stdout]), createPiDetector(begun.locator !== '' ? { expectedLocator: begun.locator } : {}));
  await h.runner.completeTurn({ groupId, memberId: 'pi', turnId: begun.turnId, ...completeTurnEvidence(evidence, { cleanupFinished: true, exitConfirmed: true, exitCode: run.exitCode }) });
  return { begun, evidence, requests: h.api.requests.slice(before) };
}

describe(`pinned Pi ${PI_VERSION} against a loopback model API`, () => {
  it('NEW, then a resumed follow-up that sends the history once', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'history-pi', members: [{ memberId: 'pi', cli: 'pi' }] });
    groupId = opened.group?.groupId ?? '';
    const t1 = await turn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    expect(t1.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'agent_end', assistantText: 'ack MARK-ONE' });
    expect(t1.evidence.observedLocator).toMatch(/^[0-9a-f-]{36}$/);
    expect(history(promptRequest(t1.requests, 'MARK-ONE'))).toEqual(['user:MARK-ONE']);
    const t2 = await turn('MARK-TWO');
    expect(t2.begun.locator).toBe(t1.evidence.observedLocator);
    expect(t2.evidence.observedLocator).toBe(t1.evidence.observedLocator);
    expect(history(promptRequest(t2.requests, 'MARK-TWO'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO']);
  });

  it('after a drain moves the writable layer to another host, the resumed Pi there sends the same history under the same session id', async () => {
    const locator = (await h.runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    await h.drainToHostB(groupId);
    const t3 = await turn('MARK-THREE');
    expect(t3.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
    expect(t3.evidence.observedLocator).toBe(locator);
    expect(history(promptRequest(t3.requests, 'MARK-THREE'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
  });

  it('a model API that keeps failing is a failed turn (never an empty success), and the session is kept', async () => {
    h.api.failNext(20, 500);
    const t4 = await turn('MARK-FOUR');
    h.api.failNext(0, 500);
    expect(t4.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false });
    expect(t4.evidence.error ?? '').not.toBe('');
    const state = await h.runner.getGroupState({ groupId });
    expect(state.group?.members[0]?.savedLocator).toBe(t4.begun.locator);
  });
});
