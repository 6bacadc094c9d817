// Unit tests of src/api/mapping.ts (R-I1, R-R4): every runner request field is validated and bounded
// before the backend sees it, and each refusal is an InvalidArgument whose (reason, details.field)
// names what was wrong. Enums map both ways through explicit tables; unknown values are refused.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  LIMITS,
  beginTurnFromProto,
  cliFromProto,
  cliToProto,
  completeTurnFromProto,
  completeTurnToProto,
  contextToProto,
  endKindFromProto,
  getGroupStateFromProto,
  groupStateToProto,
  memberStateToProto,
  openGroupFromProto,
  parseIdempotencyKey,
  stopGroupFromProto,
} from '../../../src/api/mapping.ts';
import { InvalidArgument } from '../../../src/core/errors.ts';
import { CliKind, ContextState, GroupState, MemberState, TurnEndKind } from '../../../src/gen/sandboxfleet/v1/common.ts';
import type { BeginTurnRequest, CompleteTurnRequest, OpenGroupRequest, StopGroupRequest, TurnEndEvidence } from '../../../src/gen/sandboxfleet/v1/runner.ts';
import { successEvidence } from '../../support/evidence.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const EVIDENCE: TurnEndEvidence = successEvidence();

const OPEN: OpenGroupRequest = { idempotencyKey: 'k-1', conversationId: 'conv-1', members: [{ memberId: 'm1', kind: CliKind.CLAUDE_CODE }] };
const BEGIN: BeginTurnRequest = { idempotencyKey: 'k-2', groupId: 'g-1', memberId: 'm1' };
const COMPLETE: CompleteTurnRequest = { idempotencyKey: 'k-3', groupId: 'g-1', memberId: 'm1', turnId: 't-1', observedLocator: 'sess-1', evidence: EVIDENCE, protectInBackground: false };
const STOP: StopGroupRequest = { idempotencyKey: 'k-4', groupId: 'g-1', graceMs: 0 };

/** Runs `f`, expects an InvalidArgument, returns (reason, field). */
function refusal(f: () => unknown): { reason: string; field: unknown } {
  let caught: unknown;
  try {
    f();
  } catch (e) {
    caught = e;
  }
  expect(caught).toBeInstanceOf(InvalidArgument);
  const e = caught as InvalidArgument;
  expect(e.status).toBe('INVALID_ARGUMENT');
  return { reason: e.reason, field: e.details.field };
}

describe('idempotency key (required on every mutating call)', () => {
  it('accepts visible ASCII up to the bound', () => {
    expect(parseIdempotencyKey('a'.repeat(LIMITS.idempotencyKeyMaxLength))).toHaveLength(LIMITS.idempotencyKeyMaxLength);
    expect(parseIdempotencyKey('0b6f-uuid_like:key!')).toBe('0b6f-uuid_like:key!');
  });

  it.each([
    ['missing', '', 'empty_value'],
    ['too long', 'a'.repeat(LIMITS.idempotencyKeyMaxLength + 1), 'value_too_long'],
    ['space', 'a b', 'invalid_characters'],
    ['newline', 'a\nb', 'invalid_characters'],
    ['NUL', 'a\u0000', 'invalid_characters'],
    ['non-ASCII', 'clé', 'invalid_characters'],
  ])('refuses a %s key', (_what, key, reason) => {
    expect(refusal(() => parseIdempotencyKey(key))).toEqual({ reason, field: 'idempotency_key' });
  });

  it('refuses a non-string', () => {
    expect(refusal(() => parseIdempotencyKey(42))).toEqual({ reason: 'not_a_string', field: 'idempotency_key' });
  });

  it('is required by every mutating request', () => {
    expect(refusal(() => openGroupFromProto({ ...OPEN, idempotencyKey: '' })).field).toBe('idempotency_key');
    expect(refusal(() => beginTurnFromProto({ ...BEGIN, idempotencyKey: '' })).field).toBe('idempotency_key');
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, idempotencyKey: '' })).field).toBe('idempotency_key');
    expect(refusal(() => stopGroupFromProto({ ...STOP, idempotencyKey: '' })).field).toBe('idempotency_key');
  });
});

