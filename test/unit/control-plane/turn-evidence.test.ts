// Per-turn evidence in the group record (issue 13) and the turn-call slots beside it: the evidence
// list keeps the newest TURN_EVIDENCE_MAX within its byte budget, and the largest group record the
// API can make (8 members, every field at its bound, full idempotency answers, full evidence lists)
// still fits the groups bucket's record limit; a BeginTurn refused turn_in_flight is stored beside
// the answer of the turn in flight, never over it.
import { describe, expect, it } from 'vitest';
import {
  appendTurnEvidence,
  decodeTurnFlags,
  encodeTurnFlags,
  GroupRecordSchema,
  TurnEvidenceRecordSchema,
  TURN_EVIDENCE_BYTES_PER_GROUP,
  TURN_EVIDENCE_MAX,
  turnEvidenceBudget,
  type CallOutcome,
  type GroupRecord,
  type MemberRecord,
  type TurnEvidenceRecord,
} from '../../../src/control-plane/records.ts';
import { findTurnCall, recordTurnCall, refusalOutcome } from '../../../src/control-plane/idempotency.ts';
import { beginTurn, newMemberSession } from '../../../src/core/index.ts';
import { CONTROL_PLANE_BUCKETS } from '../../../src/control-plane/buckets.ts';
import { LIMITS } from '../../../src/api/mapping.ts';

const T0 = Date.UTC(2026, 11, 1);
const s = (n: number, c = 'a') => c.repeat(n);

function entry(i: number, over: Partial<TurnEvidenceRecord> = {}): TurnEvidenceRecord {
  return { turnId: `t-${String(i).padStart(32, '0')}`, contextState: 'RESTORED', generation: 1, beganAtMs: T0 + i, durationMs: 1, kind: 'result', flags: 'es', outcome: 'completed', ...over };
}

/** A turn end with every field at its bound. */
function largest(i: number): TurnEvidenceRecord {
  return entry(i, {
    turnId: s(128, 't'), generation: Number.MAX_SAFE_INTEGER, beganAtMs: 9_999_999_999_999, durationMs: 9_999_999_999_999, kind: 'process_exited',
    flags: 'esctlxk', exitCode: -255,
    observedLocator: s(1024, 'l'), nativeTurnId: s(64, 'n'), inputBytes: Number.MAX_SAFE_INTEGER, outputBytes: Number.MAX_SAFE_INTEGER,
    outcome: 'failed_before_session', refusal: 'locator_mismatch',
  });
}

describe('appendTurnEvidence', () => {
  it(`keeps the newest ${TURN_EVIDENCE_MAX}, oldest first`, () => {
    let turns: TurnEvidenceRecord[] | undefined;
    for (let i = 0; i < 12; i++) turns = appendTurnEvidence(turns, entry(i), turnEvidenceBudget(1));
    expect(turns!.map((t) => t.beganAtMs - T0)).toEqual([4, 5, 6, 7, 8, 9, 10, 11]);
  });

  it('stores the booleans as flags and reads them back', () => {
    const all = { nativeTurnEnded: true, succeeded: false, cleanupFinished: true, transportUsable: true, locatorUsable: false, processExited: true, exitConfirmed: false };
    expect(encodeTurnFlags(all)).toBe('ectx');
    expect(decodeTurnFlags(encodeTurnFlags(all))).toEqual(all);
    expect(TurnEvidenceRecordSchema.safeParse(entry(1, { flags: 'ectx' })).success).toBe(true);
    expect(TurnEvidenceRecordSchema.safeParse(entry(1, { flags: 'xe' })).success).toBe(false);
  });

  it('drops the oldest while over the byte budget, and always keeps the newest', () => {
    const budget = turnEvidenceBudget(8);
    expect(budget).toBe(Math.floor(TURN_EVIDENCE_BYTES_PER_GROUP / 8));
    let turns: TurnEvidenceRecord[] = [];
    for (let i = 0; i < 10; i++) turns = appendTurnEvidence(turns, largest(i), budget);
    expect(Buffer.byteLength(JSON.stringify(turns))).toBeLessThanOrEqual(budget);
    expect(turns.length).toBeGreaterThanOrEqual(1);
    expect(turns.at(-1)).toEqual(largest(9));
    // Typical entries (a 36-character session id, byte counts) keep all 8 in a group of 8 members.
    let typical: TurnEvidenceRecord[] = [];
    for (let i = 0; i < 10; i++) typical = appendTurnEvidence(typical, entry(i, { beganAtMs: Date.now(), durationMs: 123_456, flags: 'esctl', observedLocator: '0b5c0a3e-5b4a-4c53-9b7e-1f6f2a0d9c11', inputBytes: 123_456, outputBytes: 12_345_678 }), budget);
    expect(typical).toHaveLength(TURN_EVIDENCE_MAX);
    // One entry over the budget is still kept: the newest end is never dropped.
    expect(appendTurnEvidence(turns, largest(10), 10)).toEqual([largest(10)]);
  });
});

