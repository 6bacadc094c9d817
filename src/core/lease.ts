// Host leases and fencing (R-H4, R-H6). The epoch is the fencing token of a host registration; the
// placement generation is the fencing token of a group's placement. A message is accepted only if it
// carries exactly the current values: older ones come from a revoked agent or an earlier placement,
// newer ones mean this reader's view is out of date. Either way the message must not be applied.
import { Fenced } from './errors.ts';
import { err, ok, type Result } from './result.ts';

export interface HostLease {
  /** Fencing token; increases on every (re)registration. */
  readonly epoch: number;
  /** End of the host's term (spot/rental), if it has one. */
  readonly expiresAtMs?: number | undefined;
}

/** True once the host must be drained ahead of its term end (`marginMs` before `expiresAtMs`). */
export function shouldDrain(lease: HostLease, nowMs: number, marginMs: number): boolean {
  return lease.expiresAtMs !== undefined && nowMs >= lease.expiresAtMs - marginMs;
}

/** The fencing tokens on a command or report. `generation` is present when it concerns a group. */
export interface FenceTokens {
  readonly epoch: number;
  readonly generation?: number | undefined;
}

/**
 * Accept only a message with the current epoch and (when it concerns a group) the current placement
 * generation. `current.generation` undefined means the message's group has no current placement here.
 */
export function checkFence(message: FenceTokens, current: FenceTokens): Result<void, Fenced> {
  if (message.epoch < current.epoch) {
    return err(new Fenced('stale_epoch', 'message from a revoked host epoch', {
      details: { messageEpoch: message.epoch, currentEpoch: current.epoch },
    }));
  }
  if (message.epoch > current.epoch) {
    return err(new Fenced('unknown_epoch', 'message from an epoch newer than the current registration', {
      details: { messageEpoch: message.epoch, currentEpoch: current.epoch },
    }));
  }
  if (message.generation !== undefined || current.generation !== undefined) {
    const m = message.generation ?? -1;
    const c = current.generation ?? -1;
    if (m < c) {
      return err(new Fenced('stale_generation', 'message for an earlier placement of the group', {
        details: { messageGeneration: message.generation, currentGeneration: current.generation },
      }));
    }
    if (m > c) {
      return err(new Fenced('unknown_generation', 'message for a placement this reader does not know', {
        details: { messageGeneration: message.generation, currentGeneration: current.generation },
      }));
    }
  }
  return ok(undefined);
}
