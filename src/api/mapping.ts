// Protobuf ↔ domain for the runner service (R-I1, R-R4). Every request field is validated and
// bounded here, before the backend sees it, with an InvalidArgument whose `details.field` names
// the offending field; ids go through the core parse* validators so the same rules hold on every
// boundary. Responses are built from domain views; enums map both ways through explicit tables
// (an unknown value is refused, never defaulted).
import { parseIdleStopAfterMs } from '../core/idle-stop.ts';
import {
  InvalidArgument,
  parseConversationId,
  parseGroupId,
  parseLocator,
  parseMemberId,
  parseOptionalLocator,
  parseTurnId,
  type InvalidArgumentReason,
  type Result,
} from '../core/index.ts';
import type { CliKind as DomainCliKind } from '../core/turn-end-evidence.ts';
import type { ContextState as DomainContextState, MemberPhase } from '../core/member-session.ts';
import type { GroupState as DomainGroupState } from '../core/group.ts';
import type {
  BeginTurnInput,
  BeginTurnView,
  CompleteTurnInput,
  CompleteTurnView,
  GroupView,
  MemberView,
  OpenGroupInput,
  StopGroupInput,
  StopGroupView,
  TurnEndKindName,
  TurnEvidenceInput,
} from '../core/runner-port.ts';
import { CliKind, ContextState, Group, GroupState, Member, MemberState, StopOutcome, TurnEndKind } from '../gen/sandboxfleet/v1/common.ts';
import type {
  BeginTurnRequest,
  BeginTurnResponse,
  CompleteTurnRequest,
  CompleteTurnResponse,
  GetGroupStateRequest,
  OpenGroupRequest,
  StopGroupRequest,
  StopGroupResponse,
} from '../gen/sandboxfleet/v1/runner.ts';

/** Bounds of the runner API (R-R4); documented in runner.proto. */
export const LIMITS = {
  idempotencyKeyMaxLength: 128,
  maxMembers: 8,
  errorMessageMaxLength: 4096,
  nativeTurnIdMaxLength: 256,
  maxGraceMs: 10 * 60_000,
  exitCodeMin: -255,
  exitCodeMax: 255,
} as const;

// Visible ASCII only: keys end up in store keys and logs; no spaces or control characters.
const IDEMPOTENCY_KEY = /^[\x21-\x7e]+$/;
// Free text from the runner: no control characters except tab/newline.
// eslint-disable-next-line no-control-regex
const CONTROL_CHARS = /[\x00-\x08\x0b-\x1f\x7f]/;

function invalid(reason: InvalidArgumentReason, field: string, message: string, extra: Record<string, string | number> = {}): InvalidArgument {
  return new InvalidArgument(reason, message, { details: { field, ...extra } });
}

function must<T>(result: Result<T, InvalidArgument>): T {
  if (!result.ok) throw result.error;
  return result.value;
}

export function parseIdempotencyKey(raw: unknown, field = 'idempotency_key'): string {
  if (typeof raw !== 'string') throw invalid('not_a_string', field, `${field} must be a string`);
  if (raw.length === 0) throw invalid('empty_value', field, `${field} is required on every mutating call`);
  if (raw.length > LIMITS.idempotencyKeyMaxLength) {
    throw invalid('value_too_long', field, `${field} exceeds ${LIMITS.idempotencyKeyMaxLength} characters`, { maxLength: LIMITS.idempotencyKeyMaxLength });
  }
  if (!IDEMPOTENCY_KEY.test(raw)) throw invalid('invalid_characters', field, `${field} must be visible ASCII without spaces`);
  return raw;
}

function boundedText(raw: unknown, field: string, maxLength: number): string | undefined {
  if (raw === undefined || raw === '') return undefined;
  if (typeof raw !== 'string') throw invalid('not_a_string', field, `${field} must be a string`);
  if (raw.length > maxLength) throw invalid('value_too_long', field, `${field} exceeds ${maxLength} characters`, { maxLength });
  if (CONTROL_CHARS.test(raw)) throw invalid('invalid_characters', field, `${field} contains control characters`);
  return raw;
}

// ---------------------------------------------------------------------------------------------
// Enums, both directions.

