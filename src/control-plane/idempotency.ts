// Idempotency keys of mutating runner calls (R-I1): the first answer (value or refusal) is persisted
// under the key; a repeat of the same request gets it back, the same key with another request is
// refused (`idempotency_key_reused`). Two stores, one rule:
// - OpenGroup/StopGroup: an answer record in the idempotency bucket (withIdempotency). Work that runs
//   before the answer is stored is itself idempotent (deterministic ids, CAS), so a crash between
//   the two is safe to retry.
// - BeginTurn/CompleteTurn (the hot path): the answer rides in the same group-record CAS as the member
//   change it reports (records.ts TurnCalls, see runner-backend.ts), so a turn pair costs two fsynced
//   writes instead of four. This file holds the encoding both share. A begin refused because another
//   turn is in flight is stored apart (`refusedInFlight`): it must not displace the answer of the
//   turn in flight, whose retry with its own key still gets that turn.
import { createHash } from 'node:crypto';
import {
  Conflict,
  FleetError,
  IdentityRefused,
  InvalidArgument,
  NoCapacity,
  NotFound,
  PreconditionFailed,
  isFleetError,
  type Reason,
} from '../core/index.ts';
import { CasConflictError } from '../store/errors.ts';
import type { CallOutcome, IdempotencyRecord, TurnCalls } from './records.ts';
import { Keys, type ControlPlaneDeps } from './state.ts';

const MAX_KEY = 128;

export function validateIdempotencyKey(key: unknown): string {
  if (typeof key !== 'string' || key.length === 0) throw new InvalidArgument('empty_value', 'idempotencyKey is required', { details: { field: 'idempotencyKey' } });
  if (key.length > MAX_KEY) throw new InvalidArgument('value_too_long', `idempotencyKey exceeds ${MAX_KEY} characters`, { details: { field: 'idempotencyKey', maxLength: MAX_KEY } });
  return key;
}

export function requestHash(request: unknown): string {
  return createHash('sha256').update(JSON.stringify(request)).digest('hex');
}

/** The digest a turn call's key is stored under (scoped by call kind, so begin and complete never collide). */
export function keyDigest(operation: string, key: string): string {
  return createHash('sha256').update(`${operation}|${key}`).digest('hex').slice(0, 32);
}

/** Rebuild a stored refusal as the same FleetError class with the same reason. */
function revive(outcome: Extract<CallOutcome, { ok: false }>): Error {
  const opts = { details: outcome.details ?? {} };
  const reason = outcome.reason as never;
  switch (outcome.errorClass) {
    case 'IdentityRefused': return new IdentityRefused(reason, outcome.message, opts);
    case 'PreconditionFailed': return new PreconditionFailed(reason, outcome.message, opts);
    case 'InvalidArgument': return new InvalidArgument(reason, outcome.message, opts);
    case 'NotFound': return new NotFound(reason, outcome.message, opts);
    case 'NoCapacity': return new NoCapacity(reason, outcome.message, opts);
    default: return new Conflict('cas_conflict', outcome.message, opts);
  }
}

/** Refusals worth remembering: a retry would get the same answer. Transient errors are not stored. */
export function isFinalRefusal(err: unknown): err is FleetError<Reason> {
  return isFleetError(err) && (err instanceof IdentityRefused || err instanceof PreconditionFailed || err instanceof InvalidArgument || err instanceof NotFound);
}

/** The storable form of an answer (a JSON round trip, so a replay returns exactly what is stored). */
export function valueOutcome(value: unknown): CallOutcome {
  return { ok: true, value: JSON.parse(JSON.stringify(value)) as unknown };
}

/** The storable form of a final refusal (details bounded to the schema's limits). */
export function refusalOutcome(err: FleetError<Reason>): CallOutcome {
  const details: Record<string, string | number | boolean> = {};
  for (const [dk, dv] of Object.entries(err.details)) if (dv !== undefined) details[dk.slice(0, 64)] = typeof dv === 'string' ? dv.slice(0, 512) : dv;
  return { ok: false, errorClass: err.constructor.name, reason: err.reason, message: err.message.slice(0, 1024), details };
}

