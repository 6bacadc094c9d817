// Core idle-stop and protection rules (core/idle-stop.ts): when an idle group is stopped, what blocks
// it, the start grace, the wire form of the setting, and which groups a host loss would make LOST.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { afterTurnStep, decideIdleStop, parseIdleStopAfterMs, protection, IDLE_STOP_MAX_MS, type AfterTurnView, type IdleStopView } from '../../../src/core/idle-stop.ts';
import { MEMBER_PHASES } from '../../../src/core/member-session.ts';
import { GROUP_STATES } from '../../../src/core/group.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const idle = (over: Partial<IdleStopView> = {}): IdleStopView => ({
  state: 'RUNNING', evacuating: false, lastActivityAtMs: 1_000, lastTurnCompletedAtMs: 1_000,
  members: [{ phase: 'RETAINED', exitUnconfirmed: false }], ...over,
});
const timing = { after: 600_000, startGraceMs: 30_000 } as const;

describe('decideIdleStop', () => {
  it('stops a group idle for idleStopAfter after its last completed turn, and waits until then', () => {
    expect(decideIdleStop(idle(), timing, 1_000 + 599_999)).toEqual({ action: 'wait', atMs: 601_000 });
    expect(decideIdleStop(idle(), timing, 601_000)).toEqual({ action: 'stop' });
  });

  it('0 stops right after a completed turn; a start with no turn since gets the start grace', () => {
    expect(decideIdleStop(idle(), { after: 0, startGraceMs: 30_000 }, 1_000)).toEqual({ action: 'stop' });
    const started = idle({ lastActivityAtMs: 5_000, lastTurnCompletedAtMs: 1_000 });
    expect(decideIdleStop(started, { after: 0, startGraceMs: 30_000 }, 5_000)).toEqual({ action: 'wait', atMs: 35_000 });
    expect(decideIdleStop(started, { after: 0, startGraceMs: 30_000 }, 35_000)).toEqual({ action: 'stop' });
  });

  it('0 with a hand-off: the idle queue leaves a just-completed turn to its completing call for that long', () => {
    const t = { after: 0, startGraceMs: 30_000, turnEndHandoffMs: 15_000 };
    expect(decideIdleStop(idle(), t, 1_000)).toEqual({ action: 'wait', atMs: 16_000 });
    expect(decideIdleStop(idle(), t, 16_000)).toEqual({ action: 'stop' });
    // The hand-off applies to 0 only; other settings and the start grace are unchanged.
    expect(decideIdleStop(idle(), { ...t, after: 5_000 }, 6_000)).toEqual({ action: 'stop' });
    expect(decideIdleStop(idle({ lastActivityAtMs: 5_000 }), t, 5_000)).toEqual({ action: 'wait', atMs: 35_000 });
  });

  it('never: not a candidate', () => {
    expect(decideIdleStop(idle(), { after: 'never', startGraceMs: 0 }, 1e12)).toEqual({ action: 'none', why: 'never' });
  });

  it('a turn in flight, an unconfirmed exit, an unconfirmed member or an evacuation block it', () => {
    const late = 1e12;
    expect(decideIdleStop(idle({ members: [{ phase: 'RETAINED', exitUnconfirmed: false }, { phase: 'IN_TURN', exitUnconfirmed: false }] }), timing, late)).toEqual({ action: 'none', why: 'turn_in_flight' });
    expect(decideIdleStop(idle({ members: [{ phase: 'RETAINED', exitUnconfirmed: true }] }), timing, late)).toEqual({ action: 'none', why: 'exit_unconfirmed' });
    expect(decideIdleStop(idle({ members: [{ phase: 'UNCONFIRMED', exitUnconfirmed: false }] }), timing, late)).toEqual({ action: 'none', why: 'member_unconfirmed' });
    expect(decideIdleStop(idle({ evacuating: true }), timing, late)).toEqual({ action: 'none', why: 'evacuating' });
    expect(decideIdleStop(idle({ state: 'STOPPED' }), timing, late)).toEqual({ action: 'none', why: 'not_running' });
  });

  it('property: stop only when RUNNING, idle members only, and the deadline passed; never before the last activity + setting', () => {
    const member = fc.record({ phase: fc.constantFrom(...MEMBER_PHASES), exitUnconfirmed: fc.boolean() });
    fc.assert(fc.property(
      fc.constantFrom(...GROUP_STATES), fc.boolean(), fc.nat(1e9), fc.option(fc.nat(1e9), { nil: undefined }), fc.array(member, { minLength: 1, maxLength: 4 }),
      fc.oneof(fc.nat(1e7), fc.constant('never' as const)), fc.nat(1e6), fc.nat(2e9),
      (state, evacuating, last, lastTurn, members, after, startGraceMs, now) => {
        const d = decideIdleStop({ state, evacuating, lastActivityAtMs: last, lastTurnCompletedAtMs: lastTurn, members }, { after, startGraceMs }, now);
        if (d.action !== 'stop') return;
        expect(state).toBe('RUNNING');
        expect(evacuating).toBe(false);
        expect(after).not.toBe('never');
        for (const m of members) {
          expect(['FRESH', 'RETAINED', 'LOST']).toContain(m.phase);
          expect(m.exitUnconfirmed).toBe(false);
        }
        expect(now).toBeGreaterThanOrEqual(last + (after as number));
        if (last > (lastTurn ?? 0)) expect(now).toBeGreaterThanOrEqual(last + startGraceMs);
      },
    ), { numRuns: PROPERTY_RUNS });
  });
});

