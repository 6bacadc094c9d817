// Request-history regression with the PINNED native CLI (R-P1, R-S1..R-S6, R-G3, R-G5): the
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
//   5. a follow-up sent while a turn is still running (its model call held open) is refused
//      (`turn_in_flight`, R-S8); sent after the turn ends it reaches the model once, after it;
//   6. the control plane refuses a locator change at begin, and the saved one is intact;
//   7. a locator change at the END of an ended-failed turn (the CLI, not resumed, opened a new
//      session and its call failed: `system/api_retry`) is flagged by the runner SDK's detector and
//      refused by the control plane (`locator_mismatch`); the saved locator is intact and the next
//      resumed turn's request carries none of the refused turn.
// Member containers use the host network (loopback only) so the CLI reaches the fake.
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse, CompleteTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerError, completeTurnEvidence, createClaudeCodeDetector, driveDetector, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';
import { CLAUDE_CODE_VERSION, CLAUDE_PATH, claudeCodeEnv, claudeCodeImageFiles } from '../../support/claude-code.ts';
import { history, promptRequest, type RecordedRequest } from '../../support/fake-model-api.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: claudeCodeImageFiles(), tagSuffix: `claude-code-${CLAUDE_CODE_VERSION}` });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

interface RanTurn {
  readonly begun: BeginTurnResponse;
  readonly evidence: TurnEndEvidence;
  readonly exitCode: number;
  readonly requests: RecordedRequest[];
}

/**
 * Begin a turn and run the CLI, resuming the locator it was given (`resume: false`: started without
 * `--resume`, as a driver that lost the locator would, so the CLI opens a new session), and detect
 * the end with the detector expecting the given locator. Not completed.
 */
async function runTurn(marker: string, { resume = true }: { resume?: boolean } = {}): Promise<RanTurn> {
  const begun = await h.runner.beginTurn({ groupId, memberId: 'claude' });
  const before = h.api.requests.length;
  const args = ['-p', `Please remember ${marker}.`, '--output-format', 'stream-json', '--verbose', ...(resume && begun.locator !== '' ? ['--resume', begun.locator] : [])];
  const run = await h.runtimeOf(begun.hostId).exec(begun.containerId, [CLAUDE_PATH, ...args], { env: claudeCodeEnv(h.api.url), timeoutMs: 120_000, maxOutputBytes: 8 * 1024 * 1024 });
  const detector = createClaudeCodeDetector(begun.locator !== '' ? { expectedLocator: begun.locator } : {});
  const { evidence } = await driveDetector(Readable.from([run.stdout]), detector);
  return { begun, evidence, exitCode: run.exitCode, requests: h.api.requests.slice(before) };
}

function complete(t: RanTurn): Promise<CompleteTurnResponse> {
  return h.runner.completeTurn({ groupId, memberId: 'claude', turnId: t.begun.turnId, ...completeTurnEvidence(t.evidence, { cleanupFinished: true, exitConfirmed: true, exitCode: t.exitCode }) });
}

/** One turn as a runner drives it: begin, run the CLI (resuming the locator it was given), detect the end, complete. */
async function turn(marker: string): Promise<RanTurn> {
  const t = await runTurn(marker);
  await complete(t);
  return t;
}