describe('the largest group record the API can make fits the groups bucket', () => {
  // Every value a runner or an operator chooses at its bound (ids, locators, host ids, the restore
  // attempts the configuration allows); the texts the control plane writes itself as it writes them.
  it(`8 members, every runner-chosen value at its bound, full answers and full evidence: under ${CONTROL_PLANE_BUCKETS.groups.maxRecordBytes} bytes`, () => {
    const members = LIMITS.maxMembers;
    const loc = s(256, 'l');
    const pid = { containerId: s(64, 'c'), incarnation: '9999999999999' };
    const memberId = s(64, 'm');
    const inFlightError = beginTurn({ ...newMemberSession(memberId, 'claude_code'), phase: 'IN_TURN', inFlight: { turnId: 't-1', contextState: 'NEW', startedAtMs: 0 } }, { turnId: 't-2' }, { containerPresent: true, layerIntact: true }, 0);
    if (inFlightError.ok) throw new Error('expected a turn_in_flight refusal');
    const refusal: CallOutcome = refusalOutcome(inFlightError.error);
    const call = (outcome: CallOutcome) => ({ key: s(32, 'f'), request: s(64, 'e'), outcome });
    const begin = { turnId: `t-${s(32, '0')}`, contextState: 'RESTORED', locator: loc, hostId: s(253, 'h'), hostEpoch: Number.MAX_SAFE_INTEGER, generation: Number.MAX_SAFE_INTEGER, containerId: s(64, 'c'), startedAtMs: 9_999_999_999_999, slotReclaimed: true };
    const complete = { outcome: 'failed_before_session', sessionKept: true, savedLocator: loc, nextContextState: 'RESTORED' };
    const member = (i: number): MemberRecord => {
      let turns: TurnEvidenceRecord[] = [];
      for (let n = 0; n < 20; n++) turns = appendTurnEvidence(turns, largest(n), turnEvidenceBudget(members));
      return {
        session: {
          memberId: `${s(62, 'm')}${String(i).padStart(2, '0')}`, cli: 'claude_code', phase: 'IN_TURN', savedLocator: loc, completedTurns: Number.MAX_SAFE_INTEGER, process: pid, reclaim: pid,
          inFlight: { turnId: `t-${s(32, '0')}`, contextState: 'RESTORED', locator: loc, process: pid, startedAtMs: 9_999_999_999_999 },
          lastTurn: { turnId: `t-${s(32, '1')}`, outcome: 'failed_before_session' }, unconfirmedCause: 'transport_disconnect',
        } as unknown as MemberRecord['session'],
        containerId: s(64, 'c'), lastContextState: 'RESTORED', turnProcess: pid,
        calls: { begin: call({ ok: true, value: begin }), complete: call({ ok: true, value: complete }), refusedInFlight: call(refusal), older: Array.from({ length: 16 }, () => s(32, 'f')) },
        turns,
      };
    };
    const record = {
      groupId: `g-${s(24, '0')}`, conversationId: s(128, 'v'),
      lifecycle: { state: 'MIGRATING', hostId: s(253, 'h'), generation: Number.MAX_SAFE_INTEGER, activityVersion: Number.MAX_SAFE_INTEGER, lastActivityAtMs: 9_999_999_999_999, stop: { clean: true }, migration: { targetHostId: s(253, 't'), checkpointId: `c-${s(32, '0')}` }, lostReason: 'bridge_version_mismatch' },
      members: Array.from({ length: members }, (_, i) => member(i)),
      latestCheckpointId: `c-${s(32, '0')}`,
      evacuation: { kind: 'unplanned', source: 'docker_data_lost', sourceHostId: s(253, 'h'), startedAtMs: 9_999_999_999_999, deadlineMs: 9_999_999_999_999, attempts: 10, triedHostIds: Array.from({ length: 10 }, () => s(253, 'h')) },
      starts: Number.MAX_SAFE_INTEGER, stops: Number.MAX_SAFE_INTEGER,
      lastCleanStop: { stoppedAtMs: 9_999_999_999_999, graceMs: 600_000, members: Array.from({ length: members }, (_, i) => ({ memberId: `${s(62, 'm')}${String(i).padStart(2, '0')}`, exitCode: -255, sigtermAtMs: 9_999_999_999_999, exitedAtMs: 9_999_999_999_999, stopDurationMs: 600_000 })) },
      lastTurnCompletedAtMs: 9_999_999_999_999, lostAtMs: 9_999_999_999_999, lostDetail: s(1024, 'd'), createdAtMs: 9_999_999_999_999, updatedAtMs: 9_999_999_999_999,
    };
    const parsed: GroupRecord = GroupRecordSchema.parse(record);
    const size = Buffer.byteLength(JSON.stringify(parsed));
    const evidence = parsed.members.reduce((n, m) => n + Buffer.byteLength(JSON.stringify(m.turns)), 0);
    console.info(`largest group record: ${size} bytes, of which turn evidence ${evidence} (limit ${CONTROL_PLANE_BUCKETS.groups.maxRecordBytes})`);
    expect(evidence).toBeLessThanOrEqual(TURN_EVIDENCE_BYTES_PER_GROUP);
    expect(size).toBeLessThan(CONTROL_PLANE_BUCKETS.groups.maxRecordBytes);
    // And with every member's list filling its whole share of the budget (entries of other sizes).
    expect(size - evidence + TURN_EVIDENCE_BYTES_PER_GROUP).toBeLessThan(CONTROL_PLANE_BUCKETS.groups.maxRecordBytes);
  });
});

