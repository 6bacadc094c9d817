// Runner-API helpers shared by the NATS-cluster tests and the chaos runner: the turn-end evidence
// of a successful native turn, and retrying a runner call across faults the way a runner does (the
// same idempotency key again, so a call that was applied before its answer got lost is answered
// from its record, never applied twice, R-I1).
import { setTimeout as sleep } from 'node:timers/promises';
import { isFleetError, Unavailable } from '../../src/core/errors.ts';

/** Turn-end evidence of a successful native turn (what the runner SDK reports). */
export const SUCCESS = {
  kind: 'result' as const, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: false, exitConfirmed: false,
};

/** A refusal the fleet means (bad state, conflict, fencing, not found): retrying the same call cannot change it. */
export function isFinalRefusal(err: unknown): boolean {
  return isFleetError(err) && !(err instanceof Unavailable);
}

/**
 * Call `fn` until it answers, a final refusal comes (thrown), or `timeoutMs` passes (the last error
 * is thrown). Store timeouts, closed connections and Unavailable are retried after `everyMs`.
 */
export async function retryCall<T>(fn: () => Promise<T>, timeoutMs = 60_000, everyMs = 500): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (isFinalRefusal(err) || Date.now() + everyMs > end) throw err;
      await sleep(everyMs);
    }
  }
}