const CLI_FROM_PROTO = new Map<CliKind, DomainCliKind>([
  [CliKind.CLAUDE_CODE, 'claude_code'],
  [CliKind.CODEX, 'codex'],
  [CliKind.PI, 'pi'],
  [CliKind.OPENCODE, 'opencode'],
  [CliKind.KILO, 'kilo'],
]);
const CLI_TO_PROTO = new Map<DomainCliKind, CliKind>([...CLI_FROM_PROTO].map(([p, d]) => [d, p]));

export function cliFromProto(kind: CliKind, field = 'kind'): DomainCliKind {
  const cli = CLI_FROM_PROTO.get(kind);
  if (cli === undefined) throw invalid('out_of_range', field, `${field} must be a known CLI kind`, { value: Number(kind) });
  return cli;
}

export function cliToProto(cli: DomainCliKind): CliKind {
  return CLI_TO_PROTO.get(cli) ?? CliKind.UNSPECIFIED;
}

const END_KIND_FROM_PROTO = new Map<TurnEndKind, TurnEndKindName>([
  [TurnEndKind.RESULT, 'result'],
  [TurnEndKind.TURN_COMPLETED, 'turn_completed'],
  [TurnEndKind.AGENT_END, 'agent_end'],
  [TurnEndKind.SETTLED, 'settled'],
  [TurnEndKind.API_RETRY, 'api_retry'],
  [TurnEndKind.DISCONNECT, 'disconnect'],
  [TurnEndKind.TIMEOUT, 'timeout'],
  [TurnEndKind.CANCELLED, 'cancelled'],
  [TurnEndKind.REJECTED, 'rejected'],
  [TurnEndKind.PROCESS_EXITED, 'process_exited'],
]);
/** The kinds that are a native turn end (R-S5); the others never are, whatever the flags say. */
export const NATIVE_END_KINDS: ReadonlySet<TurnEndKindName> = new Set(['result', 'turn_completed', 'agent_end', 'settled', 'api_retry']);

export function endKindFromProto(kind: TurnEndKind, field = 'evidence.kind'): TurnEndKindName {
  const name = END_KIND_FROM_PROTO.get(kind);
  if (name === undefined) throw invalid('out_of_range', field, `${field} must be a known turn end kind`, { value: Number(kind) });
  return name;
}

const CONTEXT_TO_PROTO: Readonly<Record<DomainContextState, ContextState>> = {
  NEW: ContextState.NEW,
  LIVE: ContextState.LIVE,
  RESTORED: ContextState.RESTORED,
  LOST: ContextState.LOST,
};
export const contextToProto = (state: DomainContextState): ContextState => CONTEXT_TO_PROTO[state];

const GROUP_STATE_TO_PROTO: Readonly<Record<DomainGroupState, GroupState>> = {
  PENDING: GroupState.PENDING,
  RUNNING: GroupState.RUNNING,
  STOPPING: GroupState.STOPPING,
  STOPPED: GroupState.STOPPED,
  MIGRATING: GroupState.MIGRATING,
  LOST: GroupState.LOST,
  DESTROYED: GroupState.DESTROYED,
};
export const groupStateToProto = (state: DomainGroupState): GroupState => GROUP_STATE_TO_PROTO[state];

/** Member phase → wire state. The container side comes from the group (a stopped group's members are STOPPED). */
export function memberStateToProto(phase: MemberPhase, group: DomainGroupState): MemberState {
  if (phase === 'LOST' || group === 'LOST') return MemberState.LOST;
  if (phase === 'IN_TURN') return MemberState.IN_TURN;
  if (group === 'PENDING') return MemberState.PENDING;
  if (group === 'RUNNING') return MemberState.IDLE;
  return MemberState.STOPPED;
}

// ---------------------------------------------------------------------------------------------
// Requests → domain inputs.

