// LIVE turns with the pinned Claude Code binary kept running between turns (R-S1, R-S5, R-S6, R-I9):
// the runner holds only the gRPC address and its certificate — no Docker socket — and calls RunTurn;
// the fleet starts `claude -p --input-format stream-json --output-format stream-json --verbose` in the
// member container as the member's turn process (the host agent keeps it), writes each turn to its
// stdin as one user message, reads the turn's end from Claude's own `result`, and keeps the process
// for the next turn, which is LIVE. Checked against what the model API received and against the
// processes running in the member container (read by the test harness through the host's engine,
// never by the runner):
//   1. NEW, then LIVE twice on the very same process, the history sent once and in order;
//   2. cancelling the call mid-turn (the model call held open) is not a turn end (R-S5): the fleet's
//      turn runs on to Claude's own `result`, is completed, the process is kept; a repeat of the call
//      answers that end without running anything; the next turn is LIVE with the history once;
//   3. Claude's retry defect (R-S6: `system/api_retry`): the turn ends there, the process is let exit
//      and its exit awaited, the next turn is RESTORED (a new process) with the history once;
//   4. a migration right after a LIVE turn (stop, checkpoint, drain to host-b): RESTORED there with the
//      whole history — the kept process had written its last answer to the session file before its
//      `result` (eager flush, turn-command.ts), so the stop that killed it lost nothing — and LIVE the
//      turn after that;
//   5. the host fenced mid-turn (a new epoch while the model call is held): the call ends UNAVAILABLE
//      host_fenced, the turn stays unconfirmed (the next begin reports LOST), the process is ended.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState, TurnEndKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { ExecEnd } from '../../../src/gen/sandboxfleet/v1/exec.ts';
import type { BeginTurnResponse, RunTurnEnd, RunTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerError } from '../../../src/runner-sdk/index.ts';
import { CLAUDE_CODE_VERSION, CLAUDE_PATH, claudeCodeEnv, claudeCodeImageFiles } from '../../support/claude-code.ts';
import { history, promptRequest, type RecordedRequest } from '../../support/fake-model-api.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: claudeCodeImageFiles(), tagSuffix: `claude-code-${CLAUDE_CODE_VERSION}` }, {
    config: (apiUrl) => ({ cliProfiles: { claude_code: { binary: CLAUDE_PATH, env: claudeCodeEnv(apiUrl) } } }),
  });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

interface Ran {
  readonly begun: BeginTurnResponse;
  readonly end: RunTurnEnd;
  readonly requests: RecordedRequest[];
}

async function runTurn(marker: string, options: { idempotencyKey?: string; signal?: AbortSignal; onBegun?: (b: BeginTurnResponse) => void } = {}): Promise<Ran> {
  const before = h.api.requests.length;
  let begun: BeginTurnResponse | undefined;
  let end: RunTurnEnd | undefined;
  for await (const e of h.runner.runTurn({ groupId, memberId: 'claude', prompt: `Please remember ${marker}.` }, { timeoutMs: 120_000, ...options }) as AsyncIterable<RunTurnResponse>) {
    const ev = e.event;
    if (ev?.$case === 'begun') {
      begun = ev.value;
      options.onBegun?.(ev.value);
    } else if (ev?.$case === 'end') end = ev.value;
  }
  expect(begun).toBeDefined();
  expect(end).toBeDefined();
  return { begun: begun!, end: end!, requests: h.api.requests.slice(before) };
}

/** The pids of the Claude processes in the member's container (read through the host's engine by the harness). */
async function claudePids(begun: { hostId: string; containerId: string }): Promise<string[]> {
  const ps = await h.runtimeOf(begun.hostId).exec(begun.containerId, ['ps', '-o', 'pid,args']);
  return ps.stdout.split('\n').filter((l) => l.includes(CLAUDE_PATH)).map((l) => l.trim().split(/\s+/)[0]!);
}

async function member() {
  return (await h.runner.getGroupState({ groupId })).group!.members.find((m) => m.memberId === 'claude')!;
}

/** The member's session as the control plane stored it (read from the store by the harness). */
async function session() {
  return (await h.fleet.group(groupId)).members.find((m) => m.session.memberId === 'claude')!.session;
}

