// Idempotency keys of mutating runner calls (R-I1): the first answer (value or refusal) is persisted
// under the key; a repeat of the same request gets it back, the same key with another request is
// refused (`idempotency_key_reused`). Work that runs before the answer is stored is itself
// idempotent (deterministic turn ids, CAS), so a crash between the two is safe to retry.
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
import type { IdempotencyRecord } from './records.ts';
import { Keys, type ControlPlaneContext } from './state.ts';

const MAX_KEY = 128;

export function validateIdempotencyKey(key: unknown): string {
  if (typeof key !== 'string' || key.length === 0) throw new InvalidArgument('empty_value', 'idempotencyKey is required', { details: { field: 'idempotencyKey' } });
  if (key.length > MAX_KEY) throw new InvalidArgument('value_too_long', `idempotencyKey exceeds ${MAX_KEY} characters`, { details: { field: 'idempotencyKey', maxLength: MAX_KEY } });
  return key;
}

export function requestHash(request: unknown): string {
  return createHash('sha256').update(JSON.stringify(request)).digest('hex');
}

/** Rebuild a stored refusal as the same FleetError class with the same reason. */
function revive(outcome: Extract<IdempotencyRecord['outcome'], { ok: false }>): Error {
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
function isFinalRefusal(err: unknown): err is FleetError<Reason> {
  return isFleetError(err) && (err instanceof IdentityRefused || err instanceof PreconditionFailed || err instanceof InvalidArgument || err instanceof NotFound);
}

export async function withIdempotency<T>(ctx: ControlPlaneContext, operation: string, key: string, request: unknown, run: () => Promise<T>): Promise<T> {
  const k = Keys.idempotency(operation, validateIdempotencyKey(key));
  const hash = requestHash(request);
  const replay = (rec: IdempotencyRecord): T => {
    if (rec.operation !== operation || rec.requestHash !== hash) {
      throw new InvalidArgument('idempotency_key_reused', `idempotency key already used for a different ${operation} request`, { details: { field: 'idempotencyKey' } });
    }
    if (rec.outcome.ok) return rec.outcome.value as T;
    throw revive(rec.outcome);
  };
  const existing = await ctx.repos.idempotency.get(k);
  if (existing !== undefined) return replay(existing.value);

  let outcome: IdempotencyRecord['outcome'];
  let thrown: unknown;
  let value: T | undefined;
  try {
    value = await run();
    outcome = { ok: true, value: JSON.parse(JSON.stringify(value)) as unknown };
  } catch (err) {
    if (!isFinalRefusal(err)) throw err;
    thrown = err;
    const details: Record<string, string | number | boolean> = {};
    for (const [dk, dv] of Object.entries(err.details)) if (dv !== undefined) details[dk.slice(0, 64)] = typeof dv === 'string' ? dv.slice(0, 512) : dv;
    outcome = { ok: false, errorClass: err.constructor.name, reason: err.reason, message: err.message.slice(0, 1024), details };
  }
  try {
    await ctx.repos.idempotency.create(k, { operation, requestHash: hash, createdAtMs: ctx.now(), outcome });
  } catch (err) {
    // A concurrent repeat stored its answer first: both ran the same idempotent work; return the stored one.
    if (err instanceof CasConflictError) {
      const stored = await ctx.repos.idempotency.get(k);
      if (stored !== undefined) return replay(stored.value);
    }
    throw err;
  }
  if (thrown !== undefined) throw thrown;
  return value as T;
}