describe('OpenGroup', () => {
  it('maps a valid request', () => {
    expect(openGroupFromProto({ ...OPEN, members: [{ memberId: 'm1', kind: CliKind.CLAUDE_CODE }, { memberId: 'm2', kind: CliKind.KILO }] })).toEqual({
      idempotencyKey: 'k-1',
      conversationId: 'conv-1',
      members: [{ memberId: 'm1', cli: 'claude_code' }, { memberId: 'm2', cli: 'kilo' }],
    });
  });

  it('refuses no members, too many members and duplicate member ids', () => {
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: [] }))).toEqual({ reason: 'empty_value', field: 'members' });
    const many = Array.from({ length: LIMITS.maxMembers + 1 }, (_, i) => ({ memberId: `m${i}`, kind: CliKind.PI }));
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: many }))).toEqual({ reason: 'too_many_entries', field: 'members' });
    expect(openGroupFromProto({ ...OPEN, members: many.slice(0, LIMITS.maxMembers) }).members).toHaveLength(LIMITS.maxMembers);
    const dup = [{ memberId: 'm1', kind: CliKind.PI }, { memberId: 'm1', kind: CliKind.CODEX }];
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: dup }))).toEqual({ reason: 'malformed', field: 'members[1].member_id' });
  });

  it('refuses unknown and unspecified CLI kinds (never defaulted)', () => {
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: [{ memberId: 'm1', kind: CliKind.UNSPECIFIED }] }))).toEqual({ reason: 'out_of_range', field: 'members[0].kind' });
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: [{ memberId: 'm1', kind: 99 as CliKind }] }))).toEqual({ reason: 'out_of_range', field: 'members[0].kind' });
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: [{ memberId: 'm1', kind: CliKind.UNRECOGNIZED }] })).reason).toBe('out_of_range');
  });

  it('refuses oversize, empty and hostile ids with the field named', () => {
    expect(refusal(() => openGroupFromProto({ ...OPEN, conversationId: 'c'.repeat(129) }))).toEqual({ reason: 'value_too_long', field: 'conversation_id' });
    expect(refusal(() => openGroupFromProto({ ...OPEN, conversationId: '' }))).toEqual({ reason: 'empty_value', field: 'conversation_id' });
    expect(refusal(() => openGroupFromProto({ ...OPEN, conversationId: '../etc' }))).toEqual({ reason: 'invalid_characters', field: 'conversation_id' });
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: [{ memberId: 'm'.repeat(65), kind: CliKind.PI }] }))).toEqual({ reason: 'value_too_long', field: 'members[0].member_id' });
    expect(refusal(() => openGroupFromProto({ ...OPEN, members: [{ memberId: 'a/b', kind: CliKind.PI }] }))).toEqual({ reason: 'invalid_characters', field: 'members[0].member_id' });
  });
});

describe('BeginTurn', () => {
  it('treats an absent or empty locator as "use the saved one" (R-S3)', () => {
    expect(beginTurnFromProto(BEGIN).locator).toBeUndefined();
    expect(beginTurnFromProto({ ...BEGIN, locator: '' }).locator).toBeUndefined();
    expect(beginTurnFromProto({ ...BEGIN, locator: 'sess-1' }).locator).toBe('sess-1');
  });

  it('refuses bad ids and locators with the field named', () => {
    expect(refusal(() => beginTurnFromProto({ ...BEGIN, groupId: '' }))).toEqual({ reason: 'empty_value', field: 'group_id' });
    expect(refusal(() => beginTurnFromProto({ ...BEGIN, groupId: 'g'.repeat(129) }))).toEqual({ reason: 'value_too_long', field: 'group_id' });
    expect(refusal(() => beginTurnFromProto({ ...BEGIN, memberId: '-m' }))).toEqual({ reason: 'invalid_characters', field: 'member_id' });
    expect(refusal(() => beginTurnFromProto({ ...BEGIN, locator: 'x'.repeat(257) }))).toEqual({ reason: 'value_too_long', field: 'locator' });
    expect(refusal(() => beginTurnFromProto({ ...BEGIN, locator: '../../root' }))).toEqual({ reason: 'invalid_characters', field: 'locator' });
  });
});

