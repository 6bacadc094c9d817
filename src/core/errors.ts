// Typed domain errors with a stable, machine-readable `reason`.
// Why: callers (runner, CLI, alerts, tests) branch on `reason`, never on message text, and the api
// layer maps each error *category* to one gRPC status in a single table (R-I1). Core only names
// the status it means (`status`), it does not import gRPC.

import type { LossReason } from './loss.ts';

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
  | 'idempotency_key_reused';

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
  | 'context_lost';

/** Reasons an operation is refused because the current state does not allow it. */
export type PreconditionReason =
  | 'invalid_transition'
  | 'unclean_stop'
  | 'checkpoint_not_usable'
  | 'host_not_ready'
  | 'attestation_refused'
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
export type UnavailableReason = 'store_unavailable' | 'host_unreachable' | 'container_missing' | 'observer_stalled' | 'gc_in_progress';

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
  | 'unknown_generation';

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
