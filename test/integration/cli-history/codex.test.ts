// Request-history regression with the PINNED Codex CLI (R-P1, R-S1..R-S3, R-G3, R-G5): the real
// statically linked Codex 0.171.0 binary runs in member containers (`codex exec --json`, resumed
// with `codex exec resume <thread id>`), reaching the loopback fake's Responses API through a
// custom provider, against the real control plane, NATS, agents and dockerd hosts over the runner
// gRPC API. Checked on what the model API receives (user and assistant text, roles, order,
// duplicate counts):
//   1. NEW, then a resumed follow-up that sends the history once;
//   2. close immediately (clean stop, checkpoint), then resume on the same host (RESTORED) with the
//      whole history;
//   3. after a drain moves the writable layer to another host (the checkpoint finds and proves the
//      rollout file `~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl`), the resumed
//      Codex there sends the same history under the same thread id;
//   4. a failed model call (HTTP 500) that Codex retries internally: the turn completes, and the
//      next, natively resumed turn's request holds the history once, no duplicate of the prompt;
//   5. the control plane refuses a locator change at begin, and the saved one is intact;
//   6. a locator change at the END of an ended-failed turn (Codex, not resumed, started a new thread
//      and its calls kept failing: `turn.failed`) is refused (`locator_mismatch`); the saved locator
//      is intact and the next turn carries none of it.
// Seam, named: the turn end is read from `codex exec --json` (`turn.completed`) by this test, not by
// the runner SDK's Codex detector, which reads the app-server protocol (`turn/completed`) that a
// runner drives over JSON-RPC (that detector meets the real app-server in codex-app-server.test.ts);
// the evidence sent is the wire form of that end (`turn.completed` → succeeded, `turn.failed` → failed).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BeginTurnResponse, CompleteTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { ContextState, StopOutcome, TurnEndKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { RunnerError } from '../../../src/runner-sdk/index.ts';
import { CODEX_PATH, CODEX_VERSION, codexConfigToml, codexImageFiles, readCodexExec } from '../../support/codex-cli.ts';
import { successEvidence } from '../../support/evidence.ts';
import { history, promptRequest, type RecordedRequest } from '../../support/fake-model-api.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: codexImageFiles(), tagSuffix: `codex-${CODEX_VERSION}` });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

interface RanTurn {
  readonly begun: BeginTurnResponse;
  readonly seen: ReturnType<typeof readCodexExec>;
  readonly exitCode: number;
  readonly requests: RecordedRequest[];
}

/**
 * Begin a turn, point Codex at the fake and run `codex exec`, resuming the locator it was given
 * (`resume: false`: started without `resume`, as a driver that lost the locator would, so Codex
 * starts a new thread). Not completed.
 */
async function runTurn(marker: string, { resume = true }: { resume?: boolean } = {}): Promise<RanTurn> {
  const begun = await h.runner.beginTurn({ groupId, memberId: 'codex' });
  const before = h.api.requests.length;
  const rt = h.runtimeOf(begun.hostId);
  const setup = await rt.exec(begun.containerId, ['/bin/sh', '-c', 'mkdir -p /root/.codex && printf "%s" "$1" > /root/.codex/config.toml', 'sh', codexConfigToml(h.api.url)]);
  expect(setup.exitCode, setup.stderr).toBe(0);
  const prompt = `Please remember ${marker}.`;
  const args = ['exec', '--json', '--skip-git-repo-check', ...(resume && begun.locator !== '' ? ['resume', begun.locator, prompt] : [prompt])];
  const run = await rt.exec(begun.containerId, [CODEX_PATH, ...args], { env: { HOME: '/root' }, timeoutMs: 120_000, maxOutputBytes: 8 * 1024 * 1024 });
  const seen = readCodexExec(run.stdout);
  expect(seen.completed || seen.failed !== undefined, `${run.stderr}\n${run.stdout}`.slice(0, 2000)).toBe(true);
  return { begun, seen, exitCode: run.exitCode, requests: h.api.requests.slice(before) };
}

function complete(t: RanTurn): Promise<CompleteTurnResponse> {
  const evidence = successEvidence({
    kind: TurnEndKind.TURN_COMPLETED,
    succeeded: t.seen.completed,
    errorMessage: t.seen.failed ?? '',
    processExited: true,
    exitConfirmed: true,
    exitCode: t.exitCode,
  });
  return h.runner.completeTurn({ groupId, memberId: 'codex', turnId: t.begun.turnId, observedLocator: t.seen.threadId ?? '', evidence });
}

/** One turn as a runner drives `codex exec`: begin, run (resuming the locator), read the end, complete. */
async function turn(marker: string): Promise<{ begun: BeginTurnResponse; threadId: string | undefined; agentText: string; requests: RecordedRequest[] }> {
  const t = await runTurn(marker);
  expect(t.seen.completed, t.seen.failed).toBe(true);
  await complete(t);
  return { begun: t.begun, threadId: t.seen.threadId, agentText: t.seen.agentText, requests: t.requests };
}

// Codex also sends user-role messages of its own (environment context); they carry no marker and
// are left out of the comparisons (`user:`).
function sentHistory(requests: readonly RecordedRequest[], marker: string): string[] {
  return history(promptRequest(requests, marker)).filter((x) => x !== 'user:');
}

