// Turns through the fleet with the pinned Claude Code binary (R-I9, R-P1), one process per turn (the
// CLI profile's keepProcess: false; kept processes and LIVE turns: claude-turn-process.test.ts): the
// runner holds only the gRPC address and its certificate — no Docker socket — and calls RunTurn; the
// fleet begins the turn, runs `claude -p … --output-format stream-json --verbose [--resume]` in the
// member container (the CLI profile points it at the loopback fake Messages API), detects the end
// from Claude's own `result` event, and completes the turn. Checked against what the model API received: NEW, then
// RESTORED with the history once and in order, then RESTORED on another host after a migration with
// the same session; and a repeated call with the same idempotency key answers the stored end
// without running the CLI again.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnResponse, RunTurnEnd, RunTurnResponse } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { CLAUDE_CODE_VERSION, CLAUDE_PATH, claudeCodeEnv, claudeCodeImageFiles } from '../../support/claude-code.ts';
import type { RecordedRequest } from '../../support/fake-model-api.ts';
import { SessionHistory } from '../../support/history-checker.ts';
import { CLAUDE_CODE_HISTORY } from '../../support/history-profiles.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';

let h: HistoryFleet;
let groupId = '';
/** Every request of every turn checked in full (test/support/history-checker.ts). */
const session = new SessionHistory(CLAUDE_CODE_HISTORY);

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: claudeCodeImageFiles(), tagSuffix: `claude-code-${CLAUDE_CODE_VERSION}` }, {
    config: (apiUrl) => ({ cliProfiles: { claude_code: { binary: CLAUDE_PATH, env: claudeCodeEnv(apiUrl), keepProcess: false } } }),
  });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

interface Ran {
  readonly begun: BeginTurnResponse;
  readonly end: RunTurnEnd;
  readonly events: unknown[];
  readonly requests: RecordedRequest[];
}

async function runTurn(marker: string, idempotencyKey?: string): Promise<Ran> {
  const before = h.api.requests.length;
  const events: unknown[] = [];
  let begun: BeginTurnResponse | undefined;
  let end: RunTurnEnd | undefined;
  for await (const e of h.runner.runTurn({ groupId, memberId: 'claude', prompt: `Please remember ${marker}.` }, { timeoutMs: 120_000, ...(idempotencyKey !== undefined ? { idempotencyKey } : {}) }) as AsyncIterable<RunTurnResponse>) {
    const ev = e.event;
    if (ev?.$case === 'begun') begun = ev.value;
    else if (ev?.$case === 'cliEvent') events.push(JSON.parse(ev.value.toString('utf8')));
    else if (ev?.$case === 'end') end = ev.value;
  }
  expect(begun).toBeDefined();
  expect(end).toBeDefined();
  return { begun: begun!, end: end!, events, requests: h.api.requests.slice(before) };
}

describe(`RunTurn with the pinned Claude Code ${CLAUDE_CODE_VERSION}`, () => {
  it('NEW, then RESTORED with the history sent once, the CLI\'s own events streamed', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'run-turn-claude', members: [{ memberId: 'claude', cli: 'claude-code' }] });
    groupId = opened.group!.groupId;
    const t1 = await runTurn('MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    expect(t1.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, exitConfirmed: true });
    expect(t1.end.completion).toMatchObject({ sessionKept: true });
    expect(t1.end.observedLocator).toMatch(/^[0-9a-f-]{36}$/);
    expect(t1.end.completion!.savedLocator).toBe(t1.end.observedLocator);
    expect(t1.events.some((e) => (e as { type?: string }).type === 'result')).toBe(true);
    session.expectTurn(t1.requests, { prompt: 'Please remember MARK-ONE.', reply: 'ack MARK-ONE' });

    const t2 = await runTurn('MARK-TWO');
    // Each `claude -p` process exits at its turn's end: the next turn resumes the session in a new one.
    expect(t2.begun).toMatchObject({ contextState: ContextState.RESTORED, locator: t1.end.observedLocator });
    expect(t2.end.observedLocator).toBe(t1.end.observedLocator);
    session.expectTurn(t2.requests, { prompt: 'Please remember MARK-TWO.', reply: 'ack MARK-TWO' });
  });

  it('a repeat with the same idempotency key answers the stored end and runs nothing', async () => {
    const key = 'run-turn-repeat-1';
    const first = await runTurn('MARK-THREE', key);
    session.expectTurn(first.requests, { prompt: 'Please remember MARK-THREE.', reply: 'ack MARK-THREE' });
    const again = await runTurn('MARK-THREE', key);
    expect(again.requests).toHaveLength(0);
    expect(again.begun.turnId).toBe(first.begun.turnId);
    expect(again.end.completion).toEqual(first.end.completion);
  });

  it('after a drain moves the writable layer to another host, RunTurn there resumes the same session with the whole history', async () => {
    const saved = (await h.runner.getGroupState({ groupId })).group?.members[0]?.savedLocator;
    await h.drainToHostB(groupId);
    const t = await runTurn('MARK-FOUR');
    expect(t.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator: saved });
    expect(t.end.observedLocator).toBe(saved);
    session.expectTurn(t.requests, { prompt: 'Please remember MARK-FOUR.', reply: 'ack MARK-FOUR' });
  });
});
