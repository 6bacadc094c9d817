// Request-history regression with the PINNED Claude Code 2.1.220 (R-P1, R-S1..R-S6, R-G3, R-G5)
// through the fleet's own turn API: the runner holds only the gRPC address and its certificate and
// calls RunTurn; the fleet runs the real binary in the member container (kept between turns as the
// member's turn process, R-S1 LIVE), reads the end from Claude's own events and completes the turn.
// The CLI talks to a loopback fake of the Messages API (no credentials, no cost). Every request the
// model API received is checked in full by the history checker (system prompt, the date reminder,
// the agent list, every user and assistant message, in order, each once):
//   1. NEW, then LIVE on the kept process;
//   2. a follow-up while Claude is still running (its model call held): a second RunTurn is refused
//      `turn_in_flight` (R-S8); sent after the end, once, LIVE;
//   3. close immediately (clean stop, the checkpoint names the session file), then resume at once:
//      RESTORED, a new process, the whole history;
//   4. a failed model call Claude does not retry (HTTP 400): the turn ends on Claude's `result` with
//      is_error, the session kept; the runner retries the prompt;
//   5. a failed call Claude retries by itself (HTTP 500 once, `system/api_retry`): the turn ends there
//      and the process is let exit (R-S6); the natively resumed next turn carries every message once;
//   6. stop → host killed → restored on host-b (the cold-start check proves the session file) → resume;
//   7. the control plane refuses a locator change at begin, and at the end of an ended-failed turn
//      that a runner ran without --resume through the fleet's Exec (the SDK's detector flags it
//      first); the next turn carries none of it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerError, createClaudeCodeDetector } from '../../../src/runner-sdk/index.ts';
import { CLAUDE_CODE_VERSION, CLAUDE_PATH, claudeCodeEnv, claudeCodeImageFiles } from '../../support/claude-code.ts';
import { SessionHistory, expectNegativeControlsFail, requestEntries } from '../../support/history-checker.ts';
import { CLAUDE_CODE_HISTORY } from '../../support/history-profiles.ts';
import { completeWith, execAndDetect } from './exec-turn.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';
import { modelCalledWith, runTurnThroughFleet, type RanThroughFleet } from './run-turn.ts';

let h: HistoryFleet;
let groupId = '';
const session = new SessionHistory(CLAUDE_CODE_HISTORY);
const prompt = (marker: string): string => `Please remember ${marker}.`;
const ack = (marker: string): string => `ack ${marker}`;

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: claudeCodeImageFiles(), tagSuffix: `claude-code-${CLAUDE_CODE_VERSION}` }, {
    config: (apiUrl) => ({ cliProfiles: { claude_code: { binary: CLAUDE_PATH, env: claudeCodeEnv(apiUrl) } } }),
  });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

/** One successful turn through RunTurn; every request it made checked in full. */
async function turn(marker: string): Promise<RanThroughFleet> {
  const t = await runTurnThroughFleet(h, groupId, 'claude', prompt(marker));
  expect(t.end.evidence, JSON.stringify(t.events).slice(-1500)).toMatchObject({ nativeTurnEnded: true, succeeded: true });
  expect(t.end.completion).toMatchObject({ sessionKept: true });
  session.expectTurn(t.requests, { prompt: prompt(marker), reply: ack(marker) });
  return t;
}

