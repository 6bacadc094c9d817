// Read views of stored records, shared by the runner backend and the admin operations.
import type { GroupView } from '../core/runner-port.ts';
import type { GroupRecord } from './records.ts';

/** The runner-port view of a group record (what GetGroupState answers too). */
export function groupView(g: GroupRecord, revision: number, hostEpoch: number): GroupView {
  return {
    groupId: g.groupId,
    conversationId: g.conversationId,
    state: g.lifecycle.state,
    hostId: g.lifecycle.hostId,
    hostEpoch,
    generation: g.lifecycle.generation,
    stopClean: g.lifecycle.stop?.clean,
    lostReason: g.lifecycle.lostReason,
    members: g.members.map((m) => ({
      memberId: m.session.memberId,
      cli: m.session.cli,
      phase: m.session.phase,
      savedLocator: m.session.savedLocator,
      containerId: m.containerId,
      turnInFlightId: m.session.inFlight?.turnId,
      completedTurns: m.session.completedTurns,
      lastContextState: m.lastContextState,
      lostReason: m.session.lostReason,
    })),
    latestCheckpointId: g.latestCheckpointId,
    createdAtMs: g.createdAtMs,
    updatedAtMs: g.updatedAtMs,
    lastActivityAtMs: g.lifecycle.lastActivityAtMs,
    activityVersion: g.lifecycle.activityVersion,
    revision,
  };
}
