// Request-history regression with the PINNED Pi coding agent (R-P1, R-S1..R-S5, R-G3, R-G5):
// the real @mariozechner/pi-coding-agent 0.73.1 (Node.js) runs in member containers in
// `--mode json -p`, reaching the loopback fake Messages API through a custom provider; the runner
// side is the runner SDK (its Pi turn-end detector: `agent_end` + the last assistant stopReason,
// locator from the `session` header) over mTLS against the real control plane, NATS, agents and
// dockerd hosts. Checked on what the model API receives (user and assistant text, roles, order,
// duplicate counts):
//   1. NEW, then a follow-up that resumes the session (`--session <id>`) and sends the history once;
//   2. close immediately (clean stop, checkpoint), then resume on the same host (RESTORED) with the
//      whole history;
//   3. after a drain moves the writable layer to another host (the checkpoint finds and proves Pi's
//      session file by its layout), the resumed Pi there sends the same history under the same id;
//   4. a model API that keeps failing is a failed turn, never an empty success; the session is kept;
//   5. the control plane refuses a locator change at begin, and the saved one is intact;
//   6. a locator change at the END of an ended-failed turn (Pi, not resumed, opened a new session
//      and its calls failed) is flagged by the SDK detector and refused by the control plane
//      (`locator_mismatch`); the saved locator is intact and the next turn carries none of it.
//   7. a failed call Pi retries by itself and then succeeds is a successful turn (the detector waits
//      past the retried attempt's agent_end), and the next turn carries it once.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse, CompleteTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerError, completeTurnEvidence, createPiDetector, driveDetector, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';
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

interface RanTurn {
  readonly begun: BeginTurnResponse;
  readonly evidence: TurnEndEvidence;
  readonly exitCode: number;
  readonly requests: RecordedRequest[];
}

/**
 * Begin a turn, point Pi at the fake and run it, resuming the locator it was given (`resume: false`:
 * started without `--session`, as a driver that lost the locator would, so Pi opens a new session),
 * and detect the end with the detector expecting the given locator. Not completed.
 */
async function runTurn(marker: string, { resume = true }: { resume?: boolean } = {}): Promise<RanTurn> {
  const begun = await h.runner.beginTurn({ groupId, memberId: 'pi' });
  const before = h.api.requests.length;
  const rt = h.runtimeOf(begun.hostId);
  const setup = await rt.exec(begun.containerId, ['/bin/sh', '-c', 'mkdir -p /root/.pi/agent && printf "%s" "$1" > /root/.pi/agent/models.json', 'sh', piModelsJson(h.api.url)]);
  expect(setup.exitCode, setup.stderr).toBe(0);
  const args = ['--mode', 'json', '-p', '--provider', 'fake', '--model', 'fake-model', ...(resume && begun.locator !== '' ? ['--session', begun.locator] : []), `Please remember ${marker}.`];
  const run = await rt.exec(begun.containerId, [PI_PATH, ...args], { env: { HOME: '/root' }, timeoutMs: 120_000, maxOutputBytes: 8 * 1024 * 1024 });
  const { evidence } = await driveDetector(Readable.from([run.stdout]), createPiDetector(begun.locator !== '' ? { expectedLocator: begun.locator } : {}));
  return { begun, evidence, exitCode: run.exitCode, requests: h.api.requests.slice(before) };
}

function complete(t: RanTurn): Promise<CompleteTurnResponse> {
  return h.runner.completeTurn({ groupId, memberId: 'pi', turnId: t.begun.turnId, ...completeTurnEvidence(t.evidence, { cleanupFinished: true, exitConfirmed: true, exitCode: t.exitCode }) });
}

