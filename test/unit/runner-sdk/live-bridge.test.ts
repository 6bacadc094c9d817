// OpenCode / Kilo live-bridge v4 fixtures through the detector (R-S5, R-S7): settled of the current
// bridge turn ends it; only the root assistant's own text by role metadata; earlier turns ignored.
import { describe, expect, it } from 'vitest';
import { createDetector, createKiloDetector, createOpenCodeDetector, DetectorOptionError } from '../../../src/runner-sdk/detectors/index.ts';
import { driveFixture, fixtureEvents } from './fixtures.ts';

const root = 'ses_4f2a9c1e7ffeRootAbCdEf01';

describe('OpenCode detector (live bridge v4)', () => {
  it('ends on settled of the current turn; late role metadata resolves held parts; old turns ignored', async () => {
    const { evidence, read } = await driveFixture('opencode', 'interleaved-late-metadata.jsonl', createOpenCodeDetector({ turnId: 7 }));
    expect(read.outcome).toBe('stopped');
    expect(evidence).toMatchObject({
      cli: 'opencode',
      nativeTurnEnded: true,
      succeeded: true,
      endKind: 'settled',
      nativeTurnId: '7',
      observedLocator: root,
      // Not the prompt echo, not the earlier turn, not the role-less part, not the synthetic part.
      assistantText: 'The README describes a fleet manager.',
    });
    expect(evidence.stats.ignored).toBe(3);
  });

  it('role metadata trailing settled still resolves the held part', () => {
    const d = createOpenCodeDetector({ turnId: 't-12' });
    for (const e of fixtureEvents('opencode', 'metadata-after-settled.jsonl')) d.observe(e);
    expect(d.result()).toMatchObject({ nativeTurnEnded: true, succeeded: true, assistantText: 'Done.' });
  });

  it('a part whose role never arrives is dropped at turn end, not guessed', () => {
    const d = createOpenCodeDetector({ turnId: 't-12' });
    const events = fixtureEvents('opencode', 'metadata-after-settled.jsonl').slice(0, 3);
    for (const e of events) d.observe(e);
    expect(d.result()).toMatchObject({ nativeTurnEnded: true, succeeded: true });
    expect(d.result().assistantText).toBeUndefined();
  });

  it('Task child sessions: their text and errors are not the root turn', async () => {
    const { evidence } = await driveFixture('opencode', 'child-session.jsonl', createOpenCodeDetector({ turnId: 3 }));
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: true, observedLocator: root, assistantText: 'Explored: 3 modules.' });
    expect(evidence.locatorConflict).toBeUndefined();
  });

  it('session.error of the root session fails the settled turn', async () => {
    const { evidence } = await driveFixture('opencode', 'session-error.jsonl', createOpenCodeDetector({ turnId: 9 }));
    expect(evidence).toMatchObject({ nativeTurnEnded: true, succeeded: false, endKind: 'settled', error: 'APIError: Overloaded' });
  });

  it('a disconnect mid-turn is not a turn end and yields no role-less text', async () => {
    const { evidence } = await driveFixture('opencode', 'disconnect-mid-turn.jsonl', createOpenCodeDetector({ turnId: 4 }));
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect', transportUsable: false, observedLocator: root });
    expect(evidence.assistantText).toBeUndefined();
  });

  it('settled of an earlier turn (or without a turn id) never ends the current turn', async () => {
    const { evidence } = await driveFixture('opencode', 'only-old-turn-settled.jsonl', createOpenCodeDetector({ turnId: 11 }));
    expect(evidence).toMatchObject({ nativeTurnEnded: false, endKind: 'disconnect' });
    expect(evidence.stats.ignored).toBe(3);
  });

  it('needs a valid bridge turn id', () => {
    expect(() => createOpenCodeDetector({ turnId: '' })).toThrow(DetectorOptionError);
    expect(() => createDetector('kilo')).toThrow(DetectorOptionError);
  });
});

describe('Kilo detector (same bridge)', () => {
  it('collects only the assistant text and ends on settled', async () => {
    const { evidence } = await driveFixture('kilo', 'success.jsonl', createKiloDetector({ turnId: 1 }));
    expect(evidence).toMatchObject({ cli: 'kilo', nativeTurnEnded: true, succeeded: true, observedLocator: 'ses_5b3cad2f8001KiloRoot00001', assistantText: 'Hello from Kilo.' });
  });

  it('a bridge abort (failed permission reply) settles as a failure', async () => {
    const { evidence } = await driveFixture('kilo', 'permission-abort.jsonl', createDetector('kilo', { turnId: 2 }));
    expect(evidence).toMatchObject({ cli: 'kilo', nativeTurnEnded: true, succeeded: false, error: 'permission reply failed twice; turn aborted' });
  });
});
