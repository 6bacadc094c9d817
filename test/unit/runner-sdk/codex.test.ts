// Codex app-server JSON-RPC fixtures through the detector (R-S5: only the current turn's
// turn/completed ends the turn).
import { describe, expect, it } from 'vitest';
import { createCodexDetector } from '../../../src/runner-sdk/detectors/index.ts';
import { driveFixture } from './fixtures.ts';

const cli = 'codex';
const thread = '019a0c3e-7b1f-7d30-9c41-5e2f8a6b1c01';

describe('Codex detector', () => {
  it('ends on turn/completed of the turn turn/start returned; locator = thread id', async () => {
    const { evidence, read } = await driveFixture(cli, 'completed.jsonl', createCodexDetector());
    expect(read.outcome).toBe('stopped');
    expect(evidence).toMatchObject({
      cli,
      nativeTurnEnded: true,
      succeeded: true,
      endKind: 'turn_completed',
      nativeTurnId: 'turn_1',
      observedLocator: thread,
      assistantText: 'There are two files.',
      processWillExit: false,
    });
    expect(evidence.locatorConflict).toBeUndefined();
  });

  it('a failed turn is a native end that failed, with the turn error', async () => {
    const { evidence } = await driveFixture(cli, 'failed.jsonl', createCodexDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, nativeTurnId: 'turn_4', observedLocator: thread });
    expect(evidence.error).toBe('stream disconnected before completion: upstream 502');
  });

  it('completions of earlier turns are ignored; the current one ends the turn', async () => {
    const d = createCodexDetector();
    const { evidence } = await driveFixture(cli, 'old-turn-completion.jsonl', d);
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, nativeTurnId: 'turn_3', assistantText: 'Resumed and done.' });
    expect(evidence.stats.ignored).toBe(3);
  });

  it('a completion for another turn id never ends the current turn', async () => {
    const d = createCodexDetector({ turnId: 'turn_99' });
    const { evidence } = await driveFixture(cli, 'completed.jsonl', d);
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect', nativeTurnId: 'turn_99' });
  });

  it('sub-agent threads neither replace the locator nor end the turn', async () => {
    const { evidence } = await driveFixture(cli, 'subagent-thread.jsonl', createCodexDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, observedLocator: thread, assistantText: 'Root answer.' });
    expect(evidence.locatorConflict).toBeUndefined();
  });

  it('a disconnect mid-turn is not a turn end', async () => {
    const { evidence } = await driveFixture(cli, 'disconnect-mid-turn.jsonl', createCodexDetector());
    expect(evidence).toMatchObject({ nativeTurnEnded: false, succeeded: false, endKind: 'disconnect', transportUsable: false, assistantText: 'Half an ans' });
  });

  it('a cancelled turn confirmed by turn/completed(interrupted) is a native, failed end', async () => {
    const d = createCodexDetector();
    d.onTransport('cancelled', 'turn/interrupt sent');
    const { evidence } = await driveFixture(cli, 'interrupted.jsonl', d);
    expect(evidence).toMatchObject({
      nativeTurnEnded: true,
      succeeded: false,
      endKind: 'turn_completed',
      error: 'turn interrupted',
      transport: { kind: 'cancelled', detail: 'turn/interrupt sent' },
    });
  });

  it('an error response to turn/start is a rejection, never a turn end', async () => {
    const { evidence } = await driveFixture(cli, 'rejected.jsonl', createCodexDetector({ turnStartRequestId: 3 }));
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'rejected' });
    expect(evidence.error).toContain('thread not found');
  });

  it('flags a resumed thread that differs from the expected locator', async () => {
    const { evidence } = await driveFixture(cli, 'completed.jsonl', createCodexDetector({ expectedLocator: 'thr-expected' }));
    expect(evidence.locatorConflict).toEqual({ kept: 'thr-expected', other: thread, source: 'expected' });
  });

  it('an unknown status is a native end but never a success', () => {
    const d = createCodexDetector({ turnId: 't1' });
    d.observe({ method: 'turn/completed', params: { turn: { id: 't1', status: 'inProgress' } } });
    expect(d.result()).toMatchObject({ nativeTurnEnded: true, succeeded: false });
  });

  it('a completion before the current turn is known cannot be attributed', () => {
    const d = createCodexDetector();
    d.observe({ method: 'turn/completed', params: { turn: { id: 't1', status: 'completed' } } });
    expect(d.result().nativeTurnEnded).toBe(false);
  });
});