describe(`pinned Claude Code ${CLAUDE_CODE_VERSION} through RunTurn against a loopback model API`, () => {
  let locator = '';

  it('NEW, then LIVE on the kept process with the history once', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'history-claude', members: [{ memberId: 'claude', cli: 'claude-code' }] });
    groupId = opened.group!.groupId;
    const t1 = await turn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    locator = t1.end.observedLocator;
    expect(locator).toMatch(/^[0-9a-f-]{36}$/);
    const t2 = await turn('MARK-TWO');
    expect(t2.begun).toMatchObject({ contextState: ContextState.LIVE, locator });
    expect(t2.end.observedLocator).toBe(locator);
    expectNegativeControlsFail(session, t2.requests.find((r) => requestEntries(r).some((e) => e.role === 'assistant'))!);
  });

  it('a follow-up while Claude is still running is refused until the turn ends, then sent once after it', async () => {
    const release = h.api.holdRequestsWith('MARK-THREE');
    const running = turn('MARK-THREE');
    running.catch(() => undefined);
    try {
      await modelCalledWith(h, 'MARK-THREE');
      const refused = await runTurnThroughFleet(h, groupId, 'claude', prompt('MARK-FOUR')).then(() => undefined, (e: unknown) => e);
      expect(refused).toBeInstanceOf(RunnerError);
      expect((refused as RunnerError).reason).toBe('turn_in_flight');
    } finally {
      release();
    }
    expect((await running).begun.contextState).toBe(ContextState.LIVE);
    const t4 = await turn('MARK-FOUR');
    expect(t4.begun.contextState).toBe(ContextState.LIVE);
  });

  it('close immediately, then resume: the checkpoint names the session file, RESTORED with the whole history', async () => {
    const stopped = await h.runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    const manifest = await h.fleet.chunks.getManifest('host-a', groupId, stopped.checkpointId);
    expect(manifest.members[0]).toMatchObject({ savedLocator: locator, nativeSessionPaths: [`/root/.claude/projects/-/${locator}.jsonl`] });
    const t5 = await turn('MARK-FIVE');
    expect(t5.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-a', locator });
  });

  it('a failed model call Claude does not retry ends the turn failed with the session kept; the runner retries the prompt', async () => {
    h.api.failNext(1_000, 400);
    const failed = await runTurnThroughFleet(h, groupId, 'claude', prompt('MARK-SIX')).finally(() => h.api.failNext(0, 500));
    expect(failed.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false });
    expect(failed.end.completion).toMatchObject({ sessionKept: true, savedLocator: locator });
    session.expectTurn(failed.requests, { prompt: prompt('MARK-SIX'), reply: null });
    await turn('MARK-SIX');
  });

  it('a failed call Claude retries by itself ends the turn at api_retry (R-S6); the natively resumed next turn carries every message once', async () => {
    h.api.failNext(1, 500);
    const t7 = await runTurnThroughFleet(h, groupId, 'claude', prompt('MARK-SEVEN'));
    expect(t7.events.some((e) => (e as { subtype?: string }).subtype === 'api_retry')).toBe(true);
    expect(t7.end.evidence).toMatchObject({ nativeTurnEnded: true, processExited: true });
    expect(t7.end.completion).toMatchObject({ sessionKept: true, savedLocator: locator });
    // Claude's own retry answered before the process exited: the session keeps the answer.
    session.expectTurn(t7.requests, { prompt: prompt('MARK-SEVEN'), reply: ack('MARK-SEVEN') });
    const t8 = await turn('MARK-EIGHT');
    expect(t8.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
  });

  it('stop, host killed, restored elsewhere, resume: the same session with the whole history', async () => {
    expect((await h.runner.stopGroup({ groupId })).outcome).toBe(StopOutcome.CLEAN);
    await h.killHostAAndRestoreOnB(groupId);
    const t9 = await turn('MARK-NINE');
    expect(t9.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
    expect(t9.end.observedLocator).toBe(locator);
  });

  it('refuses a locator change at begin and keeps the saved one', async () => {
    await h.expectLocatorChangeRefusedAtBegin(groupId, 'claude');
  });

  it('refuses a locator change at the end of an ended-failed turn, keeps the saved one, and the next turn carries none of it', async () => {
    const before = (await h.runner.getGroupState({ groupId })).group?.members[0];
    // A runner that lost the locator runs `claude -p` without --resume through the fleet's Exec:
    // Claude opens a new session; the 500 yields `system/api_retry` (2.1.220), which ends the turn.
    const begun = await h.runner.beginTurn({ groupId, memberId: 'claude' });
    const from = h.api.requests.length;
    h.api.failNext(1, 500);
    const ran = await execAndDetect(h.runner, {
      groupId, memberId: 'claude', generation: begun.placementGeneration, env: claudeCodeEnv(h.api.url),
      argv: [CLAUDE_PATH, '-p', '--output-format', 'stream-json', '--verbose', '--', prompt('MARK-TEN')],
    }, createClaudeCodeDetector({ expectedLocator: begun.locator }));
    expect(begun.locator).toBe(locator);
    expect(ran.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'api_retry' });
    expect(ran.evidence.observedLocator).not.toBe(locator);
    expect(ran.evidence.locatorConflict).toEqual({ kept: locator, other: ran.evidence.observedLocator, source: 'expected' });
    // A fresh session: its requests carry only its own prompt under the same frame.
    session.newSession().expectTurn(h.api.requests.slice(from), { prompt: prompt('MARK-TEN'), reply: ack('MARK-TEN') });
    const refused = await completeWith(h.runner, groupId, 'claude', begun, ran, true).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(RunnerError);
    expect((refused as RunnerError).reason).toBe('locator_mismatch');
    expect((await h.runner.getGroupState({ groupId })).group?.members[0]).toMatchObject({ savedLocator: locator, turnInFlightId: '', completedTurns: before?.completedTurns });
    const t11 = await turn('MARK-ELEVEN');
    expect(t11.begun).toMatchObject({ locator });
    expect(t11.requests.every((r) => !JSON.stringify(r.raw).includes('MARK-TEN'))).toBe(true);
  });
});
