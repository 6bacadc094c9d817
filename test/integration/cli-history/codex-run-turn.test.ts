// Turns through the fleet with the PINNED Codex CLI (R-I9, R-P1, R-S1..R-S5, R-G3, R-G5): the
// runner holds only the gRPC address and its certificate — no Docker socket, no Exec of its own —
// and calls RunTurn; the fleet begins the turn, runs `codex exec --json` (NEW) or `codex exec resume
// --json -- <thread>` (the saved thread) in the member container, one process per turn, the prompt
// written to its stdin; the operator's CLI profile points Codex at the loopback fake's Responses
// API with `-c` options (no config file in the member); the end is read server-side by the SDK's
// `codex exec` detector (`turn.completed` / `turn.failed`) and the turn completed with it. Every
// request the model API received is checked in full by the history checker (CODEX_HISTORY):
//   1. NEW, then the same thread resumed: RESTORED (each process exits at its turn's end, so the
//      fleet never answers LIVE for Codex), the history sent once; a prompt that looks like flags
//      (`--`, `resume`) reaches the model as text;
//   2. a failing model API (Codex's retries cut short by the profile): a failed, ended turn, the
//      thread kept, exit 1; the next turn carries the failed prompt once;
//   3. stop → host killed → restored on host-b → RESTORED there, the same thread, the whole history.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { CODEX_PATH, CODEX_VERSION, codexImageFiles } from '../../support/codex-cli.ts';
import { SessionHistory, expectNegativeControlsFail } from '../../support/history-checker.ts';
import { CODEX_HISTORY } from '../../support/history-profiles.ts';
import { startHistoryFleet, type HistoryFleet } from './history-fleet.ts';
import { runTurnThroughFleet, type RanThroughFleet } from './run-turn.ts';

let h: HistoryFleet;
let groupId = '';
const session = new SessionHistory(CODEX_HISTORY);
const prompt = (marker: string): string => `Please remember ${marker}.`;

/**
 * The operator's Codex profile: the fake as a Responses-API provider, given as `codex -c` options
 * (what test/support/codex-cli.ts writes as config.toml), with Codex's own retries cut short so a
 * failing model fails the turn at once (one stream retry: two requests).
 */
function codexArgs(apiUrl: string): string[] {
  const settings = [
    'model="fake-model"', 'model_provider="fake"', 'model_providers.fake.name="fake"', `model_providers.fake.base_url="${apiUrl}/v1"`,
    'model_providers.fake.wire_api="responses"', 'model_providers.fake.request_max_retries=0', 'model_providers.fake.stream_max_retries=1',
  ];
  return settings.flatMap((s) => ['-c', s]);
}

beforeAll(async () => {
  h = await startHistoryFleet({ bridgeVersion: 4, extraFiles: codexImageFiles(), tagSuffix: `codex-${CODEX_VERSION}` }, {
    config: (apiUrl) => ({ cliProfiles: { codex: { binary: CODEX_PATH, env: { HOME: '/root' }, args: codexArgs(apiUrl) } } }),
  });
}, 600_000);

afterAll(async () => {
  await h?.cleanup();
});

/** One successful turn through RunTurn; every request checked. */
async function turn(text: string, marker: string): Promise<RanThroughFleet> {
  const t = await runTurnThroughFleet(h, groupId, 'codex', text);
  expect(t.end.evidence, JSON.stringify(t.events).slice(-2000)).toMatchObject({ nativeTurnEnded: true, succeeded: true, processExited: true, exitConfirmed: true, exitCode: 0 });
  expect(t.end.completion).toMatchObject({ sessionKept: true, nextContextState: ContextState.RESTORED });
  session.expectTurn(t.requests, { prompt: text, reply: `ack ${marker}` });
  return t;
}

describe(`RunTurn with the pinned Codex ${CODEX_VERSION} (codex exec --json, one process per turn)`, () => {
  let locator = '';

  it('NEW, then the same thread resumed: RESTORED with the history sent once; a prompt that looks like flags stays text', async () => {
    const opened = await h.runner.openGroup({ conversationId: 'run-turn-codex', members: [{ memberId: 'codex', cli: 'codex' }] });
    groupId = opened.group!.groupId;
    const t1 = await turn(prompt('MARK-ONE'), 'MARK-ONE');
    expect(t1.begun.contextState).toBe(ContextState.NEW);
    locator = t1.end.observedLocator;
    expect(locator).toMatch(/^[0-9a-f-]{36}$/);
    expect(t1.end.completion!.savedLocator).toBe(locator);
    // The CLI's own events, as Codex printed them.
    expect(t1.events.map((e) => (e as { type?: string }).type)).toEqual(expect.arrayContaining(['thread.started', 'turn.started', 'item.completed', 'turn.completed']));
    expect(t1.events).toContainEqual({ type: 'thread.started', thread_id: locator });

    // `codex exec` exits at its turn's end: the next turn resumes the thread in a new process.
    const text = `-- resume --last ${prompt('MARK-TWO')}`;
    const t2 = await turn(text, 'MARK-TWO');
    expect(t2.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
    expect(t2.end.observedLocator).toBe(locator);
    expectNegativeControlsFail(session, t2.requests.at(-1)!);
  });

  it('a failing model API ends the turn failed with the thread kept; the next turn carries the failed prompt once', async () => {
    h.api.failNext(1_000, 500);
    const failed = await runTurnThroughFleet(h, groupId, 'codex', prompt('MARK-THREE')).finally(() => h.api.failNext(0, 500));
    expect(failed.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
    expect(failed.end.evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, exitConfirmed: true, exitCode: 1 });
    expect(failed.end.evidence!.errorMessage).not.toBe('');
    expect(failed.events).toContainEqual(expect.objectContaining({ type: 'turn.failed' }));
    expect(failed.end.completion).toMatchObject({ sessionKept: true, savedLocator: locator });
    expect(failed.requests.length).toBeGreaterThan(0);
    session.expectTurn(failed.requests, { prompt: prompt('MARK-THREE'), reply: null });
    const retried = await turn(prompt('MARK-THREE'), 'MARK-THREE');
    expect(retried.begun).toMatchObject({ contextState: ContextState.RESTORED, locator });
  });

  it('stop, host killed, restored on host-b: RESTORED there on the same thread with the whole history', async () => {
    expect((await h.runner.stopGroup({ groupId })).outcome).toBe(StopOutcome.CLEAN);
    await h.killHostAAndRestoreOnB(groupId);
    const t = await turn(prompt('MARK-FOUR'), 'MARK-FOUR');
    expect(t.begun).toMatchObject({ contextState: ContextState.RESTORED, hostId: 'host-b', locator });
    expect(t.end.observedLocator).toBe(locator);
  });
});
