// Claude Code 2.1.220 stream-json fixtures through the detector (R-S4, R-S5, R-S6).
import { describe, expect, it } from 'vitest';
import { createClaudeCodeDetector } from '../../../src/runner-sdk/detectors/index.ts';
import { driveFixture, fixtureEvents } from './fixtures.ts';

const cli = 'claude-code';

describe('Claude Code detector', () => {
  it('ends at the root result; sub-agent events never replace the root id or end the turn (R-S4)', async () => {
    const { evidence, read } = await driveFixture(cli, 'success-with-subagent.jsonl', createClaudeCodeDetector());
    expect(evidence).toMatchObject({
      cli,
      nativeTurnEnded: true,
      succeeded: true,
      endKind: 'result',
      observedLocator: '8f14e45f-ceea-467f-a0e6-0b1c7e5d2a01',
      processWillExit: false,
      transportUsable: true,
      assistantText: 'There are 3 TODOs.',
    });
    expect(evidence.locatorConflict).toBeUndefined();
    expect(evidence.error).toBeUndefined();
    expect(evidence.transport).toBeUndefined();
    // The sub-agent's assistant event and its result are ignored.
    expect(evidence.stats.ignored).toBe(2);
    expect(read.outcome).toBe('stopped');
    expect(read.stats.malformed).toBe(1);
  });

  it('is_error decides: an error result is a native end that failed', async () => {
    const { evidence } = await driveFixture(cli, 'error-result.jsonl', createClaudeCodeDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'result', observedLocator: '45c48cce-2e2d-4fbd-a0a0-cdb6d3b9a7e1' });
    expect(evidence.error).toMatch(/^error_during_execution: API Error: 500/);
    expect(evidence.assistantText).toBe('Working on it');
  });

  it('system/api_retry ends the turn, keeps the locator and lets the process exit (R-S6)', async () => {
    const { evidence, read } = await driveFixture(cli, 'api-retry.jsonl', createClaudeCodeDetector());
    expect(evidence).toMatchObject({
      nativeTurnEnded: true,
      succeeded: false,
      endKind: 'api_retry',
      processWillExit: true,
      observedLocator: 'd3d94468-02a4-4e1c-9c5f-8a0e3e7e9b11',
    });
    expect(evidence.error).toBe('api_retry: overloaded_error (attempt 1/10)');
    expect(read.outcome).toBe('stopped');
  });

  it('after api_retry a later result cannot turn the ended turn into a success', () => {
    const d = createClaudeCodeDetector();
    for (const e of fixtureEvents(cli, 'api-retry.jsonl')) d.observe(e);
    expect(d.result()).toMatchObject({ endKind: 'api_retry', succeeded: false, processWillExit: true });
  });

  it('a turn without retry keeps its process (LIVE next time)', async () => {
    const { evidence } = await driveFixture(cli, 'error-result.jsonl', createClaudeCodeDetector());
    expect(evidence.processWillExit).toBe(false);
  });

  it('a disconnect mid-turn is not a turn end (R-S5)', async () => {
    const { evidence, read } = await driveFixture(cli, 'disconnect-mid-turn.jsonl', createClaudeCodeDetector());
    expect(read.outcome).toBe('ended');
    expect(evidence).toMatchObject({
      nativeTurnEnded: false,
      succeeded: false,
      endKind: 'disconnect',
      transportUsable: false,
      observedLocator: '6512bd43-d9ca-4d6a-b8f1-1f2c3d4e5f60',
    });
    expect(evidence.error).toMatch(/^disconnect: stream ended/);
  });

  it('conflicting root ids in one turn are flagged; the first is kept', async () => {
    const { evidence } = await driveFixture(cli, 'root-conflict.jsonl', createClaudeCodeDetector());
    expect(evidence.observedLocator).toBe('c20ad4d7-6fe9-4759-8aa2-7f0e1d2c3b4a');
    expect(evidence.locatorConflict).toEqual({ kept: 'c20ad4d7-6fe9-4759-8aa2-7f0e1d2c3b4a', other: 'aab3238922bcc25a6f606eb525ffdc56', source: 'observed' });
    expect(evidence.nativeTurnEnded).toBe(true);
  });

  it('a resumed session reporting another id is a conflict against the expected locator (R-S2)', async () => {
    const d = createClaudeCodeDetector({ expectedLocator: '00000000-0000-4000-8000-000000000000' });
    const { evidence } = await driveFixture(cli, 'error-result.jsonl', d);
    expect(evidence.observedLocator).toBe('45c48cce-2e2d-4fbd-a0a0-cdb6d3b9a7e1');
    expect(evidence.locatorConflict).toMatchObject({ kept: '00000000-0000-4000-8000-000000000000', source: 'expected' });
  });

  it('a sub-agent result never ends the root turn', async () => {
    const { evidence } = await driveFixture(cli, 'subagent-result-only.jsonl', createClaudeCodeDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect', observedLocator: '9bf31c7f-f062-4b2b-9f3e-2c1b0a9f8e7d' });
    expect(evidence.locatorConflict).toBeUndefined();
  });

  it('ignores junk without crashing and bounds ids', () => {
    const d = createClaudeCodeDetector();
    for (const e of [null, 42, 'x', [], { type: 7 }, { type: 'system', subtype: 'init', session_id: 'x'.repeat(10_000) }, { type: 'system', session_id: { a: 1 } }]) d.observe(e);
    const ev = d.result();
    expect(ev).toMatchObject({ nativeTurnEnded: false, endKind: 'none', stats: { events: 7, invalid: 7 } });
    expect(ev.observedLocator).toBeUndefined();
  });

  it('a cancellation is recorded but is not an end; the CLI can still confirm the end', () => {
    const d = createClaudeCodeDetector();
    d.observe({ type: 'system', subtype: 'init', session_id: 'abc-1' });
    d.onTransport('cancelled', 'user pressed stop');
    expect(d.result()).toMatchObject({ nativeTurnEnded: false, endKind: 'cancelled', error: 'cancelled: user pressed stop' });
    d.observe({ type: 'result', subtype: 'error_during_execution', is_error: true, session_id: 'abc-1', result: 'interrupted' });
    expect(d.result()).toMatchObject({ nativeTurnEnded: true, endKind: 'result', succeeded: false, transport: { kind: 'cancelled' } });
  });

  it('events after a disconnect are not this turn', () => {
    const d = createClaudeCodeDetector();
    d.onTransport('disconnect');
    d.observe({ type: 'result', subtype: 'success', is_error: false, session_id: 'abc-1' });
    expect(d.result()).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect', stats: { ignored: 1 } });
    expect(d.result().observedLocator).toBeUndefined();
  });
});
