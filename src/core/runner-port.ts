// The runner-facing port (R-I1, R-S1..R-S8): what the gRPC runner service needs from the control
// plane, in domain types. The control plane implements it (src/control-plane), the API layer
// (src/api) maps protobuf to it; neither imports the other. Methods throw FleetError subclasses
// (errors.ts) for refusals; src/api maps each to a gRPC status with the reason in the details.
import type { IdleStopAfter } from './idle-stop.ts';
import type { CliKind } from './turn-end-evidence.ts';
import type { GroupState } from './group.ts';
import type { MemberPhase, TurnOutcome, ContextState } from './member-session.ts';
import type { LossReason } from './loss.ts';
import { everyMemberOf } from './exhaustive.ts';

/** The native event kind that ended (or failed to end) a turn, as the runner SDK reports it. */
export type TurnEndKindName =
  | 'result'
  | 'turn_completed'
  | 'agent_end'
  | 'settled'
  | 'api_retry'
  | 'disconnect'
  | 'timeout'
  | 'cancelled'
  | 'rejected'
  | 'process_exited';

export const TURN_END_KIND_NAMES = everyMemberOf<TurnEndKindName>()(['result', 'turn_completed', 'agent_end', 'settled', 'api_retry', 'disconnect', 'timeout', 'cancelled', 'rejected', 'process_exited']);

/** Turn-end evidence from the runner's detector (R-S5, R-S6). */
export interface TurnEvidenceInput {
  readonly kind: TurnEndKindName;
  readonly nativeTurnEnded: boolean;
  readonly succeeded: boolean;
  readonly cleanupFinished: boolean;
  readonly transportUsable: boolean;
  readonly locatorUsable: boolean;
  /** R-S6: the process exits after this turn (Claude api_retry), so the next turn is RESTORED. */
  readonly processExited: boolean;
  readonly exitConfirmed: boolean;
  readonly exitCode?: number | undefined;
  readonly nativeTurnId?: string | undefined;
  readonly errorMessage?: string | undefined;
  /** Bytes the driver wrote to the CLI (the prompt as sent) and read from it, if it counted: diagnosis only. */
  readonly inputBytes?: number | undefined;
  readonly outputBytes?: number | undefined;
}

export interface MemberView {
  readonly memberId: string;
  readonly cli: CliKind;
  readonly phase: MemberPhase;
  readonly savedLocator?: string | undefined;
  readonly containerId?: string | undefined;
  readonly turnInFlightId?: string | undefined;
  readonly completedTurns: number;
  readonly lastContextState?: ContextState | undefined;
  readonly lostReason?: string | undefined;
}

export interface GroupView {
  readonly groupId: string;
  readonly conversationId: string;
  readonly state: GroupState;
  readonly hostId: string;
  readonly hostEpoch: number;
  readonly generation: number;
  /** Set once stopped: whether the last stop was clean (R-G2). */
  readonly stopClean?: boolean | undefined;
  readonly lostReason?: LossReason | undefined;
  readonly members: readonly MemberView[];
  readonly latestCheckpointId?: string | undefined;
  readonly createdAtMs: number;
  readonly updatedAtMs: number;
  readonly lastActivityAtMs: number;
  readonly activityVersion: number;
  /** Store revision of the group record (for operators; CAS happens inside the control plane). */
  readonly revision: number;
}

export interface OpenGroupInput {
  readonly idempotencyKey: string;
  readonly conversationId: string;
  readonly members: readonly { readonly memberId: string; readonly cli: CliKind }[];
  /**
   * The conversation's group is LOST or DESTROYED: open a new, empty group for it. Without it such
   * a conversation is refused `conversation_lost`; ignored while its group is alive.
   */
  readonly startAnew?: boolean | undefined;
  /**
   * The group's idle auto-stop (core idle-stop.ts): ms without activity before a clean stop and a
   * checkpoint (0: after every completed turn), or never; absent: the fleet's default.
   */
  readonly idleStopAfterMs?: IdleStopAfter | undefined;
}

export interface BeginTurnInput {
  readonly idempotencyKey: string;
  readonly groupId: string;
  readonly memberId: string;
  /** The runner's locator, if it sent one (R-S3: absent means "use the saved one"). */
  readonly locator?: string | undefined;
}

export interface BeginTurnView {
  readonly turnId: string;
  readonly contextState: Exclude<ContextState, 'LOST'>;
  /** The locator to resume; undefined for NEW. */
  readonly locator?: string | undefined;
  readonly hostId: string;
  readonly hostEpoch: number;
  readonly generation: number;
  readonly containerId: string;
  readonly startedAtMs: number;
  /** R-S6: the member's container was restarted first, ending a process whose exit was not confirmed. */
  readonly slotReclaimed?: boolean;
  /**
   * RunTurn only (never on the wire): the driver token of the begin that created the turn, stored
   * with the answer, so a repeat of the call (same key) learns that another call created it — a
   * call drives the turn only if this is its own token.
   */
  readonly driverToken?: string | undefined;
}

export interface CompleteTurnInput {
  readonly idempotencyKey: string;
  readonly groupId: string;
  readonly memberId: string;
  readonly turnId: string;
  readonly observedLocator?: string | undefined;
  readonly evidence: TurnEvidenceInput;
  /**
   * idle_stop_after 0: answer once the turn's end is stored and protect the group (clean stop and
   * checkpoint) after the answer (CompleteTurnView.protectionPending), not before it.
   */
  readonly protectInBackground?: boolean | undefined;
}

export interface CompleteTurnView {
  readonly outcome: TurnOutcome;
  readonly sessionKept: boolean;
  readonly savedLocator?: string | undefined;
  /** What the next BeginTurn will report if nothing else happens. */
  readonly nextContextState: ContextState;
  /**
   * The group was stopped cleanly with a checkpoint of its state before this answer (idle_stop_after
   * 0): the conversation survives the loss of its host. False/absent: it is not (yet) protected.
   */
  readonly groupProtected?: boolean | undefined;
  /** protectInBackground was asked: the group is stopped and checkpointed after this answer. */
  readonly protectionPending?: boolean | undefined;
}

export interface StopGroupInput {
  readonly idempotencyKey: string;
  readonly groupId: string;
  readonly graceMs?: number | undefined;
}

export interface StopGroupView {
  readonly group: GroupView;
  /** The checkpoint taken right after a clean stop (R-G3), if any. */
  readonly checkpointId?: string | undefined;
}

/**
 * The runner service's backend. Every mutating call is idempotent by `idempotencyKey`: a repeat
 * with the same key and the same request returns the first answer; the same key with a different
 * request is refused (InvalidArgument `idempotency_key_reused`).
 */
export interface RunnerBackend {
  /**
   * Refusals besides bad input: `conversation_lost` (FAILED_PRECONDITION, details groupId,
   * groupState, lostReason) for a conversation whose group is LOST or DESTROYED unless `startAnew`;
   * `member_set_mismatch` (INVALID_ARGUMENT) for other members than the group's.
   */
  openGroup(input: OpenGroupInput): Promise<{ readonly group: GroupView; readonly created: boolean }>;
  beginTurn(input: BeginTurnInput): Promise<BeginTurnView>;
  completeTurn(input: CompleteTurnInput): Promise<CompleteTurnView>;
  stopGroup(input: StopGroupInput): Promise<StopGroupView>;
  getGroupState(query: { readonly groupId?: string | undefined; readonly conversationId?: string | undefined }): Promise<GroupView>;
}
