// Member context state and locator rules (R-S1..R-S3, R-S5, R-S6, R-S8), example by example.
import { describe, expect, it } from 'vitest';
import {
  beginTurn, completeTurn, containerRunOf, isTurnProcess, markMemberLost, newMemberSession, onContainerStopped, onProcessExited, onRestored, turnProcessIn, unwrap, parseLocator,
  type BeginOutcome, type CompleteOutcome, type Locator, type MemberObservation, type MemberSession, type ProcessIdentity, type TurnEnd,
} from '../../../src/core/index.ts';

const L1 = unwrap(parseLocator('sess-1'));
const L2 = unwrap(parseLocator('sess-2'));
const P1: ProcessIdentity = { containerId: 'c1', incarnation: '1' };
const P2: ProcessIdentity = { containerId: 'c1', incarnation: '2' };
const present = (runningProcess?: ProcessIdentity): MemberObservation => ({ containerPresent: true, layerIntact: true, runningProcess });
const success: TurnEnd = { kind: 'ended', success: true, cleanupFinished: true, transportUsable: true, processExits: false };
const failedKept: TurnEnd = { kind: 'ended', success: false, cleanupFinished: true, transportUsable: true, processExits: false };

function began(o: BeginOutcome): Extract<BeginOutcome, { ok: true }> {
  if (!o.ok) throw new Error(`begin refused: ${o.error.reason}`);
  return o;
}
function completed(o: CompleteOutcome): Extract<CompleteOutcome, { ok: true }> {
  if (!o.ok) throw new Error(`complete failed: ${o.error.reason}`);
  return o;
}
/** A member that completed one turn on P1 with locator L1. */
function retained(): MemberSession {
  const b = began(beginTurn(newMemberSession('m1', 'claude_code'), { turnId: 't1' }, present(), 0));
  return completed(completeTurn(b.member, { turnId: 't1', observedLocator: L1, end: success, process: P1 })).member;
}

describe('begin: context state (R-S1, R-S3)', () => {
  it('NEW before the first completed turn, and it asks for a process', () => {
    const b = began(beginTurn(newMemberSession('m1', 'codex'), { turnId: 't1' }, present(), 5));
    expect(b).toMatchObject({ contextState: 'NEW', startProcess: true, replayed: false });
    expect(b.effectiveLocator).toBeUndefined();
    expect(b.member.phase).toBe('IN_TURN');
  });

  it('LIVE only on the same still-running process; the saved locator is used when none is sent', () => {
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
    expect(b).toMatchObject({ contextState: 'LIVE', effectiveLocator: L1, startProcess: false });
  });

  it('RESTORED when a different process (or none) runs on the retained state; a process that never ran a turn is not reclaimed', () => {
    expect(began(beginTurn(retained(), { turnId: 't2' }, present(), 5))).toMatchObject({ contextState: 'RESTORED', effectiveLocator: L1, startProcess: true });
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(P2), 5));
    expect(b).toMatchObject({ contextState: 'RESTORED', startProcess: true });
    expect(b.reclaimProcess).toBeUndefined();
  });

  it('refuses a request locator that differs from the saved one, and any locator for a fresh member', () => {
    const r = beginTurn(retained(), { turnId: 't2', locator: L2 }, present(P1), 5);
    expect(r.ok).toBe(false);
    if (!r.ok) expect([r.error.reason, r.error.status, r.contextState]).toEqual(['locator_mismatch', 'FAILED_PRECONDITION', undefined]);
    const f = beginTurn(newMemberSession('m1', 'pi'), { turnId: 't1', locator: L1 }, present(), 5);
    expect(!f.ok && f.error.reason).toBe('locator_mismatch');
    expect(began(beginTurn(retained(), { turnId: 't2', locator: L1 }, present(P1), 5)).contextState).toBe('LIVE');
  });

  it('a retained member whose container, layer or session files are gone is LOST and refused', () => {
    for (const [obs, reason] of [
      [{ containerPresent: false, layerIntact: false }, 'container_missing'],
      [{ containerPresent: true, layerIntact: false }, 'writable_layer_missing'],
      [{ containerPresent: true, layerIntact: true, sessionFilesPresent: false }, 'session_files_missing'],
    ] as const) {
      const r = beginTurn(retained(), { turnId: 't2' }, obs, 5);
      expect(r.ok).toBe(false);
      if (!r.ok) {
        expect(r.contextState).toBe('LOST');
        expect(r.error.reason).toBe('context_lost');
        expect(r.member).toMatchObject({ phase: 'LOST', lostReason: reason, savedLocator: L1 });
      }
    }
  });

  it('a retained member without a recoverable locator is refused, never started fresh (R-S3)', () => {
    const broken: MemberSession = { memberId: 'm1', cli: 'kilo', phase: 'RETAINED', completedTurns: 2 };
    const r = beginTurn(broken, { turnId: 't3' }, present(), 5);
    expect(r.ok).toBe(false);
    if (!r.ok) expect([r.error.reason, r.contextState, r.member.phase]).toEqual(['locator_missing', 'LOST', 'LOST']);
  });

  it('a fresh member without a container is UNAVAILABLE, not LOST (nothing native exists yet)', () => {
    const r = beginTurn(newMemberSession('m1', 'opencode'), { turnId: 't1' }, { containerPresent: false, layerIntact: false }, 5);
    expect(!r.ok && [r.error.status, r.error.reason, r.member.phase]).toEqual(['UNAVAILABLE', 'container_missing', 'FRESH']);
  });

  it('one turn in flight (R-S8); the same turnId replays the begin', () => {
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
    const again = beginTurn(b.member, { turnId: 't3' }, present(P1), 6);
    expect(!again.ok && again.error.reason).toBe('turn_in_flight');
    expect(began(beginTurn(b.member, { turnId: 't2' }, present(P1), 6))).toMatchObject({ contextState: 'LIVE', replayed: true, member: b.member });
  });
});

