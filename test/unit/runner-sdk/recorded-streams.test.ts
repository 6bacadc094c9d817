// The turn-end detectors on streams RECORDED from the real pinned binaries
// (test/support/record-cli-streams.ts; issue 16 item 3, item 5): OpenCode 1.18.33 and Kilo 7.7.7
// behind the project's live bridge v4 (`live-bridge turn` output), and `codex exec --json` of Codex
// 0.171.0. Each file starts with a `{"recorded": …}` note, which every detector ignores as invalid
// input. The hand-written fixtures next to them cover shapes these runs do not produce.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { createCodexExecDetector, createDetector, type TurnEndDetector } from '../../../src/runner-sdk/detectors/index.ts';
import { driveFixture, fixtureEvents } from './fixtures.ts';

const note = (cli: string, name: string): { turnId?: string; prompt?: string; exit: number } =>
  JSON.parse(readFileSync(new URL(`../../fixtures/cli-streams/${cli}/${name}`, import.meta.url), 'utf8').split('\n')[0]!) as { turnId?: string; prompt?: string; exit: number };

describe.each(['opencode', 'kilo'] as const)('live-bridge detector on %s recorded behind the bridge', (cli) => {
  const detector = (name: string, expectedLocator?: string): TurnEndDetector => createDetector(cli, { turnId: note(cli, name).turnId!, ...(expectedLocator !== undefined ? { expectedLocator } : {}) });
  const root = (fixtureEvents(cli, 'recorded-new-session.jsonl')[1] as { properties: { sessionID: string } }).properties.sessionID;

  it('a new session: settled, succeeded, the root session and the assistant\'s own text', async () => {
    const { evidence } = await driveFixture(cli, 'recorded-new-session.jsonl', detector('recorded-new-session.jsonl'));
    expect(evidence).toMatchObject({ cli, nativeTurnEnded: true, succeeded: true, endKind: 'settled', observedLocator: root, assistantText: 'ack MARK-ONE', nativeTurnId: 'turn-1' });
    expect(evidence.locatorConflict).toBeUndefined();
  });

  it('a resumed session: the same root, only this turn\'s text', async () => {
    const { evidence } = await driveFixture(cli, 'recorded-resumed.jsonl', detector('recorded-resumed.jsonl', root));
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, observedLocator: root, assistantText: 'ack MARK-TWO' });
  });

  it('a Task child session: its text is not the root\'s, its permission answered by the bridge, the root settles', async () => {
    const { evidence } = await driveFixture(cli, 'recorded-task-child-permission.jsonl', detector('recorded-task-child-permission.jsonl', root));
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, observedLocator: root, assistantText: 'delegating\ndone' });
    expect(evidence.locatorConflict).toBeUndefined();
    const types = fixtureEvents(cli, 'recorded-task-child-permission.jsonl').map((e) => (e as { type?: string }).type);
    expect(types).toContain('permission.asked');
    expect(types).toContain('bridge.permission.replied');
  });

  it('a failed call: settled, failed, with the CLI\'s own error', async () => {
    const { evidence } = await driveFixture(cli, 'recorded-failed-call.jsonl', detector('recorded-failed-call.jsonl', root));
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'settled', observedLocator: root });
    expect(evidence.error).toContain('fake failure');
  });

  it('a call the CLI retried by itself: one successful turn', async () => {
    const { evidence } = await driveFixture(cli, 'recorded-internal-retry.jsonl', detector('recorded-internal-retry.jsonl', root));
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, assistantText: 'ack MARK-FIVE' });
    expect(fixtureEvents(cli, 'recorded-internal-retry.jsonl').some((e) => JSON.stringify(e).includes('"type":"retry"'))).toBe(true);
  });

  it('a stream the runner dropped mid-turn: never a native end', async () => {
    expect(note(cli, 'recorded-stream-dropped.jsonl').exit).toBe(130);
    const { evidence } = await driveFixture(cli, 'recorded-stream-dropped.jsonl', detector('recorded-stream-dropped.jsonl', root));
    expect(evidence).toMatchObject({ nativeTurnEnded: false, succeeded: false, transportUsable: false });
  });

  it('events of the other recorded turns never end this one', async () => {
    const d = createDetector(cli, { turnId: 'turn-99' });
    for (const name of ['recorded-new-session.jsonl', 'recorded-resumed.jsonl', 'recorded-failed-call.jsonl']) for (const e of fixtureEvents(cli, name)) d.observe(e);
    expect(d.result()).toMatchObject({ nativeTurnEnded: false, endKind: 'none' });
  });
});

describe('codex exec --json detector on Codex 0.171.0 recorded', () => {
  const thread = (fixtureEvents('codex-exec', 'new-thread.jsonl')[1] as { thread_id: string }).thread_id;

  it('a new thread: turn.completed, the thread id, the agent\'s text; the process exits after it', async () => {
    const { evidence } = await driveFixture('codex-exec', 'new-thread.jsonl', createCodexExecDetector());
    expect(evidence).toMatchObject({ cli: 'codex', nativeTurnEnded: true, succeeded: true, endKind: 'turn_completed', observedLocator: thread, assistantText: 'ack MARK-ONE', processWillExit: true });
    expect(evidence.stats.invalid).toBe(1); // the recording note
  });

  it('a resumed thread keeps its id; resuming another id is a conflict (R-S2)', async () => {
    const { evidence } = await driveFixture('codex-exec', 'resumed.jsonl', createCodexExecDetector({ expectedLocator: thread }));
    expect(evidence).toMatchObject({ succeeded: true, observedLocator: thread, assistantText: 'ack MARK-TWO' });
    expect(evidence.locatorConflict).toBeUndefined();
    const other = await driveFixture('codex-exec', 'resumed.jsonl', createCodexExecDetector({ expectedLocator: '01a23291-0000-7000-8000-000000000000' }));
    expect(other.evidence.locatorConflict).toEqual({ kept: '01a23291-0000-7000-8000-000000000000', other: thread, source: 'expected' });
  });

  it('a call Codex retried by itself: one successful turn', async () => {
    const { evidence } = await driveFixture('codex-exec', 'internal-retry.jsonl', createCodexExecDetector({ expectedLocator: thread }));
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, assistantText: 'ack MARK-THREE' });
  });

  it('retries spent: turn.failed is a failed native end with Codex\'s error; its reconnect errors are not ends', async () => {
    const events = fixtureEvents('codex-exec', 'failed.jsonl');
    const d = createCodexExecDetector({ expectedLocator: thread });
    for (const e of events.slice(0, -1)) d.observe(e);
    expect(d.nativeTurnEnded).toBe(false);
    d.observe(events.at(-1));
    expect(d.result()).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'turn_completed', observedLocator: thread });
    expect(d.result().error).toContain('high demand');
  });

  it('a stream that ends before turn.completed is not an end (the process exited first)', async () => {
    const d = createCodexExecDetector();
    for (const e of fixtureEvents('codex-exec', 'new-thread.jsonl').slice(0, -1)) d.observe(e);
    d.onTransport('disconnect', 'exec exited');
    expect(d.result()).toMatchObject({ nativeTurnEnded: false, succeeded: false, endKind: 'disconnect' });
  });
});
