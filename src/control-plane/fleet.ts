// Placement candidates read from the fleet's read model, and the log-and-continue error summary of
// control loops. Load is counted from the group records, so a placement decided a moment ago is
// already counted once its write reached the model; beside it, what the host's latest heartbeat
// says it holds (placement.ts: room is judged by the larger of the two).
import { isFleetError } from '../core/index.ts';
import type { FleetState } from './fleet-state.ts';
import type { HostCandidate } from './placement.ts';

export { isTerminal } from './fleet-state.ts';

/** Every registered host as a placement candidate, with the members placed on or moving to it. */
export function candidates(fleet: FleetState): HostCandidate[] {
  const out: HostCandidate[] = [];
  for (const { value: h } of fleet.hosts()) {
    out.push({
      hostId: h.hostId,
      lifecycle: h.lifecycle,
      maxMembers: h.maxMembers,
      usedMembers: fleet.memberLoad(h.hostId),
      reportedMembers: fleet.heartbeat(h.hostId)?.usedMembers ?? 0,
      imageDigest: h.attestation.imageDigest,
      bridgeVersion: h.attestation.bridgeVersion,
    });
  }
  return out;
}

/** Log-and-continue for reconcile loops: one failing item must not stop the others. */
export function describeError(err: unknown): Record<string, unknown> {
  if (isFleetError(err)) return { reason: err.reason, status: err.status, message: err.message };
  return { message: err instanceof Error ? err.message : String(err) };
}