describe('turn processes kept by the host agent (RunTurn, R-S1, R-S6)', () => {
  /** P1's container run with the agent's turn process `p-a` in it. */
  const T1 = turnProcessIn(P1, 'p-a');
  const fleetRetained = (): MemberSession => {
    const b = began(beginTurn(newMemberSession('m1', 'claude_code'), { turnId: 't1', fleetDriven: true }, present(P1), 0));
    return completed(completeTurn(b.member, { turnId: 't1', observedLocator: L1, end: success, process: T1 })).member;
  };
  const listed = (...turnProcesses: ProcessIdentity[]): MemberObservation => ({ ...present(P1), turnProcesses });

  it('names a process inside a container run', () => {
    expect(T1).toEqual({ containerId: 'c1', incarnation: '1/p-a' });
    expect([isTurnProcess(T1), isTurnProcess(P1)]).toEqual([true, false]);
    expect(containerRunOf(T1)).toEqual(P1);
    expect(fleetRetained().process).toEqual(T1);
  });

  it('LIVE for the fleet only while the agent lists that very process in the same container run', () => {
    expect(began(beginTurn(fleetRetained(), { turnId: 't2', fleetDriven: true }, listed(T1), 5))).toMatchObject({ contextState: 'LIVE', startProcess: false, member: { inFlight: { process: T1 } } });
    // Not listed (it died, or was started with another command): RESTORED, and its container run is
    // restarted first, since the agent not listing it does not prove it exited.
    for (const obs of [listed(), listed(turnProcessIn(P1, 'p-b')), present(P1)]) {
      expect(began(beginTurn(fleetRetained(), { turnId: 't2', fleetDriven: true }, obs, 5))).toMatchObject({ contextState: 'RESTORED', startProcess: true, reclaimProcess: P1 });
    }
    // Listed, but the container restarted since: the process is gone with its run, nothing to reclaim.
    const restarted = began(beginTurn(fleetRetained(), { turnId: 't2', fleetDriven: true }, { ...present(P2), turnProcesses: [T1] }, 5));
    expect(restarted).toMatchObject({ contextState: 'RESTORED', startProcess: true });
    expect(restarted.reclaimProcess).toBeUndefined();
  });

  it('a runner\'s own begin never reuses a turn process (it cannot reach it), and the fleet never reuses a runner\'s process', () => {
    expect(began(beginTurn(fleetRetained(), { turnId: 't2' }, listed(T1), 5))).toMatchObject({ contextState: 'RESTORED', reclaimProcess: P1 });
    expect(began(beginTurn(retained(), { turnId: 't2', fleetDriven: true }, listed(), 5))).toMatchObject({ contextState: 'RESTORED', reclaimProcess: P1 });
    expect(began(beginTurn(retained(), { turnId: 't2' }, listed(), 5))).toMatchObject({ contextState: 'LIVE' });
  });

  it('a turn process whose exit was confirmed leaves nothing to reuse or reclaim', () => {
    const b = began(beginTurn(newMemberSession('m1', 'claude_code'), { turnId: 't1', fleetDriven: true }, present(P1), 0));
    const done = completed(completeTurn(b.member, { turnId: 't1', observedLocator: L1, end: { ...success, processExits: true, exitConfirmed: true }, process: T1 })).member;
    expect([done.process, done.reclaim]).toEqual([undefined, undefined]);
    const next = began(beginTurn(done, { turnId: 't2', fleetDriven: true }, listed(), 5));
    expect(next).toMatchObject({ contextState: 'RESTORED', startProcess: true });
    expect(next.reclaimProcess).toBeUndefined();
  });
});

