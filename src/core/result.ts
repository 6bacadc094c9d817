// A minimal Result type: decisions that can be refused return the refusal as data, so callers must
// handle it (and tests can assert on it) instead of relying on exceptions for expected outcomes.

export type Result<T, E> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly error: E };

export function ok<T>(value: T): { readonly ok: true; readonly value: T } {
  return { ok: true, value };
}

export function err<E>(error: E): { readonly ok: false; readonly error: E } {
  return { ok: false, error };
}

/** Returns the value or throws the error (for call sites where a refusal is a programming error). */
export function unwrap<T, E>(result: Result<T, E>): T {
  if (result.ok) return result.value;
  throw result.error;
}
