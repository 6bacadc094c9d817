// Typed domain errors with a stable, machine-readable `reason`.
// Why: callers (runner, CLI, alerts, tests) branch on `reason`, never on message text, and the api
// layer maps each error *category* to one gRPC status in a single table (R-I1). Core only names
// the status it means (`status`), it does not import gRPC.

import { everyMemberOf } from './exhaustive.ts';
import { LOSS_REASONS, type LossReason } from './loss.ts';

/** Reasons of bad input (R-R4): the request can never succeed as sent. */
export type InvalidArgumentReason =
  | 'not_a_string'
  | 'not_a_number'
  | 'empty_value'
  | 'value_too_long'
  | 'invalid_characters'
  | 'out_of_range'
  | 'too_large'
  | 'too_many_entries'
  | 'malformed'
  | 'unsupported_schema_version'
  | 'path_traversal'
  | 'link_escapes_root'
  | 'device_node'
  | 'decompression_ratio'
  | 'invalid_config'
  /** The same idempotency key was sent with a different request (R-I1). */
  | 'idempotency_key_reused'
  /** An exec's client sent more stdin than the server's credit allowed (R-I9). */
  | 'stdin_over_credit'
  /** OpenGroup for a conversation whose group has other members (ids or CLI kinds): members are fixed for a group's life. */
  | 'member_set_mismatch';

/** Reasons a turn is refused because the native session identity cannot be confirmed (R-S1..R-S3, R-S8). */
export type IdentityReason =
  /** The request's or the observed locator differs from the saved one (R-S2, R-S3). */
  | 'locator_mismatch'
  /** A retained member has no recoverable locator, or the turn end reported none (R-S3). */
  | 'locator_missing'
  /** The observed locator is not a well-formed native session id. */
  | 'locator_invalid'
  /** A turn is already in flight for this member (R-S8). */
  | 'turn_in_flight'
  /** The member's native state or container integrity cannot be confirmed: context state LOST (R-S1). */
  | 'context_lost'
  /**
   * OpenGroup for a conversation whose group is LOST (or was destroyed): its native history is gone,
   * so a new, empty group is opened only when the runner asks for one (start_anew), never quietly.
   */
  | 'conversation_lost';

/** Reasons an operation is refused because the current state does not allow it. */
export type PreconditionReason =
  | 'invalid_transition'
  | 'unclean_stop'
  | 'checkpoint_not_usable'
  | 'host_not_ready'
  | 'attestation_refused'
  /** Exec needs the group RUNNING on its host (R-I9). */
  | 'group_not_running'
  /** RunTurn for a CLI the fleet cannot drive itself (R-I9). */
  | 'cli_unsupported'
  /** An operation ended the group LOST (e.g. a migration whose checkpoint the target refused): why. */
  | LossReason;

/** Reasons a write lost a compare-and-set race: re-read and redo the read-modify-write. */
export type ConflictReason = 'cas_conflict';

export type NotFoundReason =
  | 'host_not_found'
  | 'group_not_found'
  | 'member_not_found'
  | 'checkpoint_not_found'
  | 'turn_not_found';

/** Reasons a retry later may succeed. */
export type UnavailableReason = 'store_unavailable' | 'host_unreachable' | 'container_missing' | 'observer_stalled' | 'gc_in_progress'
  /** An exec's host became SUSPECT/DEAD/REMOVED or changed epoch while it ran (R-I9). */
  | 'host_fenced'
  /** A frame of an exec was lost between the control plane and its host (R-I9). */
  | 'exec_transport_lost';

export type NoCapacityReason = 'no_capacity' | 'no_eligible_host';

/** Reasons a message from an agent is rejected by fencing (R-H6). */
export type FencedReason =
  /** The message carries an older host epoch than the current registration. */
  | 'stale_epoch'
  /** The message carries an epoch newer than any this control plane knows: its view must be re-read. */
  | 'unknown_epoch'
  /** The message carries an older placement generation than the group's current one. */
  | 'stale_generation'
  /** The message carries a placement generation newer than the group's current one. */
  | 'unknown_generation'
  /** The member's container restarted since the caller saw it (Exec's expected incarnation, R-I9). */
  | 'stale_incarnation';

/** Every stable reason string a FleetError can carry. */
export type Reason =
  | InvalidArgumentReason
  | IdentityReason
  | PreconditionReason
  | ConflictReason
  | NotFoundReason
  | UnavailableReason
  | NoCapacityReason
  | FencedReason;