describe(`pinned Claude Code ${CLAUDE_CODE_VERSION} against a loopback model API`, () => {
  it('NEW, then a follow-up that sends the history once', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'history-claude', members: [{ memberId: 'claude', cli: 'claude-code' }] });
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
    const stopped = await h.runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    expect(stopped.checkpointId).not.toBe('');
    const t3 = await turn('MARK-THREE');
    expect(t3.begun.contextState).toBe(ContextState.RESTORED);
    expect(history(promptRequest(t3.requests, 'MARK-THREE'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
  });

  it('after a drain moves the writable layer to another host, the resumed CLI there sends the same history under the same session id', async () => {
    await h.expectSameSessionAfterDrain(groupId, turn, (t) => t.evidence.observedLocator, (t) => history(promptRequest(t.requests, 'MARK-FOUR')));
  });

  it('a failed model call the CLI retries ends the turn at api_retry, keeps the session, and the next turn carries no duplicates', async () => {
    h.api.failNext(1, 500);
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

  it('a follow-up while a turn is running is refused until the turn ends, then sent once after it', async () => {
    const release = h.api.holdRequestsWith('MARK-SEVEN');
    const running = turn('MARK-SEVEN');
    running.catch(() => undefined); // awaited below
    try {
      const deadline = Date.now() + 60_000;
      while (!h.api.requests.some((r) => history(r).includes('user:MARK-SEVEN'))) {
        if (Date.now() > deadline) throw new Error('the CLI never called the model for MARK-SEVEN');
        await new Promise((r) => setTimeout(r, 100));
      }
      const followUp = await h.runner.beginTurn({ groupId, memberId: 'claude' }).then(() => undefined, (e: unknown) => e);
      expect(followUp).toBeInstanceOf(RunnerError);
      expect((followUp as RunnerError).reason).toBe('turn_in_flight');
    } finally {
      release();
    }
    const t7 = await running;
    expect(t7.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, assistantText: 'ack MARK-SEVEN' });
    const t8 = await turn('MARK-EIGHT');
    expect(t8.begun.contextState).toBe(ContextState.RESTORED); // exec per turn: each turn is a new process
    const sent = history(promptRequest(t8.requests, 'MARK-EIGHT'));
    expect(sent.slice(-3)).toEqual(['user:MARK-SEVEN', 'assistant:MARK-SEVEN', 'user:MARK-EIGHT']);
    for (const m of ['MARK-SIX', 'MARK-SEVEN']) expect(sent.filter((x) => x === `user:${m}`)).toHaveLength(1);
  });

  it('refuses a locator change at begin and keeps the saved one', async () => {
    await h.expectLocatorChangeRefusedAtBegin(groupId, 'claude');
  });

  it('refuses a locator change at the end of an ended-failed turn, keeps the saved one, and the next turn carries none of it', async () => {
    const before = (await h.runner.getGroupState({ groupId })).group?.members[0];
    const saved = before?.savedLocator ?? '';
    // Observed (2.1.220): started without --resume, the CLI opens a new session (a new id in
    // `system/init`); the 500 yields `system/api_retry` (attempt 1), then its own retry succeeds in
    // that new session. The detector ends the turn at api_retry: ended, failed.
    h.api.failNext(1, 500);
    const t9 = await runTurn('MARK-NINE', { resume: false });
    expect(t9.begun.locator).toBe(saved);
    expect(t9.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'api_retry' });
    expect(t9.evidence.observedLocator).toMatch(/^[0-9a-f-]{36}$/);
    expect(t9.evidence.observedLocator).not.toBe(saved);
    // The runner side flags it first: the SDK detector keeps the expected id and names the other one.
    expect(t9.evidence.locatorConflict).toEqual({ kept: saved, other: t9.evidence.observedLocator, source: 'expected' });
    expect(history(promptRequest(t9.requests, 'MARK-NINE'))).toEqual(['user:MARK-NINE']);
    const refused = await complete(t9).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(RunnerError);
    expect((refused as RunnerError).reason).toBe('locator_mismatch');
    const after = (await h.runner.getGroupState({ groupId })).group?.members[0];
    expect(after).toMatchObject({ savedLocator: saved, turnInFlightId: '', completedTurns: before?.completedTurns });

    const t10 = await turn('MARK-TEN');
    expect(t10.begun).toMatchObject({ contextState: ContextState.RESTORED, locator: saved });
    expect(t10.evidence).toMatchObject({ succeeded: true, observedLocator: saved, assistantText: 'ack MARK-TEN' });
    const sent = history(promptRequest(t10.requests, 'MARK-TEN'));
    expect(sent.slice(-3)).toEqual(['user:MARK-EIGHT', 'assistant:MARK-EIGHT', 'user:MARK-TEN']);
    expect(sent.filter((x) => x.includes('MARK-NINE'))).toEqual([]);
    for (const m of ['MARK-ONE', 'MARK-FIVE', 'MARK-EIGHT']) expect(sent.filter((x) => x === `user:${m}`)).toHaveLength(1);
  });
});