/** Wait until the fake model API received a request whose last user message carries `marker`. */
async function modelCalledWith(marker: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!h.api.requests.some((r) => history(r).at(-1)?.includes(marker) === true)) {
    if (Date.now() > deadline) throw new Error(`the CLI never called the model for ${marker}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe(`RunTurn keeps the pinned Claude Code ${CLAUDE_CODE_VERSION} running between turns`, () => {
  it('NEW, then LIVE twice on the very same process; the model API sees the history once, in order', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'turn-process-claude', members: [{ memberId: 'claude', cli: 'claude-code' }] });
    groupId = opened.group!.groupId;
    const t1 = await runTurn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    expect(t1.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, processExited: false, exitConfirmed: false, transportUsable: true });
    // The turn's exec was detached: the process did not exit, it is kept for the next turn.
    expect(t1.end.exit?.end).toBe(ExecEnd.DETACHED);
    expect(t1.end.completion).toMatchObject({ sessionKept: true, nextContextState: ContextState.LIVE });
    expect(t1.end.observedLocator).toMatch(/^[0-9a-f-]{36}$/);
    expect(history(promptRequest(t1.requests, 'MARK-ONE'))).toEqual(['user:MARK-ONE']);
    const pids = await claudePids(t1.begun);
    expect(pids).toHaveLength(1);
    // The process the next turn may reuse is that turn process: `<container start>/<process id>`.
    expect((await session()).process).toMatchObject({ containerId: t1.begun.containerId, incarnation: expect.stringMatching(/^\d+\/p-[0-9a-f]{16}$/) });

    const t2 = await runTurn('MARK-TWO');
    expect(t2.begun).toMatchObject({ contextState: ContextState.LIVE, locator: t1.end.observedLocator, containerId: t1.begun.containerId });
    expect(t2.end.observedLocator).toBe(t1.end.observedLocator);
    expect(t2.end.exit?.end).toBe(ExecEnd.DETACHED);
    expect(history(promptRequest(t2.requests, 'MARK-TWO'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO']);
    expect(await claudePids(t2.begun)).toEqual(pids);

    const t3 = await runTurn('MARK-THREE');
    expect(t3.begun.contextState).toBe(ContextState.LIVE);
    expect(history(promptRequest(t3.requests, 'MARK-THREE'))).toEqual(['user:MARK-ONE', 'assistant:MARK-ONE', 'user:MARK-TWO', 'assistant:MARK-TWO', 'user:MARK-THREE']);
    expect(await claudePids(t3.begun)).toEqual(pids);
  });

  it('cancelling the call mid-turn is not a turn end: the turn runs to Claude\'s own end, the process is kept, the next turn is LIVE', async () => {
    const release = h.api.holdRequestsWith('MARK-CANCEL');
    const key = 'turn-process-cancel-1';
    const abort = new AbortController();
    let begun: BeginTurnResponse | undefined;
    const call = runTurn('MARK-CANCEL', { idempotencyKey: key, signal: abort.signal, onBegun: (b) => (begun = b) }).then(() => undefined, (e: unknown) => e);
    try {
      await modelCalledWith('MARK-CANCEL');
      expect(begun?.contextState).toBe(ContextState.LIVE);
      abort.abort();
      const err = await call;
      expect(err).toBeInstanceOf(RunnerError);
      expect((err as RunnerError).reason).toBe('cancelled');
      // The turn is still in flight: the CLI has not ended it.
      expect((await member()).turnInFlightId).toBe(begun!.turnId);
    } finally {
      release();
    }
    await until('the cancelled call\'s turn completed', async () => ((await member()).turnInFlightId === '' ? true : undefined));
    expect(await session()).toMatchObject({ phase: 'RETAINED', lastTurn: { turnId: begun!.turnId, outcome: 'completed' }, process: expect.anything() });

    // The same key answers the turn's recorded end and runs nothing.
    const calls = h.api.requests.length;
    const again = await runTurn('MARK-CANCEL', { idempotencyKey: key });
    expect(again.begun.turnId).toBe(begun!.turnId);
    expect(again.end.completion).toMatchObject({ sessionKept: true, nextContextState: ContextState.LIVE });
    expect(h.api.requests.length).toBe(calls);

    const next = await runTurn('MARK-AFTER');
    expect(next.begun.contextState).toBe(ContextState.LIVE);
    expect(history(promptRequest(next.requests, 'MARK-AFTER')).slice(-5)).toEqual(['user:MARK-THREE', 'assistant:MARK-THREE', 'user:MARK-CANCEL', 'assistant:MARK-CANCEL', 'user:MARK-AFTER']);
  });

  it('R-S6 api_retry: the turn ends there, the process is let exit and its exit awaited; the next turn is RESTORED in a new process', async () => {
    const before = await claudePids((await runTurn('MARK-PING')).begun);
    h.api.failNext(1, 500);
    const t = await runTurn('MARK-RETRY');
    expect(t.begun.contextState).toBe(ContextState.LIVE);
    expect(t.end.evidence).toMatchObject({ nativeTurnEnded: true, kind: TurnEndKind.API_RETRY, processExited: true, exitConfirmed: true });
    expect(t.end.exit?.end).toBe(ExecEnd.EXITED);
    expect(t.end.completion).toMatchObject({ sessionKept: true, nextContextState: ContextState.RESTORED });
    expect(await claudePids(t.begun)).toEqual([]);
    const next = await runTurn('MARK-RESTARTED');
    expect(next.begun).toMatchObject({ contextState: ContextState.RESTORED, slotReclaimed: false, locator: t.begun.locator });
    const sent = history(promptRequest(next.requests, 'MARK-RESTARTED'));
    expect(sent.slice(-3)).toEqual(['user:MARK-RETRY', 'assistant:MARK-RETRY', 'user:MARK-RESTARTED']);
    for (const m of ['MARK-ONE', 'MARK-CANCEL', 'MARK-RETRY']) expect(sent.filter((s) => s === `user:${m}`)).toHaveLength(1);
    const after = await claudePids(next.begun);
    expect(after).toHaveLength(1);
    expect(after).not.toEqual(before);
  });

  it('a migration between turns: RESTORED on the new host with the whole history, LIVE the turn after that', async () => {
    const again = await runTurn('MARK-AGAIN');
    expect(again.begun.contextState).toBe(ContextState.LIVE);
    const saved = (await member()).savedLocator;
    const sentBefore = history(promptRequest(again.requests, 'MARK-AGAIN'));
    // At once: the kept process is killed with its container while the turn has only just ended.
    await h.drainToHostB(groupId);
    const moved = await runTurn('MARK-MOVED');
    expect(moved.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator: saved });
    expect(moved.end.observedLocator).toBe(saved);
    expect(history(promptRequest(moved.requests, 'MARK-MOVED'))).toEqual([...sentBefore, 'assistant:MARK-AGAIN', 'user:MARK-MOVED']);
    const live = await runTurn('MARK-THERE');
    expect(live.begun).toMatchObject({ contextState: ContextState.LIVE, hostId: 'host-b', containerId: moved.begun.containerId });
    expect(history(promptRequest(live.requests, 'MARK-THERE'))).toEqual([...sentBefore, 'assistant:MARK-AGAIN', 'user:MARK-MOVED', 'assistant:MARK-MOVED', 'user:MARK-THERE']);
    expect(await claudePids(live.begun)).toHaveLength(1);
  });

  it('the host fenced mid-turn: the call ends UNAVAILABLE host_fenced, the turn stays unconfirmed, the process is ended', async () => {
    const release = h.api.holdRequestsWith('MARK-FENCED');
    let begun: BeginTurnResponse | undefined;
    const call = runTurn('MARK-FENCED', { onBegun: (b) => (begun = b) }).then(() => undefined, (e: unknown) => e);
    try {
      await modelCalledWith('MARK-FENCED');
      expect(begun).toMatchObject({ contextState: ContextState.LIVE, hostId: 'host-b' });
      // host-b registers again (a restart, a zombie coming back): its new epoch fences the old one.
      await h.fleet.agents.get('host-b')!.agent.reregister();
      const err = await call;
      expect(err).toBeInstanceOf(RunnerError);
      expect(err).toMatchObject({ code: 14, reason: 'host_fenced' });
    } finally {
      release();
    }
    // Not a turn end (R-S5): the member is unconfirmed, and its next begin reports LOST.
    const s = await session();
    expect(s).toMatchObject({ phase: 'UNCONFIRMED', unconfirmedCause: 'transport_disconnect' });
    expect(s.process).toBeUndefined();
    await until('the fenced turn\'s process ended', async () => ((await claudePids(begun!)).length === 0 ? true : undefined), 30_000);
    const next = await h.runner.beginTurn({ groupId, memberId: 'claude' }).then(() => undefined, (e: unknown) => e);
    expect(next).toBeInstanceOf(RunnerError);
    expect((next as RunnerError).reason).toBe('context_lost');
  });
});
