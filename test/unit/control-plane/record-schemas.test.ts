// Drift between core's unions and the stored record schemas (R-R4): every enum a record stores is
// built from core's exhaustive list of that union (core/exhaustive.ts makes a list that misses a
// member fail to compile), and this test checks the stored form accepts exactly those values — so a
// member added to a core union is storable at once, and nothing else is.
import { describe, expect, it } from 'vitest';
import {
  ATTESTATION_REASONS, CLI_KINDS, CONTEXT_STATES, GROUP_STATES, HOST_STATES, LOSS_REASONS, MEMBER_LOSS_REASONS,
  MEMBER_PHASES, REMOVAL_SOURCES, TURN_OUTCOMES, UNCLEAN_REASONS, UNCONFIRMED_CAUSES,
} from '../../../src/core/index.ts';
import { GroupLifecycleSchema, GroupRecordSchema, HostLifecycleSchema, LossReasonSchema } from '../../../src/control-plane/records.ts';

const lifecycle = { state: 'STOPPED', hostId: 'host-a', generation: 1, activityVersion: 1, lastActivityAtMs: 0, stop: { clean: true } };
const session = { memberId: 'm1', cli: 'claude_code', phase: 'RETAINED', savedLocator: 's-1', completedTurns: 1 };
const group = (patch: { lifecycle?: object; session?: object; member?: object }) => ({
  groupId: 'g-1', conversationId: 'c-1', lifecycle: { ...lifecycle, ...patch.lifecycle },
  members: [{ session: { ...session, ...patch.session }, ...patch.member }], starts: 1, stops: 1, createdAtMs: 0, updatedAtMs: 0,
});
const accepts = (schema: { safeParse(v: unknown): { success: boolean } }, v: unknown): boolean => schema.safeParse(v).success;

describe('record schemas accept exactly core\'s unions', () => {
  const cases: [string, readonly string[], (v: string) => boolean][] = [
    ['LossReason', LOSS_REASONS, (v) => accepts(LossReasonSchema, v)],
    ['GroupState', GROUP_STATES, (v) => accepts(GroupLifecycleSchema, { ...lifecycle, state: v })],
    ['HostState', HOST_STATES, (v) => accepts(HostLifecycleSchema, { state: v, epoch: 1 })],
    ['RemovalSource', REMOVAL_SOURCES, (v) => accepts(HostLifecycleSchema, { state: 'DRAINING', epoch: 1, goingAway: v })],
    ['AttestationReason', ATTESTATION_REASONS, (v) => accepts(HostLifecycleSchema, { state: 'UNATTESTED', epoch: 1, refusals: [v] })],
    ['UncleanReason', UNCLEAN_REASONS, (v) => accepts(GroupLifecycleSchema, { ...lifecycle, stop: { clean: false, findings: [{ memberId: 'm1', reason: v }] } })],
    ['CliKind', CLI_KINDS, (v) => accepts(GroupRecordSchema, group({ session: { cli: v } }))],
    ['MemberPhase', MEMBER_PHASES, (v) => accepts(GroupRecordSchema, group({ session: { phase: v } }))],
    ['TurnOutcome', TURN_OUTCOMES, (v) => accepts(GroupRecordSchema, group({ session: { lastTurn: { turnId: 't', outcome: v } } }))],
    ['UnconfirmedCause', UNCONFIRMED_CAUSES, (v) => accepts(GroupRecordSchema, group({ session: { unconfirmedCause: v } }))],
    ['MemberLossReason', MEMBER_LOSS_REASONS, (v) => accepts(GroupRecordSchema, group({ session: { lostReason: v } }))],
    ['ContextState', CONTEXT_STATES, (v) => accepts(GroupRecordSchema, group({ member: { lastContextState: v } }))],
  ];
  for (const [name, list, ok] of cases) {
    it(`${name}: every member is storable, a value outside it is not`, () => {
      for (const v of list) expect(ok(v), `${name} ${v}`).toBe(true);
      expect(ok('not_a_member_of_the_union')).toBe(false);
    });
  }
});