export function openGroupFromProto(request: OpenGroupRequest): OpenGroupInput {
  const idempotencyKey = parseIdempotencyKey(request.idempotencyKey);
  const conversationId = must(parseConversationId(request.conversationId, 'conversation_id'));
  const members = request.members ?? [];
  if (members.length === 0) throw invalid('empty_value', 'members', 'members must name at least one member');
  if (members.length > LIMITS.maxMembers) {
    throw invalid('too_many_entries', 'members', `at most ${LIMITS.maxMembers} members`, { max: LIMITS.maxMembers, count: members.length });
  }
  const seen = new Set<string>();
  const parsed = members.map((m, i) => {
    const memberId = must(parseMemberId(m?.memberId, `members[${i}].member_id`));
    if (seen.has(memberId)) throw invalid('malformed', `members[${i}].member_id`, 'member ids must be unique within a group', { memberId });
    seen.add(memberId);
    return { memberId, cli: cliFromProto(m.kind, `members[${i}].kind`) };
  });
  const idle = must(parseIdleStopAfterMs(request.idleStopAfterMs, 'idle_stop_after_ms'));
  return { idempotencyKey, conversationId, members: parsed, ...(request.startAnew === true ? { startAnew: true } : {}), ...(idle !== undefined ? { idleStopAfterMs: idle } : {}) };
}

export function beginTurnFromProto(request: BeginTurnRequest): BeginTurnInput {
  return {
    idempotencyKey: parseIdempotencyKey(request.idempotencyKey),
    groupId: must(parseGroupId(request.groupId, 'group_id')),
    memberId: must(parseMemberId(request.memberId, 'member_id')),
    // R-S3: an absent (or empty) locator means "use the saved one"; a present one must be valid.
    locator: must(parseOptionalLocator(request.locator, 'locator')),
  };
}

function evidenceFromProto(request: CompleteTurnRequest): TurnEvidenceInput {
  const e = request.evidence;
  if (e === undefined) throw invalid('empty_value', 'evidence', 'evidence is required');
  const kind = endKindFromProto(e.kind);
  if (e.exitCode !== undefined && (!Number.isInteger(e.exitCode) || e.exitCode < LIMITS.exitCodeMin || e.exitCode > LIMITS.exitCodeMax)) {
    throw invalid('out_of_range', 'evidence.exit_code', `evidence.exit_code must be within ${LIMITS.exitCodeMin}..${LIMITS.exitCodeMax}`);
  }
  const nativeTurnId = boundedText(e.nativeTurnId, 'evidence.native_turn_id', LIMITS.nativeTurnIdMaxLength);
  const inputBytes = byteCount(e.inputBytes, 'evidence.input_bytes');
  const outputBytes = byteCount(e.outputBytes, 'evidence.output_bytes');
  const errorMessage = boundedText(e.errorMessage, 'evidence.error_message', LIMITS.errorMessageMaxLength);
  // R-S5: only a native end kind can end a turn; a disconnect claiming "ended" is still not an end.
  const nativeTurnEnded = e.nativeTurnEnded && NATIVE_END_KINDS.has(kind);
  return {
    kind,
    nativeTurnEnded,
    succeeded: nativeTurnEnded && e.succeeded,
    cleanupFinished: e.cleanupFinished,
    transportUsable: e.transportUsable,
    locatorUsable: e.locatorUsable,
    processExited: e.processExited,
    exitConfirmed: e.exitConfirmed,
    exitCode: e.exitCode,
    nativeTurnId,
    errorMessage,
    inputBytes,
    outputBytes,
  };
}

/** An optional byte count of the evidence: a non-negative safe integer (int64 arrives as a number). */
function byteCount(raw: number | undefined, field: string): number | undefined {
  if (raw === undefined) return undefined;
  if (!Number.isSafeInteger(raw) || raw < 0) throw invalid('out_of_range', field, `${field} must be within 0..${Number.MAX_SAFE_INTEGER}`);
  return raw;
}

export function completeTurnFromProto(request: CompleteTurnRequest): CompleteTurnInput {
  const observed = request.observedLocator;
  return {
    idempotencyKey: parseIdempotencyKey(request.idempotencyKey),
    groupId: must(parseGroupId(request.groupId, 'group_id')),
    memberId: must(parseMemberId(request.memberId, 'member_id')),
    turnId: must(parseTurnId(request.turnId, 'turn_id')),
    observedLocator: observed === undefined || observed === '' ? undefined : must(parseLocator(observed, 'observed_locator')),
    evidence: evidenceFromProto(request),
    ...(request.protectInBackground ? { protectInBackground: true } : {}),
  };
}