describe('complete: locators and evidence (R-S2, R-S5, R-S6)', () => {
  it('saves the observed locator on the first ended turn; later turns keep it', () => {
    const m = retained();
    expect(m).toMatchObject({ phase: 'RETAINED', savedLocator: L1, completedTurns: 1, process: P1 });
    const b = began(beginTurn(m, { turnId: 't2' }, present(P1), 5));
    const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L1, end: success }));
    expect(c.member).toMatchObject({ savedLocator: L1, completedTurns: 2, process: P1 });
  });

  it('a mismatching observed id fails the turn and never overwrites the saved locator, on success and ended failure alike', () => {
    for (const end of [success, failedKept]) {
      const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
      const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L2, end }));
      expect(c.outcome).toBe('locator_mismatch');
      expect(c.refusal?.reason).toBe('locator_mismatch');
      expect(c.member).toMatchObject({ phase: 'RETAINED', savedLocator: L1, completedTurns: 1 });
      expect(c.member.process).toBeUndefined();
      expect(began(beginTurn(c.member, { turnId: 't3' }, present(P1), 6)).contextState).toBe('RESTORED');
    }
  });

  it('an ended failure with all three confirmations keeps the session', () => {
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
    const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L1, end: failedKept }));
    expect(c.outcome).toBe('failed_kept');
    expect(began(beginTurn(c.member, { turnId: 't3' }, present(P1), 6)).contextState).toBe('LIVE');
  });

  it('a failure without cleanup or usable transport is unconfirmed → next begin LOST', () => {
    for (const end of [{ ...failedKept, cleanupFinished: false }, { ...failedKept, transportUsable: false }]) {
      const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
      const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L1, end }));
      expect([c.outcome, c.member.phase, c.member.savedLocator]).toEqual(['unconfirmed', 'UNCONFIRMED', L1]);
      const next = beginTurn(c.member, { turnId: 't3' }, present(P1), 6);
      expect(!next.ok && [next.contextState, next.error.reason, next.member.lostReason]).toEqual(['LOST', 'context_lost', 'turn_unconfirmed']);
    }
  });

  it.each(['transport_disconnect', 'timeout', 'cancelled', 'command_rejected'] as const)('%s is not a turn end → LOST next', (cause) => {
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
    const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L1, end: { kind: 'not_ended', cause } }));
    expect(c.member).toMatchObject({ phase: 'UNCONFIRMED', unconfirmedCause: cause, savedLocator: L1, completedTurns: 1 });
    expect(beginTurn(c.member, { turnId: 't3' }, present(P1), 6)).toMatchObject({ ok: false, contextState: 'LOST' });
  });

  it('Claude api_retry (R-S6): the turn ends, the locator is saved, the next turn is RESTORED with the old process reclaimed', () => {
    const b = began(beginTurn(newMemberSession('m1', 'claude_code'), { turnId: 't1' }, present(), 0));
    const c = completed(completeTurn(b.member, { turnId: 't1', observedLocator: L1, end: { ...failedKept, processExits: true }, process: P1 }));
    expect(c.member).toMatchObject({ phase: 'RETAINED', savedLocator: L1, reclaim: P1 });
    const next = began(beginTurn(c.member, { turnId: 't2' }, present(P1), 6));
    expect(next).toMatchObject({ contextState: 'RESTORED', reclaimProcess: P1, effectiveLocator: L1 });
    expect(next.member.reclaim).toBeUndefined();
  });

  it('R-S6: a confirmed exit needs no reclaim; a reclaim is moot once the incarnation is gone', () => {
    const b = began(beginTurn(newMemberSession('m1', 'claude_code'), { turnId: 't1' }, present(), 0));
    const confirmed = completed(completeTurn(b.member, { turnId: 't1', observedLocator: L1, end: { ...failedKept, processExits: true, exitConfirmed: true }, process: P1 })).member;
    expect(confirmed.reclaim).toBeUndefined();
    expect(began(beginTurn(confirmed, { turnId: 't2' }, present(P1), 6)).reclaimProcess).toBeUndefined();
    const unconfirmed = completed(completeTurn(b.member, { turnId: 't1', observedLocator: L1, end: { ...failedKept, processExits: true }, process: P1 })).member;
    // The container restarted since (another incarnation runs), or the exit was seen, or it stopped.
    expect(began(beginTurn(unconfirmed, { turnId: 't2' }, present(P2), 6)).reclaimProcess).toBeUndefined();
    expect(onProcessExited(unconfirmed, P1).reclaim).toBeUndefined();
    expect(onContainerStopped(unconfirmed).reclaim).toBeUndefined();
  });

  it('R-S6: a process that is not reused for another reason (transport lost, locator mismatch) is reclaimed too', () => {
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(), 5));
    const lostTransport = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L1, end: { ...success, transportUsable: false }, process: P2 })).member;
    expect(lostTransport).toMatchObject({ phase: 'RETAINED', reclaim: P2 });
    const mismatch = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L2, end: success, process: P2 })).member;
    expect(mismatch).toMatchObject({ phase: 'RETAINED', savedLocator: L1, reclaim: P2 });
    expect(began(beginTurn(mismatch, { turnId: 't3' }, present(P2), 6)).reclaimProcess).toEqual(P2);
  });

  it('missing or invalid observed locators are refused and leave the member unconfirmed', () => {
    for (const observedLocator of [undefined, 'bad/id']) {
      const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
      const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator, end: success }));
      expect(c.outcome).toBe('locator_missing');
      expect(c.member).toMatchObject({ phase: 'UNCONFIRMED', savedLocator: L1 });
    }
  });

  it('a first turn that fails before any session exists stays FRESH (NEW next time)', () => {
    const b = began(beginTurn(newMemberSession('m1', 'pi'), { turnId: 't1' }, present(), 0));
    const c = completed(completeTurn(b.member, { turnId: 't1', end: failedKept }));
    expect([c.outcome, c.member.phase]).toEqual(['failed_before_session', 'FRESH']);
    expect(began(beginTurn(c.member, { turnId: 't2' }, present(), 1)).contextState).toBe('NEW');
  });

  it('R-S6 before a first session: the failed turn\'s process is reclaimed before the next start unless its exit was confirmed', () => {
    const b = began(beginTurn(newMemberSession('m1', 'claude_code'), { turnId: 't1' }, present(P1), 0));
    const lingering = completed(completeTurn(b.member, { turnId: 't1', end: failedKept, process: P1 })).member;
    expect([lingering.phase, lingering.reclaim]).toEqual(['FRESH', P1]);
    // Still running: its container run is restarted and the NEW turn starts a new process.
    const next = began(beginTurn(lingering, { turnId: 't2' }, present(P1), 1));
    expect(next).toMatchObject({ contextState: 'NEW', reclaimProcess: P1, startProcess: true });
    expect(next.member.reclaim).toBeUndefined();
    // The container restarted meanwhile: nothing left to reclaim; the NEW turn runs on the new run.
    expect(began(beginTurn(lingering, { turnId: 't2' }, present(P2), 1))).toMatchObject({ contextState: 'NEW', startProcess: false });
    expect(began(beginTurn(lingering, { turnId: 't2' }, present(P2), 1)).reclaimProcess).toBeUndefined();
    // Its exit confirmed: nothing to reclaim.
    const exited = completed(completeTurn(b.member, { turnId: 't1', end: { ...failedKept, processExits: true, exitConfirmed: true }, process: P1 })).member;
    expect(exited.reclaim).toBeUndefined();
  });

  it('completion is idempotent per turnId; an unknown turn is NOT_FOUND', () => {
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
    const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L1, end: success }));
    const again = completed(completeTurn(c.member, { turnId: 't2', observedLocator: L2, end: success }));
    expect(again).toMatchObject({ duplicate: true, outcome: 'completed', member: c.member });
    const unknown = completeTurn(c.member, { turnId: 'zz', observedLocator: L1, end: success });
    expect(!unknown.ok && [unknown.error.status, unknown.error.reason]).toEqual(['NOT_FOUND', 'turn_not_found']);
  });

  it('a repeated end of a turn refused for its locator is refused again with the same reason', () => {
    const b = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5));
    const c = completed(completeTurn(b.member, { turnId: 't2', observedLocator: L2, end: success }));
    expect(c.refusal?.reason).toBe('locator_mismatch');
    const again = completed(completeTurn(c.member, { turnId: 't2', observedLocator: L1, end: success }));
    expect(again).toMatchObject({ duplicate: true, outcome: 'locator_mismatch', member: c.member });
    expect([again.refusal?.reason, again.refusal?.status]).toEqual(['locator_mismatch', 'FAILED_PRECONDITION']);
    expect(again.member.savedLocator).toBe(L1);
  });
});

