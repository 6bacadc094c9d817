// Runner-API helpers shared by the NATS-cluster tests and the chaos runner: the turn-end evidence
// of a successful native turn, and retrying a runner call across faults the way a runner does (the
// same idempotency key again, so a call that was applied before its answer got lost is answered
// from its record, never applied twice, R-I1).
import * as grpc from '@grpc/grpc-js';
import { setTimeout as sleep } from 'node:timers/promises';
import { isFleetError, Unavailable } from '../../src/core/errors.ts';
import type { TurnEndEvidence } from '../../src/gen/sandboxfleet/v1/runner.ts';
import { RunnerError, WireTurnEndKind as TurnEndKind } from '../../src/runner-sdk/index.ts';

/** Turn-end evidence of a successful native turn (what the runner SDK reports). */
export const SUCCESS = {
  kind: 'result' as const, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: false, exitConfirmed: false,
};

/** The same evidence as the runner SDK puts it on the wire (CompleteTurn over gRPC). */
export const WIRE_SUCCESS: TurnEndEvidence = {
  kind: TurnEndKind.RESULT, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: false, exitConfirmed: false, nativeTurnId: '', errorMessage: '',
};

/**
 * Codes a runner may retry with the same idempotency key (R-I1): the SDK's retryable ones, and its
 * own deadline or a dropped connection (the call may have been applied; its key answers it again).
 */
const RETRIED_CODES = new Set<grpc.status>([grpc.status.UNAVAILABLE, grpc.status.ABORTED, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]);

/**
 * A refusal the fleet means (bad state, conflict, fencing, not found): retrying the same call
 * cannot change it. Over gRPC that is every code a runner does not retry, INTERNAL included: a
 * runner does not retry an internal error, so neither does the workload (it is counted instead).
 */
export function isFinalRefusal(err: unknown): boolean {
  if (err instanceof RunnerError) return !RETRIED_CODES.has(err.code);
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
