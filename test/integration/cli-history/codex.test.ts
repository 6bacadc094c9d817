// Request-history regression with the PINNED Codex CLI (R-P1, R-S1..R-S5, R-G3, R-G5): the real
// statically linked Codex 0.171.0 runs in member containers as `codex exec --json` (resumed with
// `codex exec resume <thread id>`), reaching the loopback fake's Responses API through a custom
// provider, driven the way a runner without Docker access drives it: BeginTurn, the command through
// the fleet's Exec, the runner SDK's `codex exec --json` detector on its stdout (createCodexExecDetector:
// `turn.completed` / `turn.failed`, the thread id), CompleteTurn with the exit the Exec reported.
// Every request the model API received is checked in full by the history checker (developer
// instructions, the environment context, every user and assistant message, in order, each once):
//   1. NEW, then a resumed follow-up (a new process per turn: RESTORED);
//   2. a follow-up while Codex is still running (its model call held): refused `turn_in_flight`,
//      then sent once after the turn;
//   3. close immediately (clean stop, the checkpoint names the rollout file), then resume at once;
//   4. a failed model call (its retries spent: `turn.failed`): a failed, ended turn, the thread
//      kept; the runner retries the prompt, and Codex sends the failed prompt and the retry;
//   5. a failed call Codex retries by itself that succeeds, then the natively resumed next turn;
//   6. stop → host killed → restored on host-b (the cold-start check proves the rollout) → resume;
//   7. the control plane refuses a locator change at begin, and at the end of an ended-failed turn
//      that Codex ran in a new thread (not resumed); the next turn carries none of it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerError, createCodexExecDetector } from '../../../src/runner-sdk/index.ts';
import { CODEX_PATH, CODEX_VERSION, codexConfigToml, codexImageFiles } from '../../support/codex-cli.ts';
import type { RecordedRequest } from '../../support/fake-model-api.ts';
import { SessionHistory, expectNegativeControlsFail, requestEntries } from '../../support/history-checker.ts';
import { CODEX_HISTORY } from '../../support/history-profiles.ts';
import { completeWith, execAndDetect, execCommand, type ExecTurnResult } from './exec-turn.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';
const session = new SessionHistory(CODEX_HISTORY);
const prompt = (marker: string): string => `Please remember ${marker}.`;
const ack = (marker: string): string => `ack ${marker}`;

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: codexImageFiles(), tagSuffix: `codex-${CODEX_VERSION}` });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

interface RanTurn extends ExecTurnResult {
  readonly begun: BeginTurnResponse;
  readonly requests: RecordedRequest[];
}

/**
 * Begin a turn, write Codex's config through Exec (`fewRetries`: its retries cut short, so a failing
 * model fails the turn at once), run `codex exec --json` through Exec resuming the locator it was
 * given (`resume: false`: a new thread, as a driver that lost the locator would), read the end with
 * the SDK's detector. Not completed.
 */
async function runTurn(marker: string, { resume = true, fewRetries = false }: { resume?: boolean; fewRetries?: boolean } = {}): Promise<RanTurn> {
  const begun = await h.runner.beginTurn({ groupId, memberId: 'codex' });
  const config = `${codexConfigToml(h.api.url)}${fewRetries ? 'request_max_retries = 0\nstream_max_retries = 1\n' : ''}`;
  const setup = await execCommand(h.runner, { groupId, memberId: 'codex', argv: ['/bin/sh', '-c', 'mkdir -p /root/.codex && printf "%s" "$1" > /root/.codex/config.toml', 'sh', config] });
  expect(setup.exitCode, setup.stderr).toBe(0);
  const before = h.api.requests.length;
  const args = ['exec', '--json', '--skip-git-repo-check', ...(resume && begun.locator !== '' ? ['resume', begun.locator] : []), prompt(marker)];
  const detector = createCodexExecDetector(begun.locator !== '' ? { expectedLocator: begun.locator } : {});
  const r = await execAndDetect(h.runner, { groupId, memberId: 'codex', argv: [CODEX_PATH, ...args], env: { HOME: '/root' }, generation: begun.placementGeneration }, detector);
  return { ...r, begun, requests: h.api.requests.slice(before) };
}

/** One successful turn as a runner drives `codex exec`: begin, run, detect, complete; every request checked. */
async function turn(marker: string): Promise<RanTurn> {
  const t = await runTurn(marker);
  expect(t.evidence, `${t.stderr}\n${t.stdout}`.slice(-2000)).toMatchObject({ nativeTurnEnded: true, succeeded: true, endKind: 'turn_completed', assistantText: ack(marker) });
  await completeWith(h.runner, groupId, 'codex', t.begun, t, true);
  session.expectTurn(t.requests, { prompt: prompt(marker), reply: ack(marker) });
  return t;
}