describe('turn calls: a refusal because another turn is in flight does not displace that turn\'s answer', () => {
  const answer = (turnId: string): CallOutcome => ({ ok: true, value: { turnId } });
  const inFlight: CallOutcome = { ok: false, errorClass: 'IdentityRefused', reason: 'turn_in_flight', message: 'busy', details: {} };
  const k = (n: number) => String(n).repeat(32);
  const r = (n: number) => String(n).repeat(64);

  it('both keys keep their answers; displaced keys become "older" (refused as reused, never re-executed)', () => {
    let calls = recordTurnCall(undefined, 'begin', k(1), r(1), answer('t-1'));
    calls = recordTurnCall(calls, 'begin', k(2), r(2), inFlight, 'refusedInFlight');
    expect(findTurnCall(calls, 'begin', k(1), r(1))).toEqual({ outcome: answer('t-1') });
    expect(findTurnCall(calls, 'begin', k(2), r(2))).toEqual({ outcome: inFlight });
    // The same key with another request is refused, in either slot.
    expect(findTurnCall(calls, 'begin', k(2), r(9))).toMatchObject({ refusal: { reason: 'idempotency_key_reused' } });
    // A second refused key takes the refusal slot; the first one's answer is no longer kept.
    calls = recordTurnCall(calls, 'begin', k(3), r(3), inFlight, 'refusedInFlight');
    expect(findTurnCall(calls, 'begin', k(1), r(1))).toEqual({ outcome: answer('t-1') });
    expect(findTurnCall(calls, 'begin', k(2), r(2))).toMatchObject({ refusal: { reason: 'idempotency_key_reused' } });
    // The next turn's answer replaces the last answer only.
    calls = recordTurnCall(calls, 'begin', k(4), r(4), answer('t-4'));
    expect(findTurnCall(calls, 'begin', k(4), r(4))).toEqual({ outcome: answer('t-4') });
    expect(findTurnCall(calls, 'begin', k(3), r(3))).toEqual({ outcome: inFlight });
    expect(findTurnCall(calls, 'begin', k(1), r(1))).toMatchObject({ refusal: { reason: 'idempotency_key_reused' } });
    // Complete calls never read the begin slots.
    expect(findTurnCall(calls, 'complete', k(3), r(3))).toBeUndefined();
  });
});