describe(`pinned Codex ${CODEX_VERSION} against a loopback model API`, () => {
  it('NEW, then a resumed follow-up that sends the history once', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'history-codex', members: [{ memberId: 'codex', cli: 'codex' }] });
    groupId = opened.group?.groupId ?? '';
    const t1 = await turn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    expect(t1.threadId).toMatch(/^[0-9a-f-]{36}$/);
    expect(t1.agentText).toBe('ack MARK-ONE');
    expect(sentHistory(t1.requests, 'MARK-ONE')).toEqual(['user:MARK-ONE']);
    const t2 = await turn('MARK-TWO');
    expect(t2.begun.locator).toBe(t1.threadId);
    expect(t2.threadId).toBe(t1.threadId);
    expect(sentHistory(t2.requests, 'MARK-TWO')).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO']);
  });

  it('close immediately, then resume: RESTORED with the whole history', async () => {
    const locator = (await h.runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    const stopped = await h.runner.stopGroup({ groupId });
    expect(stopped.outcome).toBe(StopOutcome.CLEAN);
    expect(stopped.checkpointId).not.toBe('');
    const t3 = await turn('MARK-THREE');
    expect(t3.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-a', locator });
    expect(t3.threadId).toBe(locator);
    expect(t3.agentText).toBe('ack MARK-THREE');
    expect(sentHistory(t3.requests, 'MARK-THREE')).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
  });

  it('after a drain moves the writable layer to another host, the resumed Codex there sends the same history under the same thread id', async () => {
    await h.expectSameSessionAfterDrain(groupId, turn, (t) => t.threadId, (t) => sentHistory(t.requests, 'MARK-FOUR'));
  });

  it('a failed model call Codex retries internally completes the turn, and the natively resumed next turn carries no duplicates', async () => {
    // Observed (0.171.0): on one HTTP 500 Codex retries the same request at once and `exec --json`
    // reports nothing of it (no `error` item; "Reconnecting... n/5" only appears once a whole
    // request's retries are spent); the turn completes with the answer in the same thread.
    h.api.failNext(1, 500);
    const t5 = await turn('MARK-FIVE');
    const locator = t5.begun.locator;
    expect(t5.threadId).toBe(locator);
    expect(t5.agentText).toBe('ack MARK-FIVE');
    const tries = t5.requests.map((r) => history(r).filter((x) => x !== 'user:'));
    const expected = ['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE', 'assistant:MARK-THREE', 'user:MARK-FOUR', 'assistant:MARK-FOUR', 'user:MARK-FIVE'];
    expect(tries).toEqual([expected, expected]); // the failed call and its retry: the same body
    const t6 = await turn('MARK-SIX');
    expect(t6.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
    expect(t6.threadId).toBe(locator);
    expect(sentHistory(t6.requests, 'MARK-SIX')).toEqual([...expected, 'assistant:MARK-FIVE', 'user:MARK-SIX']);
  });

  it('refuses a locator change at begin and keeps the saved one', async () => {
    await h.expectLocatorChangeRefusedAtBegin(groupId, 'codex');
  });

  it('refuses a locator change at the end of an ended-failed turn, keeps the saved one, and the next turn carries none of it', async () => {
    const before = (await h.runner.getGroupState({ groupId })).group?.members[0];
    const saved = before?.savedLocator ?? '';
    // Observed (0.171.0): without `resume` Codex starts a new thread (`thread.started`). A model API
    // that keeps answering 500 costs 30 calls (6 stream attempts of 5 requests each, "Reconnecting...
    // 1/5".."5/5" as `error` events), ~25 s, then `turn.failed` and exit code 1.
    h.api.failNext(1_000, 500);
    const t7 = await runTurn('MARK-SEVEN', { resume: false }).finally(() => h.api.failNext(0, 500));
    expect(t7.begun.locator).toBe(saved);
    expect(t7.seen).toMatchObject({ completed: false, failed: expect.any(String) as string });
    expect(t7.seen.threadId).toMatch(/^[0-9a-f-]{36}$/);
    expect(t7.seen.threadId).not.toBe(saved);
    for (const r of t7.requests) expect(history(r).filter((x) => x !== 'user:')).toEqual(['user:MARK-SEVEN']);
    const refused = await complete(t7).then(() => undefined, (e: unknown) => e);
    expect(refused).toBeInstanceOf(RunnerError);
    expect((refused as RunnerError).reason).toBe('locator_mismatch');
    expect((await h.runner.getGroupState({ groupId })).group?.members[0]).toMatchObject({ savedLocator: saved, turnInFlightId: '', completedTurns: before?.completedTurns });

    const t8 = await turn('MARK-EIGHT');
    expect(t8.begun).toMatchObject({ contextState: ContextState.RESTORED, locator: saved });
    expect(t8.threadId).toBe(saved);
    expect(t8.agentText).toBe('ack MARK-EIGHT');
    expect(sentHistory(t8.requests, 'MARK-EIGHT')).toEqual([
      'user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE', 'assistant:MARK-THREE',
      'user:MARK-FOUR', 'assistant:MARK-FOUR', 'user:MARK-FIVE', 'assistant:MARK-FIVE', 'user:MARK-SIX', 'assistant:MARK-SIX', 'user:MARK-EIGHT',
    ]);
  });
});