export function stopGroupFromProto(request: StopGroupRequest): StopGroupInput {
  const grace = request.graceMs;
  if (!Number.isSafeInteger(grace) || grace < 0 || grace > LIMITS.maxGraceMs) {
    throw invalid('out_of_range', 'grace_ms', `grace_ms must be within 0..${LIMITS.maxGraceMs}`);
  }
  return {
    idempotencyKey: parseIdempotencyKey(request.idempotencyKey),
    groupId: must(parseGroupId(request.groupId, 'group_id')),
    graceMs: grace === 0 ? undefined : grace,
  };
}

export function getGroupStateFromProto(request: GetGroupStateRequest): { groupId?: string; conversationId?: string } {
  const hasGroup = request.groupId !== '';
  const hasConversation = request.conversationId !== '';
  if (hasGroup === hasConversation) {
    throw invalid('malformed', 'group_id', 'exactly one of group_id or conversation_id must be set');
  }
  return hasGroup
    ? { groupId: must(parseGroupId(request.groupId, 'group_id')) }
    : { conversationId: must(parseConversationId(request.conversationId, 'conversation_id')) };
}

// ---------------------------------------------------------------------------------------------
// Domain views → responses.

function memberToProto(m: MemberView, group: DomainGroupState): Member {
  return Member.create({
    memberId: m.memberId,
    kind: cliToProto(m.cli),
    state: memberStateToProto(m.phase, group),
    savedLocator: m.savedLocator ?? '',
    containerId: m.containerId ?? '',
    turnInFlightId: m.turnInFlightId ?? '',
    completedTurns: m.completedTurns,
    lastContextState: m.lastContextState === undefined ? ContextState.UNSPECIFIED : contextToProto(m.lastContextState),
    processKept: m.lastContextState === 'LIVE',
    lossReason: m.lostReason ?? '',
  });
}

export function groupToProto(g: GroupView): Group {
  return Group.create({
    groupId: g.groupId,
    conversationId: g.conversationId,
    state: groupStateToProto(g.state),
    stateReason: g.lostReason ?? '',
    hostId: g.hostId,
    hostEpoch: g.hostEpoch,
    placementGeneration: g.generation,
    stopOutcome: g.stopClean === undefined ? StopOutcome.UNSPECIFIED : g.stopClean ? StopOutcome.CLEAN : StopOutcome.UNCLEAN,
    lossReason: g.lostReason ?? '',
    members: g.members.map((m) => memberToProto(m, g.state)),
    latestCheckpointId: g.latestCheckpointId ?? '',
    createdAtUnixMs: g.createdAtMs,
    updatedAtUnixMs: g.updatedAtMs,
    lastActivityAtUnixMs: g.lastActivityAtMs,
    revision: g.revision,
    activityVersion: g.activityVersion,
  });
}

export function beginTurnToProto(v: BeginTurnView): BeginTurnResponse {
  return {
    turnId: v.turnId,
    contextState: contextToProto(v.contextState),
    locator: v.locator ?? '',
    hostId: v.hostId,
    hostEpoch: v.hostEpoch,
    placementGeneration: v.generation,
    containerId: v.containerId,
    startedAtUnixMs: v.startedAtMs,
    slotReclaimed: v.slotReclaimed ?? false,
  };
}

export function completeTurnToProto(v: CompleteTurnView): CompleteTurnResponse {
  return {
    sessionKept: v.sessionKept,
    savedLocator: v.savedLocator ?? '',
    nextContextState: contextToProto(v.nextContextState),
    // The outcome is the machine reason whenever the session was not kept as a plain success.
    reason: v.outcome === 'completed' ? '' : v.outcome,
    groupProtected: v.groupProtected === true,
    protectionPending: v.protectionPending === true,
  };
}

export function stopGroupToProto(v: StopGroupView): StopGroupResponse {
  const clean = v.group.stopClean;
  return {
    group: groupToProto(v.group),
    outcome: clean === undefined ? StopOutcome.UNSPECIFIED : clean ? StopOutcome.CLEAN : StopOutcome.UNCLEAN,
    checkpointId: v.checkpointId ?? '',
  };
}
