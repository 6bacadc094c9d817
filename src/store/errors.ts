// Typed errors of the state store, each with a stable machine-readable `reason`, and the one
// place that translates NATS/JetStream client errors into them. Callers branch on `reason`
// (or instanceof), never on NATS error messages. The two errors the domain has names for are
// core FleetErrors: CasConflictError is a core Conflict (cas_conflict → ABORTED) and
// StoreUnavailableError a core Unavailable (store_unavailable → UNAVAILABLE). The others are
// adapter-specific StoreErrors; src/api/errors.ts maps them by `reason`.
import { JetStreamApiCodes, JetStreamApiError } from '@nats-io/jetstream';
import { ClosedConnectionError, ConnectionError, DrainingConnectionError, NoRespondersError, RequestError, TimeoutError } from '@nats-io/transport-node';
import { Conflict, isFleetError, Unavailable } from '../core/errors.ts';

/** Reasons of the adapter-specific errors (CasConflictError and StoreUnavailableError carry core reasons). */
export type StoreErrorReason =
  | 'record_too_large'
  | 'record_invalid'
  | 'invalid_key'
  | 'store_config_mismatch'
  | 'object_not_found'
  | 'object_corrupt';

/** Base class: every store error has a `reason` a caller (or the API error table) can switch on. */
export class StoreError extends Error {
  readonly reason: StoreErrorReason;
  constructor(reason: StoreErrorReason, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.reason = reason;
  }
}

/**
 * A compare-and-set write lost: the key's current revision is not `expectedRevision`
 * (0 means "expected absent", i.e. a create found the key present). Redo the
 * read-modify-write; never overwrite blindly (R-R2: every state write is CAS).
 */
export class CasConflictError extends Conflict {
  readonly bucket: string;
  readonly key: string;
  readonly expectedRevision: number;
  constructor(bucket: string, key: string, expectedRevision: number, options?: ErrorOptions) {
    const what = expectedRevision === 0 ? 'expected the key to be absent' : `expected revision ${expectedRevision}`;
    super('cas_conflict', `CAS conflict on ${bucket}/${key}: ${what}`, { cause: options?.cause, details: { bucket, key, expectedRevision } });
    this.bucket = bucket;
    this.key = key;
    this.expectedRevision = expectedRevision;
  }
  /** True when the failed write was a create (key already existed). */
  get expectedAbsent(): boolean {
    return this.expectedRevision === 0;
  }
}

/** An encoded record exceeds its bound (R-R4); nothing was written. */
export class RecordTooLargeError extends StoreError {
  readonly where: string;
  readonly sizeBytes: number;
  readonly limitBytes: number;
  constructor(where: string, sizeBytes: number, limitBytes: number, options?: ErrorOptions) {
    super('record_too_large', `record ${where} is ${sizeBytes} bytes, limit ${limitBytes}`, options);
    this.where = where;
    this.sizeBytes = sizeBytes;
    this.limitBytes = limitBytes;
  }
}

/** A record failed validation: on write nothing was written; on read the stored bytes are corrupt. */
export class RecordInvalidError extends StoreError {
  readonly where: string;
  /** Short, bounded description of what is wrong (schema issues or parse error). */
  readonly problems: readonly string[];
  constructor(where: string, problems: readonly string[], options?: ErrorOptions) {
    const shown = problems.slice(0, 5);
    super('record_invalid', `record ${where} is invalid: ${shown.join('; ')}${problems.length > shown.length ? '; …' : ''}`, options);
    this.where = where;
    this.problems = shown;
  }
}

/** A key, object name or subject token does not fit the allowed charset/length. */
export class InvalidKeyError extends StoreError {
  readonly key: string;
  constructor(key: string, why: string) {
    const shown = key.length > 80 ? `${key.slice(0, 80)}…` : key;
    super('invalid_key', `invalid key ${JSON.stringify(shown)}: ${why}`);
    this.key = shown;
  }
}

/**
 * NATS did not answer (timeout, no responders, connection closed). `ambiguous` is true when a
 * write was sent and may or may not have been applied: do NOT blindly retry a
 * read-modify-write then; re-read first (the revision tells whether it landed).
 */
export class StoreUnavailableError extends Unavailable {
  readonly ambiguous: boolean;
  constructor(message: string, ambiguous: boolean, options?: ErrorOptions) {
    super('store_unavailable', message, { cause: options?.cause, details: { ambiguous } });
    this.ambiguous = ambiguous;
  }
}

/** An existing bucket/stream has settings that cannot be reconciled with the declared ones. */
export class StoreConfigMismatchError extends StoreError {
  constructor(message: string, options?: ErrorOptions) {
    super('store_config_mismatch', message, options);
  }
}

/** A named object is absent from an object bucket. */
export class ObjectNotFoundError extends StoreError {
  readonly bucket: string;
  readonly objectName: string;
  constructor(bucket: string, objectName: string) {
    super('object_not_found', `object ${bucket}/${objectName} not found`);
    this.bucket = bucket;
    this.objectName = objectName;
  }
}