describe('process and container events', () => {
  it('a process exit or container stop ends LIVE; a stop mid-turn is unconfirmed', () => {
    expect(began(beginTurn(onProcessExited(retained(), P1), { turnId: 't2' }, present(P1), 5)).contextState).toBe('RESTORED');
    expect(onProcessExited(retained(), P2).process).toEqual(P1);
    expect(began(beginTurn(onContainerStopped(retained()), { turnId: 't2' }, present(P1), 5)).contextState).toBe('RESTORED');
    const inTurn = began(beginTurn(retained(), { turnId: 't2' }, present(P1), 5)).member;
    expect(onContainerStopped(inTurn)).toMatchObject({ phase: 'UNCONFIRMED', unconfirmedCause: 'stopped_mid_turn' });
  });

  it('a restored member resumes RESTORED on the new container; group loss marks LOST with the first reason', () => {
    const m = onRestored(retained());
    expect(began(beginTurn(m, { turnId: 't2' }, present({ containerId: 'c9', incarnation: '1' }), 5)).contextState).toBe('RESTORED');
    const lost = markMemberLost(markMemberLost(m, 'group_lost'), 'container_missing');
    expect(lost).toMatchObject({ phase: 'LOST', lostReason: 'group_lost', savedLocator: L1 as Locator });
  });
});
