// completeTurnEvidence (R-S5, R-S6): what the driver's facts add to a detector's evidence on the wire.
import { describe, expect, it } from 'vitest';
import { TurnEndKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import { completeTurnEvidence, type TurnEndEvidence } from '../../../src/runner-sdk/index.ts';

const base: TurnEndEvidence = {
  cli: 'claude-code',
  nativeTurnEnded: true,
  succeeded: true,
  endKind: 'result',
  observedLocator: 'sess-1',
  processWillExit: false,
  transportUsable: true,
  stats: { events: 1, ignored: 0, invalid: 0 },
};

describe('completeTurnEvidence', () => {
  it('a process kept running stays reusable (LIVE next); a confirmed exit means the process is gone (RESTORED next)', () => {
    expect(completeTurnEvidence(base, { cleanupFinished: true }).evidence).toMatchObject({ processExited: false, exitConfirmed: false });
    expect(completeTurnEvidence(base, { cleanupFinished: true, exitConfirmed: true, exitCode: 0 }).evidence).toMatchObject({ processExited: true, exitConfirmed: true, exitCode: 0 });
  });

  it('api_retry: the process is let exit; unless the driver saw it exit, the control plane reclaims the slot (R-S6)', () => {
    const retry: TurnEndEvidence = { ...base, succeeded: false, endKind: 'api_retry', processWillExit: true };
    expect(completeTurnEvidence(retry, { cleanupFinished: true }).evidence).toMatchObject({ kind: TurnEndKind.API_RETRY, processExited: true, exitConfirmed: false, exitCode: undefined });
    expect(completeTurnEvidence(retry, { cleanupFinished: true, exitConfirmed: true, exitCode: 1 }).evidence).toMatchObject({ processExited: true, exitConfirmed: true, exitCode: 1 });
  });

  it('nothing decisive seen is never a native end', () => {
    const none: TurnEndEvidence = { ...base, nativeTurnEnded: false, succeeded: false, endKind: 'none', transport: { kind: 'timeout' } };
    expect(completeTurnEvidence(none, { cleanupFinished: true }).evidence).toMatchObject({ kind: TurnEndKind.TIMEOUT, nativeTurnEnded: false, succeeded: false });
  });
});