describe('afterTurnStep (idleStopAfter 0: protected before the completion answers)', () => {
  const at = (over: Partial<AfterTurnView> = {}): AfterTurnView => ({ ...idle(), checkpointCovers: false, ...over });

  it('walks stop -> await a stop -> checkpoint -> protected', () => {
    expect(afterTurnStep(at(), 1_000)).toEqual({ step: 'stop' });
    // No hand-off and no start grace for the completing call itself.
    expect(afterTurnStep(at(), 1_000 + 1)).toEqual({ step: 'stop' });
    expect(afterTurnStep(at({ state: 'STOPPING' }), 1_000)).toEqual({ step: 'await_stop' });
    expect(afterTurnStep(at({ state: 'STOPPED', stopClean: true }), 1_000)).toEqual({ step: 'checkpoint' });
    expect(afterTurnStep(at({ state: 'STOPPED', stopClean: true, checkpointCovers: true }), 1_000)).toEqual({ step: 'protected' });
    expect(afterTurnStep(at({ state: 'MIGRATING' }), 1_000)).toEqual({ step: 'protected' });
  });

  it('says why a group cannot be protected now', () => {
    expect(afterTurnStep(at({ state: 'STOPPED', stopClean: false }), 1_000)).toEqual({ step: 'unprotected', why: 'stopped_unclean' });
    expect(afterTurnStep(at({ members: [{ phase: 'RETAINED', exitUnconfirmed: false }, { phase: 'IN_TURN', exitUnconfirmed: false }] }), 1_000)).toEqual({ step: 'unprotected', why: 'turn_in_flight' });
    expect(afterTurnStep(at({ members: [{ phase: 'UNCONFIRMED', exitUnconfirmed: false }] }), 1_000)).toEqual({ step: 'unprotected', why: 'member_unconfirmed' });
    expect(afterTurnStep(at({ members: [{ phase: 'RETAINED', exitUnconfirmed: true }] }), 1_000)).toEqual({ step: 'unprotected', why: 'exit_unconfirmed' });
    expect(afterTurnStep(at({ evacuating: true }), 1_000)).toEqual({ step: 'unprotected', why: 'evacuating' });
    // Started (or an Exec ran) after the turn: a next turn got in first, its own end saves the group.
    expect(afterTurnStep(at({ lastActivityAtMs: 2_000 }), 2_000)).toEqual({ step: 'unprotected', why: 'activity_since_turn' });
    expect(afterTurnStep(at({ state: 'LOST' }), 1_000)).toEqual({ step: 'unprotected', why: 'terminal' });
    expect(afterTurnStep(at({ state: 'PENDING' }), 1_000)).toEqual({ step: 'unprotected', why: 'not_running' });
  });
});

describe('parseIdleStopAfterMs', () => {
  it('maps -1 to never, keeps 0..a week, refuses the rest', () => {
    expect(parseIdleStopAfterMs(undefined)).toEqual({ ok: true, value: undefined });
    expect(parseIdleStopAfterMs(-1)).toEqual({ ok: true, value: 'never' });
    expect(parseIdleStopAfterMs(0)).toEqual({ ok: true, value: 0 });
    expect(parseIdleStopAfterMs(IDLE_STOP_MAX_MS)).toEqual({ ok: true, value: IDLE_STOP_MAX_MS });
    for (const bad of [-2, IDLE_STOP_MAX_MS + 1, 1.5, Number.NaN]) {
      const r = parseIdleStopAfterMs(bad);
      expect(r.ok).toBe(false);
      if (!r.ok) expect(r.error.reason).toBe('out_of_range');
    }
  });
});

describe('protection', () => {
  const base = { activityVersion: 3, lastActivityAtMs: 500, createdAtMs: 100 };
  it('only a clean stop with a checkpoint of the current state (or a migration) is protected', () => {
    expect(protection({ ...base, state: 'STOPPED', stopClean: true, checkpointActivityVersion: 3 })).toEqual({ protected: true });
    expect(protection({ ...base, state: 'MIGRATING', stopClean: true })).toEqual({ protected: true });
    expect(protection({ ...base, state: 'STOPPED', stopClean: true, checkpointActivityVersion: 2 })).toEqual({ protected: false, sinceMs: 500 });
    expect(protection({ ...base, state: 'STOPPED', stopClean: true })).toEqual({ protected: false, sinceMs: 500 });
    expect(protection({ ...base, state: 'STOPPED', stopClean: false, checkpointActivityVersion: 3 })).toEqual({ protected: false, sinceMs: 500 });
    expect(protection({ ...base, state: 'RUNNING', runningSinceMs: 300 })).toEqual({ protected: false, sinceMs: 300 });
    expect(protection({ ...base, state: 'RUNNING' })).toEqual({ protected: false, sinceMs: 500 });
    expect(protection({ ...base, state: 'PENDING' })).toEqual({ protected: false, sinceMs: 100 });
    expect(protection({ ...base, state: 'LOST' })).toEqual({ protected: 'terminal' });
    expect(protection({ ...base, state: 'DESTROYED' })).toEqual({ protected: 'terminal' });
  });
});