/** One turn as a runner drives Pi: begin, point Pi at the fake, run it (resuming the locator), detect the end, complete. */
async function turn(marker: string): Promise<RanTurn> {
  const t = await runTurn(marker);
  await complete(t);
  return t;
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

  it('close immediately, then resume: RESTORED with the whole history', async () => {
    const locator = (await h.runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    const stopped = await h.runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    expect(stopped.checkpointId).not.toBe('');
    const t3 = await turn('MARK-THREE');
    expect(t3.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-a', locator });
    expect(t3.evidence).toMatchObject({ succeeded: true, observedLocator: locator, assistantText: 'ack MARK-THREE' });
    expect(history(promptRequest(t3.requests, 'MARK-THREE'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
  });

  it('after a drain moves the writable layer to another host, the resumed Pi there sends the same history under the same session id', async () => {
    await h.expectSameSessionAfterDrain(groupId, turn, (t) => t.evidence.observedLocator, (t) => history(promptRequest(t.requests, 'MARK-FOUR')));
  });

  it('a model API that keeps failing is a failed turn (never an empty success), and the session is kept', async () => {
    h.api.failNext(20, 500);
    const t5 = await turn('MARK-FIVE');
    h.api.failNext(0, 500);
    expect(t5.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false });
    expect(t5.evidence.error ?? '').not.toBe('');
    const state = await h.runner.getGroupState({ groupId });
    expect(state.group?.members[0]?.savedLocator).toBe(t5.begun.locator);
  });

  it('refuses a locator change at begin and keeps the saved one', async () => {
    await h.expectLocatorChangeRefusedAtBegin(groupId, 'pi');
  });

  it('refuses a locator change at the end of an ended-failed turn, keeps the saved one, and the next turn carries none of it', async () => {
    const before = (await h.runner.getGroupState({ groupId })).group?.members[0];
    const saved = before?.savedLocator ?? '';
    // Observed (0.73.1, `--mode json`): without --session Pi opens a new session (a new id in the
    // `session` header). Each attempt is 3 HTTP calls (its Anthropic client retries twice), then
    // `agent_end` with stopReason `error`, then `auto_retry_start` (3 more attempts, 2 s/4 s/8 s
    // apart) and `auto_retry_end` success false: 12 calls, ~20 s. The detector ends the turn at the
    // first `agent_end`: ended, failed.
    h.api.failNext(1_000, 500);
    const t6 = await runTurn('MARK-SIX', { resume: false }).finally(() => h.api.failNext(0, 500));
    expect(t6.begun.locator).toBe(saved);
    expect(t6.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'agent_end' });
    expect(t6.evidence.observedLocator).toMatch(/^[0-9a-f-]{36}$/);
    expect(t6.evidence.observedLocator).not.toBe(saved);
    // The runner side flags it first: the SDK detector keeps the expected id and names the other one.
    expect(t6.evidence.locatorConflict).toEqual({ kept: saved, other: t6.evidence.observedLocator, source: 'expected' });
    expect(history(promptRequest(t6.requests, 'MARK-SIX'))).toEqual(['user:MARK-SIX']);
    const refused = await complete(t6).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(RunnerError);
    expect((refused as RunnerError).reason).toBe('locator_mismatch');
    expect((await h.runner.getGroupState({ groupId })).group?.members[0]).toMatchObject({ savedLocator: saved, turnInFlightId: '', completedTurns: before?.completedTurns });

    const t7 = await turn('MARK-SEVEN');
    expect(t7.begun).toMatchObject({ contextState: ContextState.RESTORED, locator: saved });
    expect(t7.evidence).toMatchObject({ succeeded: true, observedLocator: saved, assistantText: 'ack MARK-SEVEN' });
    const sent = history(promptRequest(t7.requests, 'MARK-SEVEN'));
    // Every message once, in order, nothing of MARK-SIX. Observed: the failed MARK-FIVE turn left its
    // user message in the saved session, with no answer, so two user messages follow each other.
    expect(sent).toEqual([
      'user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE', 'assistant:MARK-THREE',
      'user:MARK-FOUR', 'assistant:MARK-FOUR', 'user:MARK-FIVE', 'user:MARK-SEVEN',
    ]);
  });

  it('a failed call Pi retries by itself, whose retry succeeds, is a successful turn, and the next turn carries it once', async () => {
    // Observed (0.73.1): the first attempt's 3 calls fail, Pi reports `agent_end` (stopReason
    // `error`), THEN `auto_retry_start`, runs the turn again and ends with `agent_end` `stop`. The
    // detector waits past the first agent_end (it is one Pi retries) and reads the retry's.
    h.api.failNext(3, 500);
    const t8 = await turn('MARK-EIGHT').finally(() => h.api.failNext(0, 500));
    expect(t8.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'agent_end', assistantText: 'ack MARK-EIGHT' });
    expect(t8.requests.length).toBeGreaterThan(3);
    const t9 = await turn('MARK-NINE');
    const sent = history(promptRequest(t9.requests, 'MARK-NINE'));
    expect(sent.slice(-4)).toEqual(['assistant:MARK-SEVEN', 'user:MARK-EIGHT', 'assistant:MARK-EIGHT', 'user:MARK-NINE']);
    expect(sent.filter((m) => m === 'user:MARK-EIGHT')).toHaveLength(1);
  });
});
