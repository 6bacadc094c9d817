// Request-history regression with the PINNED Pi coding agent 0.73.1 (R-P1, R-S1..R-S5, R-G3, R-G5)
// through the fleet's own turn API: the runner holds only the gRPC address and its certificate and
// calls RunTurn; the fleet runs the real Pi (a Node.js CLI, `--mode rpc`, kept between turns as the
// member's turn process) in the member container, reads the end from Pi's own `agent_end` (and the
// last assistant stopReason) and completes the turn. Pi reaches the loopback fake Messages API through
// ~/.pi/agent/models.json, written by the runner through the fleet's Exec. Every request the model API
// received is checked in full by the history checker (system prompt, every message once, in order):
//   1. NEW, then LIVE on the kept process;
//   2. a follow-up while Pi is still running (its model call held): a second RunTurn is refused
//      `turn_in_flight`; sent after the end, once;
//   3. close immediately (clean stop, the checkpoint names the session file), then resume at once;
//   4. a failed model call Pi does not retry (HTTP 400): a failed turn, never an empty success, the
//      session kept; the runner retries the prompt (Pi keeps the failed prompt: two user messages);
//   5. a failed call Pi retries by itself (its first attempt fails, `auto_retry` succeeds): one
//      successful turn; then a native resume (stop, RESTORED) carries every message once;
//   6. stop → host killed → restored on host-b (the cold-start check proves the session file) → resume;
//   7. the control plane refuses a locator change at begin, and at the end of an ended-failed turn
//      that a runner ran without --session through the fleet's Exec (the SDK's Pi detector flags it
//      first); the next turn carries none of it.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerError, createPiDetector } from '../../../src/runner-sdk/index.ts';
import { SessionHistory, expectNegativeControlsFail, requestEntries } from '../../support/history-checker.ts';
import { PI_HISTORY } from '../../support/history-profiles.ts';
import { PI_PATH, PI_VERSION, piImageContent, piModelsJson } from '../../support/pi-cli.ts';
import { completeWith, execAndDetect, execCommand } from './exec-turn.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';
import { modelCalledWith, runTurnThroughFleet, type RanThroughFleet } from './run-turn.ts';

let h: HistoryFleet;
let groupId = '';
const session = new SessionHistory(PI_HISTORY);
const launcherDir = mkdtempSync(join(tmpdir(), 'sf-pi-launcher-'));
const prompt = (marker: string): string => `Please remember ${marker}.`;
const ack = (marker: string): string => `ack ${marker}`;
const PI_ARGS = ['--provider', 'fake', '--model', 'fake-model'];

beforeAll(async () => {
  const content = piImageContent(launcherDir);
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: content.files, extraTrees: content.trees, tagSuffix: `pi-${PI_VERSION}` }, {
    config: () => ({ cliProfiles: { pi: { binary: PI_PATH, env: { HOME: '/root' }, args: PI_ARGS } } }),
  });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
  rmSync(launcherDir, { recursive: true, force: true });
});

/** One successful turn through RunTurn; every request it made checked in full. */
async function turn(marker: string): Promise<RanThroughFleet> {
  const t = await runTurnThroughFleet(h, groupId, 'pi', prompt(marker));
  expect(t.end.evidence, JSON.stringify(t.events).slice(-1500)).toMatchObject({ nativeTurnEnded: true, succeeded: true });
  expect(t.end.completion).toMatchObject({ sessionKept: true });
  session.expectTurn(t.requests, { prompt: prompt(marker), reply: ack(marker) });
  return t;
}