// Every reason of each category, as lists the compiler holds equal to the unions (everyMemberOf):
// the proto comments name exactly these (test/unit/proto-reasons.test.ts), and so do clients.
export const INVALID_ARGUMENT_REASONS = everyMemberOf<InvalidArgumentReason>()([
  'not_a_string', 'not_a_number', 'empty_value', 'value_too_long', 'invalid_characters', 'out_of_range', 'too_large',
  'too_many_entries', 'malformed', 'unsupported_schema_version', 'path_traversal', 'link_escapes_root', 'device_node',
  'decompression_ratio', 'invalid_config', 'idempotency_key_reused', 'stdin_over_credit', 'member_set_mismatch',
]);
export const IDENTITY_REASONS = everyMemberOf<IdentityReason>()(['locator_mismatch', 'locator_missing', 'locator_invalid', 'turn_in_flight', 'context_lost', 'conversation_lost']);
export const PRECONDITION_REASONS = everyMemberOf<PreconditionReason>()(['invalid_transition', 'unclean_stop', 'checkpoint_not_usable', 'host_not_ready', 'attestation_refused', 'group_not_running', 'cli_unsupported', ...LOSS_REASONS]);
export const CONFLICT_REASONS = everyMemberOf<ConflictReason>()(['cas_conflict']);
export const NOT_FOUND_REASONS = everyMemberOf<NotFoundReason>()(['host_not_found', 'group_not_found', 'member_not_found', 'checkpoint_not_found', 'turn_not_found']);
export const UNAVAILABLE_REASONS = everyMemberOf<UnavailableReason>()(['store_unavailable', 'host_unreachable', 'container_missing', 'observer_stalled', 'gc_in_progress', 'host_fenced', 'exec_transport_lost']);
export const NO_CAPACITY_REASONS = everyMemberOf<NoCapacityReason>()(['no_capacity', 'no_eligible_host']);
export const FENCED_REASONS = everyMemberOf<FencedReason>()(['stale_epoch', 'unknown_epoch', 'stale_generation', 'unknown_generation', 'stale_incarnation']);

/** Every Reason a FleetError can carry, each once. */
export const REASONS: readonly Reason[] = [...new Set<Reason>([
  ...INVALID_ARGUMENT_REASONS, ...IDENTITY_REASONS, ...PRECONDITION_REASONS, ...CONFLICT_REASONS,
  ...NOT_FOUND_REASONS, ...UNAVAILABLE_REASONS, ...NO_CAPACITY_REASONS, ...FENCED_REASONS,
])];

/**
 * Reasons the API layer raises itself (src/api), not the domain: authorization (PERMISSION_DENIED),
 * cancellation and deadlines, a method this server does not serve (UNIMPLEMENTED), and `internal`
 * for anything unexpected (INTERNAL, no detail leaves the process).
 */
export type ApiReason = 'role_missing' | 'role_not_allowed' | 'cancelled' | 'deadline_exceeded' | 'method_not_served' | 'internal';
export const API_REASONS = everyMemberOf<ApiReason>()(['role_missing', 'role_not_allowed', 'cancelled', 'deadline_exceeded', 'method_not_served', 'internal']);

/**
 * Reasons of state-store adapter errors that reach a client (src/api/errors.ts maps them by name):
 * the domain's own cas_conflict and store_unavailable, and a record refused for its size or shape or
 * key. The store's other reasons never leave the control plane.
 */
export type StoreWireReason = 'cas_conflict' | 'store_unavailable' | 'record_too_large' | 'record_invalid' | 'invalid_key';
export const STORE_WIRE_REASONS = everyMemberOf<StoreWireReason>()(['cas_conflict', 'store_unavailable', 'record_too_large', 'record_invalid', 'invalid_key']);

/** gRPC status names (strings only: core does not import gRPC). The api layer's table maps these. */
export type StatusName =
  | 'INVALID_ARGUMENT'
  | 'FAILED_PRECONDITION'
  | 'ABORTED'
  | 'NOT_FOUND'
  | 'UNAVAILABLE'
  | 'RESOURCE_EXHAUSTED';

/** Structured, log-safe details (ids, field names, limits); never secrets. */
export type ErrorDetails = Readonly<Record<string, string | number | boolean | undefined>>;

/** Base class of every domain error. */
export abstract class FleetError<R extends Reason = Reason> extends Error {
  /** The status this category means; the api layer maps it to a gRPC code in one table. */
  abstract readonly status: StatusName;
  readonly reason: R;
  readonly details: ErrorDetails;

  constructor(reason: R, message: string, options: { cause?: unknown; details?: ErrorDetails } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.reason = reason;
    this.details = options.details ?? {};
  }
}

/** Bad input: INVALID_ARGUMENT. `details.field` names the offending field when known. */
export class InvalidArgument extends FleetError<InvalidArgumentReason> {
  readonly status = 'INVALID_ARGUMENT' as const;
}

/** Session identity refusal: FAILED_PRECONDITION (R-S1..R-S3, R-S8). */
export class IdentityRefused extends FleetError<IdentityReason> {
  readonly status = 'FAILED_PRECONDITION' as const;
}

/** State does not allow the operation: FAILED_PRECONDITION. */
export class PreconditionFailed extends FleetError<PreconditionReason> {
  readonly status = 'FAILED_PRECONDITION' as const;
}

/** Compare-and-set lost: ABORTED (the caller redoes read-modify-write). */
export class Conflict extends FleetError<ConflictReason> {
  readonly status = 'ABORTED' as const;
}

export class NotFound extends FleetError<NotFoundReason> {
  readonly status = 'NOT_FOUND' as const;
}

/** A retry later may work: UNAVAILABLE. */
export class Unavailable extends FleetError<UnavailableReason> {
  readonly status = 'UNAVAILABLE' as const;
}

/** No host can take the work: RESOURCE_EXHAUSTED. */
export class NoCapacity extends FleetError<NoCapacityReason> {
  readonly status = 'RESOURCE_EXHAUSTED' as const;
}

/** A message from a revoked epoch or an old placement generation (R-H6): FAILED_PRECONDITION. */
export class Fenced extends FleetError<FencedReason> {
  readonly status = 'FAILED_PRECONDITION' as const;
}

/** True for any FleetError (also across realms where `instanceof` of a subclass may be inconvenient). */
export function isFleetError(value: unknown): value is FleetError {
  return value instanceof FleetError;
}