describe('CompleteTurn', () => {
  it('maps a success and an absent observed locator', () => {
    const input = completeTurnFromProto(COMPLETE);
    expect(input).toMatchObject({ groupId: 'g-1', memberId: 'm1', turnId: 't-1', observedLocator: 'sess-1', evidence: { kind: 'result', nativeTurnEnded: true, succeeded: true } });
    expect(completeTurnFromProto({ ...COMPLETE, observedLocator: '' }).observedLocator).toBeUndefined();
    expect(completeTurnFromProto({ ...COMPLETE, observedLocator: undefined }).observedLocator).toBeUndefined();
  });

  it('requires evidence and a known end kind', () => {
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: undefined }))).toEqual({ reason: 'empty_value', field: 'evidence' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, kind: TurnEndKind.UNSPECIFIED } }))).toEqual({ reason: 'out_of_range', field: 'evidence.kind' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, kind: 1234 as TurnEndKind } }))).toEqual({ reason: 'out_of_range', field: 'evidence.kind' });
  });

  it('bounds exit code, native turn id and error message', () => {
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, exitCode: 256 } }))).toEqual({ reason: 'out_of_range', field: 'evidence.exit_code' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, exitCode: -256 } }))).toEqual({ reason: 'out_of_range', field: 'evidence.exit_code' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, exitCode: 1.5 } }))).toEqual({ reason: 'out_of_range', field: 'evidence.exit_code' });
    expect(completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, exitCode: -255 } }).evidence.exitCode).toBe(-255);
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, nativeTurnId: 'n'.repeat(LIMITS.nativeTurnIdMaxLength + 1) } }))).toEqual({ reason: 'value_too_long', field: 'evidence.native_turn_id' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, errorMessage: 'e'.repeat(LIMITS.errorMessageMaxLength + 1) } }))).toEqual({ reason: 'value_too_long', field: 'evidence.error_message' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, errorMessage: 'bad\u0007bell' } }))).toEqual({ reason: 'invalid_characters', field: 'evidence.error_message' });
    expect(completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, errorMessage: 'line 1\n\tline 2' } }).evidence.errorMessage).toBe('line 1\n\tline 2');
  });

  it('refuses malformed observed locators and turn ids', () => {
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, observedLocator: 'has space' }))).toEqual({ reason: 'invalid_characters', field: 'observed_locator' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, observedLocator: 'l'.repeat(257) }))).toEqual({ reason: 'value_too_long', field: 'observed_locator' });
    expect(refusal(() => completeTurnFromProto({ ...COMPLETE, turnId: '' }))).toEqual({ reason: 'empty_value', field: 'turn_id' });
  });

  it('never lets a transport event count as a native turn end, whatever the flags say (R-S5)', () => {
    for (const kind of [TurnEndKind.DISCONNECT, TurnEndKind.TIMEOUT, TurnEndKind.CANCELLED, TurnEndKind.REJECTED, TurnEndKind.PROCESS_EXITED]) {
      const e = completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, kind } }).evidence;
      expect({ nativeTurnEnded: e.nativeTurnEnded, succeeded: e.succeeded }).toEqual({ nativeTurnEnded: false, succeeded: false });
    }
    for (const kind of [TurnEndKind.RESULT, TurnEndKind.TURN_COMPLETED, TurnEndKind.AGENT_END, TurnEndKind.SETTLED, TurnEndKind.API_RETRY]) {
      expect(completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, kind } }).evidence.nativeTurnEnded).toBe(true);
    }
    // "succeeded" without an end is not a success either.
    expect(completeTurnFromProto({ ...COMPLETE, evidence: { ...EVIDENCE, nativeTurnEnded: false } }).evidence.succeeded).toBe(false);
  });
});

describe('StopGroup and GetGroupState', () => {
  it('bounds the grace and treats 0 as the default', () => {
    expect(stopGroupFromProto(STOP).graceMs).toBeUndefined();
    expect(stopGroupFromProto({ ...STOP, graceMs: LIMITS.maxGraceMs }).graceMs).toBe(LIMITS.maxGraceMs);
    expect(refusal(() => stopGroupFromProto({ ...STOP, graceMs: LIMITS.maxGraceMs + 1 }))).toEqual({ reason: 'out_of_range', field: 'grace_ms' });
    expect(refusal(() => stopGroupFromProto({ ...STOP, graceMs: -1 }))).toEqual({ reason: 'out_of_range', field: 'grace_ms' });
    expect(refusal(() => stopGroupFromProto({ ...STOP, graceMs: Number.NaN }))).toEqual({ reason: 'out_of_range', field: 'grace_ms' });
  });

  it('needs exactly one of group_id / conversation_id', () => {
    expect(getGroupStateFromProto({ groupId: 'g-1', conversationId: '' })).toEqual({ groupId: 'g-1' });
    expect(getGroupStateFromProto({ groupId: '', conversationId: 'c:1' })).toEqual({ conversationId: 'c:1' });
    expect(refusal(() => getGroupStateFromProto({ groupId: '', conversationId: '' })).reason).toBe('malformed');
    expect(refusal(() => getGroupStateFromProto({ groupId: 'g-1', conversationId: 'c' })).reason).toBe('malformed');
    expect(refusal(() => getGroupStateFromProto({ groupId: 'g/1', conversationId: '' }))).toEqual({ reason: 'invalid_characters', field: 'group_id' });
  });
});