describe(`pinned Pi ${PI_VERSION} through RunTurn against a loopback model API`, () => {
  let locator = '';

  it('NEW, then LIVE on the kept process with the history once', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'history-pi', members: [{ memberId: 'pi', cli: 'pi' }] });
    groupId = opened.group!.groupId;
    const setup = await execCommand(h.runner, { groupId, memberId: 'pi', argv: ['/bin/sh', '-c', 'mkdir -p /root/.pi/agent && printf "%s" "$1" > /root/.pi/agent/models.json', 'sh', piModelsJson(h.api.url)] });
    expect(setup.exitCode, setup.stderr).toBe(0);
    const t1 = await turn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    locator = t1.end.observedLocator;
    expect(locator).toMatch(/^[0-9a-f-]{36}$/);
    const t2 = await turn('MARK-TWO');
    expect(t2.begun).toMatchObject({ contextState: ContextState.LIVE, locator });
    expectNegativeControlsFail(session, t2.requests.find((r) => requestEntries(r).some((e) => e.role === 'assistant'))!);
  });

  it('a follow-up while Pi is still running is refused until the turn ends, then sent once after it', async () => {
    const release = h.api.holdRequestsWith('MARK-THREE');
    const running = turn('MARK-THREE');
    running.catch(() => undefined);
    try {
      await modelCalledWith(h, 'MARK-THREE');
      const refused = await runTurnThroughFleet(h, groupId, 'pi', prompt('MARK-FOUR')).then(() => undefined, (e: unknown) => e);
      expect(refused).toBeInstanceOf(RunnerError);
      expect((refused as RunnerError).reason).toBe('turn_in_flight');
    } finally {
      release();
    }
    expect((await running).begun.contextState).toBe(ContextState.LIVE);
    expect((await turn('MARK-FOUR')).begun.contextState).toBe(ContextState.LIVE);
  });

  it('close immediately, then resume: the checkpoint names the session file, RESTORED with the whole history', async () => {
    const stopped = await h.runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    const manifest = await h.fleet.chunks.getManifest('host-a', groupId, stopped.checkpointId);
    expect(manifest.members[0]?.savedLocator).toBe(locator);
    expect(manifest.members[0]?.nativeSessionPaths).toEqual([expect.stringMatching(new RegExp(`^/root/\\.pi/agent/sessions/[^/]+/[^/_]+_${locator}\\.jsonl$`))]);
    const t5 = await turn('MARK-FIVE');
    expect(t5.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-a', locator });
  });

  it('a failed model call Pi does not retry is a failed turn (never an empty success) with the session kept; the runner retries the prompt', async () => {
    h.api.failNext(1_000, 400);
    const failed = await runTurnThroughFleet(h, groupId, 'pi', prompt('MARK-SIX')).finally(() => h.api.failNext(0, 500));
    expect(failed.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false });
    expect(failed.end.evidence?.errorMessage ?? '').not.toBe('');
    expect(failed.end.completion).toMatchObject({ sessionKept: true, savedLocator: locator });
    session.expectTurn(failed.requests, { prompt: prompt('MARK-SIX'), reply: null });
    await turn('MARK-SIX');
  });

  it('a failed call Pi retries by itself is one successful turn; a native resume after it carries every message once', async () => {
    // Observed (0.73.1): the first attempt's three calls fail, Pi reports agent_end (stopReason
    // error), then auto_retry_start, and the retry succeeds: the detector waits past the first end.
    h.api.failNext(3, 500);
    const t7 = await turn('MARK-SEVEN').finally(() => h.api.failNext(0, 500));
    expect(t7.requests.length).toBeGreaterThan(3);
    expect((await h.runner.stopGroup({ groupId })).outcome).toBe(StopOutcome.CLEAN);
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
    await h.expectLocatorChangeRefusedAtBegin(groupId, 'pi');
  });

  it('refuses a locator change at the end of an ended-failed turn, keeps the saved one, and the next turn carries none of it', async () => {
    const before = (await h.runner.getGroupState({ groupId })).group?.members[0];
    // A runner that lost the locator runs Pi without --session through the fleet's Exec: Pi opens a
    // new session, and its call fails (HTTP 400): ended, failed.
    const begun = await h.runner.beginTurn({ groupId, memberId: 'pi' });
    const from = h.api.requests.length;
    h.api.failNext(1_000, 400);
    const ran = await execAndDetect(h.runner, {
      groupId, memberId: 'pi', generation: begun.placementGeneration, env: { HOME: '/root' },
      argv: [PI_PATH, '--mode', 'json', '-p', ...PI_ARGS, prompt('MARK-TEN')],
    }, createPiDetector({ expectedLocator: begun.locator })).finally(() => h.api.failNext(0, 500));
    expect(begun.locator).toBe(locator);
    expect(ran.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'agent_end' });
    expect(ran.evidence.observedLocator).not.toBe(locator);
    expect(ran.evidence.locatorConflict).toEqual({ kept: locator, other: ran.evidence.observedLocator, source: 'expected' });
    session.newSession().expectTurn(h.api.requests.slice(from), { prompt: prompt('MARK-TEN'), reply: null });
    const refused = await completeWith(h.runner, groupId, 'pi', begun, ran, true).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(RunnerError);
    expect((refused as RunnerError).reason).toBe('locator_mismatch');
    expect((await h.runner.getGroupState({ groupId })).group?.members[0]).toMatchObject({ savedLocator: locator, turnInFlightId: '', completedTurns: before?.completedTurns });
    const t11 = await turn('MARK-ELEVEN');
    expect(t11.begun).toMatchObject({ locator });
    expect(t11.requests.every((r) => !JSON.stringify(r.raw).includes('MARK-TEN'))).toBe(true);
  });
});