describe(`pinned Codex ${CODEX_VERSION} (codex exec --json) against a loopback model API`, () => {
  let locator = '';

  it('NEW, then a resumed follow-up that sends the history once', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'history-codex', members: [{ memberId: 'codex', cli: 'codex' }] });
    groupId = opened.group?.groupId ?? '';
    const t1 = await turn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    locator = t1.evidence.observedLocator!;
    expect(locator).toMatch(/^[0-9a-f-]{36}$/);
    const t2 = await turn('MARK-TWO');
    // exec per turn: the process exited (confirmed), so the next turn is a new process.
    expect(t2.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
    expect(t2.evidence.observedLocator).toBe(locator);
    expectNegativeControlsFail(session, t2.requests.at(-1)!);
  });

  it('a follow-up while Codex is still running is refused until the turn ends, then sent once after it', async () => {
    const release = h.api.holdRequestsWith('MARK-THREE');
    const running = turn('MARK-THREE');
    running.catch(() => undefined);
    try {
      const deadline = Date.now() + 60_000;
      while (!h.api.requests.some((r) => JSON.stringify(r.raw).includes('MARK-THREE'))) {
        if (Date.now() > deadline) throw new Error('Codex never called the model for MARK-THREE');
        await new Promise((r) => setTimeout(r, 100));
      }
      const refused = await h.runner.beginTurn({ groupId, memberId: 'codex' }).then(() => undefined, (e: unknown) => e);
      expect(refused).toBeInstanceOf(RunnerError);
      expect((refused as RunnerError).reason).toBe('turn_in_flight');
    } finally {
      release();
    }
    await running;
    await turn('MARK-FOUR');
  });

  it('close immediately, then resume: the checkpoint names the rollout, RESTORED with the whole history', async () => {
    const stopped = await h.runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    const manifest = await h.fleet.chunks.getManifest('host-a', groupId, stopped.checkpointId);
    expect(manifest.members[0]?.savedLocator).toBe(locator);
    expect(manifest.members[0]?.nativeSessionPaths).toEqual([expect.stringMatching(new RegExp(`^/root/\\.codex/sessions/\\d{4}/\\d{2}/\\d{2}/rollout-[0-9T-]+-${locator}\\.jsonl$`))]);
    const t5 = await turn('MARK-FIVE');
    expect(t5.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-a', locator });
  });

  it('a failed model call ends the turn failed with the thread kept; the runner\'s retry reaches the model after the failed prompt', async () => {
    h.api.failNext(1_000, 500);
    const failed = await runTurn('MARK-SIX', { fewRetries: true }).finally(() => h.api.failNext(0, 500));
    expect(failed.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'turn_completed', observedLocator: locator });
    expect(failed.exitCode).toBe(1);
    expect(await completeWith(h.runner, groupId, 'codex', failed.begun, failed, true)).toMatchObject({ sessionKept: true, savedLocator: locator });
    session.expectTurn(failed.requests, { prompt: prompt('MARK-SIX'), reply: null });
    await turn('MARK-SIX');
  });

  it('a failed call Codex retries by itself completes the turn, and the natively resumed next turn carries every message once', async () => {
    // Observed (0.171.0): on one HTTP 500 Codex sends the same request again at once and reports
    // nothing of it on stdout; both requests are the same conversation.
    h.api.failNext(1, 500);
    const t7 = await turn('MARK-SEVEN');
    expect(t7.requests).toHaveLength(2);
    const t8 = await turn('MARK-EIGHT');
    expect(t8.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
  });

  it('stop, host killed, restored elsewhere, resume: the same thread with the whole history', async () => {
    expect((await h.runner.stopGroup({ groupId })).outcome).toBe(StopOutcome.CLEAN);
    await h.killHostAAndRestoreOnB(groupId);
    const t9 = await turn('MARK-NINE');
    expect(t9.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
    expect(t9.evidence.observedLocator).toBe(locator);
  });

  it('refuses a locator change at begin and keeps the saved one', async () => {
    await h.expectLocatorChangeRefusedAtBegin(groupId, 'codex');
  });

  it('refuses a locator change at the end of an ended-failed turn, keeps the saved one, and the next turn carries none of it', async () => {
    const before = (await h.runner.getGroupState({ groupId })).group?.members[0];
    // Without `resume` Codex starts a new thread; its failing call fails the turn (retries cut short).
    h.api.failNext(1_000, 500);
    const t10 = await runTurn('MARK-TEN', { resume: false, fewRetries: true }).finally(() => h.api.failNext(0, 500));
    expect(t10.begun.locator).toBe(locator);
    expect(t10.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false });
    expect(t10.evidence.observedLocator).not.toBe(locator);
    // The runner side flags it first: the SDK detector keeps the expected id and names the other one.
    expect(t10.evidence.locatorConflict).toEqual({ kept: locator, other: t10.evidence.observedLocator, source: 'expected' });
    // A fresh thread: its requests carry only its own prompt under the same frame.
    const fresh = session.newSession();
    fresh.expectTurn(t10.requests, { prompt: prompt('MARK-TEN'), reply: null });
    const refused = await completeWith(h.runner, groupId, 'codex', t10.begun, t10, true).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(RunnerError);
    expect((refused as RunnerError).reason).toBe('locator_mismatch');
    expect((await h.runner.getGroupState({ groupId })).group?.members[0]).toMatchObject({ savedLocator: locator, turnInFlightId: '', completedTurns: before?.completedTurns });
    const t11 = await turn('MARK-ELEVEN');
    expect(t11.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
    expect(t11.requests.every((r) => !JSON.stringify(requestEntries(r)).includes('MARK-TEN'))).toBe(true);
  });
});