describe('enum tables', () => {
  it('round-trips every CLI kind and refuses the rest', () => {
    for (const kind of [CliKind.CLAUDE_CODE, CliKind.CODEX, CliKind.PI, CliKind.OPENCODE, CliKind.KILO]) expect(cliToProto(cliFromProto(kind))).toBe(kind);
    expect(() => cliFromProto(CliKind.UNSPECIFIED)).toThrow(InvalidArgument);
  });

  it('maps every end kind except UNSPECIFIED', () => {
    for (const kind of Object.values(TurnEndKind).filter((v): v is TurnEndKind => typeof v === 'number' && v > 0)) {
      expect(typeof endKindFromProto(kind)).toBe('string');
    }
    expect(() => endKindFromProto(TurnEndKind.UNSPECIFIED)).toThrow(InvalidArgument);
  });

  it('maps context, group and member states', () => {
    expect([contextToProto('NEW'), contextToProto('LIVE'), contextToProto('RESTORED'), contextToProto('LOST')]).toEqual([ContextState.NEW, ContextState.LIVE, ContextState.RESTORED, ContextState.LOST]);
    expect(groupStateToProto('MIGRATING')).toBe(GroupState.MIGRATING);
    expect(memberStateToProto('IN_TURN', 'RUNNING')).toBe(MemberState.IN_TURN);
    expect(memberStateToProto('RETAINED', 'RUNNING')).toBe(MemberState.IDLE);
    expect(memberStateToProto('RETAINED', 'STOPPED')).toBe(MemberState.STOPPED);
    expect(memberStateToProto('RETAINED', 'LOST')).toBe(MemberState.LOST);
    expect(memberStateToProto('LOST', 'RUNNING')).toBe(MemberState.LOST);
    expect(memberStateToProto('FRESH', 'PENDING')).toBe(MemberState.PENDING);
  });

  it('reports the outcome as reason only when the turn was not a plain success', () => {
    expect(completeTurnToProto({ outcome: 'completed', sessionKept: true, savedLocator: 's' as never, nextContextState: 'LIVE' }).reason).toBe('');
    expect(completeTurnToProto({ outcome: 'unconfirmed', sessionKept: false, savedLocator: undefined, nextContextState: 'LOST' })).toEqual({ sessionKept: false, savedLocator: '', nextContextState: ContextState.LOST, reason: 'unconfirmed', groupProtected: false, protectionPending: false });
    expect(completeTurnToProto({ outcome: 'completed', sessionKept: true, savedLocator: 's' as never, nextContextState: 'RESTORED', groupProtected: true }).groupProtected).toBe(true);
    expect(completeTurnToProto({ outcome: 'completed', sessionKept: true, savedLocator: 's' as never, nextContextState: 'RESTORED', protectionPending: true }).protectionPending).toBe(true);
  });

  it('passes protect_in_background on only when the runner set it', () => {
    expect(completeTurnFromProto({ ...COMPLETE, protectInBackground: true }).protectInBackground).toBe(true);
    expect('protectInBackground' in completeTurnFromProto(COMPLETE)).toBe(false);
  });
});

describe('fuzzed requests', () => {
  const text = fc.oneof(fc.string({ maxLength: 300 }), fc.string({ unit: 'binary', maxLength: 40 }), fc.constantFrom('', 'ok-id', '..', 'a'.repeat(5000)));
  it('every parser either accepts or throws an InvalidArgument naming a field (never anything else)', () => {
    fc.assert(
      fc.property(text, text, text, text, fc.integer({ min: -3, max: 20 }), fc.integer(), fc.array(fc.record({ memberId: text, kind: fc.integer({ min: -1, max: 9 }) }), { maxLength: 12 }), (key, group, member, locator, kind, n, members) => {
        const calls: (() => unknown)[] = [
          () => openGroupFromProto({ idempotencyKey: key, conversationId: group, members: members as never }),
          () => beginTurnFromProto({ idempotencyKey: key, groupId: group, memberId: member, locator }),
          () => completeTurnFromProto({ idempotencyKey: key, groupId: group, memberId: member, turnId: locator, observedLocator: locator, evidence: { ...EVIDENCE, kind: kind as TurnEndKind, exitCode: n, errorMessage: member }, protectInBackground: n % 2 === 0 }),
          () => stopGroupFromProto({ idempotencyKey: key, groupId: group, graceMs: n }),
          () => getGroupStateFromProto({ groupId: group, conversationId: member }),
        ];
        for (const call of calls) {
          try {
            call();
          } catch (e) {
            expect(e).toBeInstanceOf(InvalidArgument);
            expect(typeof (e as InvalidArgument).details.field).toBe('string');
          }
        }
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });
});