/** Return a stored answer, or throw the stored refusal. */
export function replayOutcome<T>(outcome: CallOutcome): T {
  if (outcome.ok) return outcome.value as T;
  throw revive(outcome);
}

export function keyReused(operation: string, why = `idempotency key already used for a different ${operation} request`): InvalidArgument {
  return new InvalidArgument('idempotency_key_reused', why, { details: { field: 'idempotencyKey' } });
}

export async function withIdempotency<T>(ctx: Pick<ControlPlaneDeps, 'idempotency' | 'now'>, operation: string, key: string, request: unknown, run: () => Promise<T>): Promise<T> {
  const k = Keys.idempotency(operation, validateIdempotencyKey(key));
  const hash = requestHash(request);
  const replay = (rec: IdempotencyRecord): T => {
    if (rec.operation !== operation || rec.requestHash !== hash) throw keyReused(operation);
    return replayOutcome<T>(rec.outcome);
  };
  const existing = await ctx.idempotency.get(k);
  if (existing !== undefined) return replay(existing.value);

  let outcome: CallOutcome;
  let thrown: unknown;
  let value: T | undefined;
  try {
    value = await run();
    outcome = valueOutcome(value);
  } catch (err) {
    if (!isFinalRefusal(err)) throw err;
    thrown = err;
    outcome = refusalOutcome(err);
  }
  try {
    await ctx.idempotency.create(k, { operation, requestHash: hash, createdAtMs: ctx.now(), outcome });
  } catch (err) {
    // A concurrent repeat stored its answer first: both ran the same idempotent work; return the stored one.
    if (err instanceof CasConflictError) {
      const stored = await ctx.idempotency.get(k);
      if (stored !== undefined) return replay(stored.value);
    }
    throw err;
  }
  if (thrown !== undefined) throw thrown;
  return value as T;
}

// ---- turn calls: the answer stored inside the group record ----------------------------------------

export type TurnCallKind = 'begin' | 'complete';

/** How many older keys per member are remembered (refused as reused, never re-executed). */
const OLDER_KEYS = 16;

/**
 * What a member's stored calls say about a request: the stored answer (same key, same request), a
 * refusal (same key, another request; or a key older than the last call, whose answer is no longer
 * kept), or undefined (a new call: run it).
 */
export function findTurnCall(calls: TurnCalls | undefined, kind: TurnCallKind, key: string, request: string): { readonly outcome: CallOutcome } | { readonly refusal: InvalidArgument } | undefined {
  for (const stored of kind === 'begin' ? [calls?.begin, calls?.refusedInFlight] : [calls?.complete]) {
    if (stored !== undefined && stored.key === key) {
      return stored.request === request ? { outcome: stored.outcome } : { refusal: keyReused(kind === 'begin' ? 'beginTurn' : 'completeTurn') };
    }
  }
  if (calls?.older.includes(key)) {
    return { refusal: keyReused(kind === 'begin' ? 'beginTurn' : 'completeTurn', 'idempotency key already used for an earlier turn of this member; its answer is no longer kept') };
  }
  return undefined;
}

/**
 * The member's calls after answering `kind` with `outcome`: the previous answer's key becomes
 * "older". `slot` 'refusedInFlight' stores a begin refused `turn_in_flight` beside the begin answer
 * instead of over it (the turn in flight keeps its stored answer).
 */
export function recordTurnCall(calls: TurnCalls | undefined, kind: TurnCallKind, key: string, request: string, outcome: CallOutcome, slot: 'answer' | 'refusedInFlight' = 'answer'): TurnCalls {
  const field = slot === 'refusedInFlight' ? 'refusedInFlight' : kind;
  const previous = calls?.[field]?.key;
  const older = previous === undefined || previous === key ? [...(calls?.older ?? [])] : [...(calls?.older ?? []), previous];
  return { ...calls, [field]: { key, request, outcome }, older: older.slice(-OLDER_KEYS) };
}