/** A stored object's bytes do not match its recorded digest (R-R2: never restore from corrupt data). */
export class ObjectCorruptError extends StoreError {
  readonly bucket: string;
  readonly objectName: string;
  constructor(bucket: string, objectName: string, options?: ErrorOptions) {
    super('object_corrupt', `object ${bucket}/${objectName} failed digest verification`, options);
    this.bucket = bucket;
    this.objectName = objectName;
  }
}

function isWrongLastSequence(err: unknown): boolean {
  return (
    err instanceof JetStreamApiError &&
    (err.code === JetStreamApiCodes.StreamWrongLastSequence || err.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)
  );
}

/** JetStream API error code for "message size exceeds maximum allowed" (server NewJSStreamMessageExceedsMaximumError). */
const MESSAGE_EXCEEDS_MAXIMUM = 10054;
/**
 * JSClusterNotAvailErr, "JetStream system temporarily unavailable": the stream (or the meta group)
 * has no leader while a NATS node restarts or an election runs; JetStream API requests (a KV get is
 * a STREAM.MSG.GET here) answer it at once.
 */
const CLUSTER_NOT_AVAILABLE = 10008;
/**
 * JSStreamDuplicateMessageConflict, "duplicate message id is in process": a publish with the same
 * Nats-Msg-Id (an event append's retry) is proposed and not applied yet; it may still land.
 */
const DUPLICATE_IN_PROCESS = 10158;

/**
 * A publish refused because the same message id (an event's id) is being applied from another
 * publish right now: two replicas appending one event, or an append and its own retry. Not a
 * failure of the store; the retry finds it stored (a duplicate) or stores it.
 */
export function isDuplicateInProcess(err: unknown): boolean {
  const cause = err instanceof StoreUnavailableError ? err.cause : err;
  return cause instanceof JetStreamApiError && cause.code === DUPLICATE_IN_PROCESS;
}

/**
 * nats.js turns a JetStream publish that no server answered (no responders: the stream has no
 * leader while a NATS node restarts or its streams elect) into `JetStreamNotEnabled`, a class it
 * does not export; known by its name and its no-responders cause. The same class with a JetStream
 * API cause (JetStream disabled for the account) is a configuration error and stays unknown.
 */
function isNoJetStreamResponder(err: unknown): boolean {
  return err instanceof Error && err.name === 'JetStreamNotEnabled' && err.cause instanceof RequestError && err.cause.isNoResponders();
}

function isUnavailable(err: unknown): boolean {
  return (
    err instanceof TimeoutError ||
    err instanceof NoRespondersError ||
    err instanceof ClosedConnectionError ||
    err instanceof DrainingConnectionError ||
    err instanceof ConnectionError ||
    // A request's RequestError caused by another RequestError: the connection was closed under it.
    (err instanceof RequestError && (err.isNoResponders() || err.cause instanceof TimeoutError || err.cause instanceof RequestError)) ||
    (err instanceof JetStreamApiError && (err.code === CLUSTER_NOT_AVAILABLE || err.code === DUPLICATE_IN_PROCESS)) ||
    isNoJetStreamResponder(err)
  );
}

export interface WriteContext {
  readonly bucket: string;
  readonly key: string;
  /** 0 for a create. */
  readonly expectedRevision: number;
  readonly sizeBytes: number;
  readonly limitBytes: number;
}

/** Already one of ours (or a domain error raised inside a callback): pass through unchanged. */
function isTranslated(err: unknown): boolean {
  return err instanceof StoreError || isFleetError(err);
}

/** Translate an error thrown by a CAS write into a store error; unknown errors pass through. */
export function translateWriteError(err: unknown, ctx: WriteContext): unknown {
  if (isTranslated(err)) return err;
  if (isWrongLastSequence(err)) return new CasConflictError(ctx.bucket, ctx.key, ctx.expectedRevision, { cause: err });
  if (err instanceof JetStreamApiError && err.code === MESSAGE_EXCEEDS_MAXIMUM) {
    return new RecordTooLargeError(`${ctx.bucket}/${ctx.key}`, ctx.sizeBytes, ctx.limitBytes, { cause: err });
  }
  if (isUnavailable(err)) {
    return new StoreUnavailableError(`write to ${ctx.bucket}/${ctx.key} got no answer from NATS: ${(err as Error).message}`, true, { cause: err });
  }
  return err;
}

/** Translate an error thrown by a read; reads are never ambiguous. */
export function translateReadError(err: unknown, where: string): unknown {
  if (isTranslated(err)) return err;
  if (isUnavailable(err)) {
    return new StoreUnavailableError(`read of ${where} got no answer from NATS: ${(err as Error).message}`, false, { cause: err });
  }
  return err;
}
