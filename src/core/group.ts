// Sandbox group lifecycle (R-G1), one state union and one transition function. Migration can only
// start from a clean stop with a usable checkpoint (R-G2, R-G4): the transition itself refuses
// anything else, so no caller can migrate an unclean group or restore from a stale/corrupt checkpoint.
// `activityVersion` is the "nothing happened since" clock of R-G4: a checkpoint records it and is only
// fresh while it still equals the group's.
import { PreconditionFailed } from './errors.ts';
import { err, ok, type Result } from './result.ts';
import type { StopVerdict } from './clean-stop.ts';
import type { CheckpointAssessment } from './checkpoint.ts';
import type { LossReason } from './loss.ts';
import { everyMemberOf } from './exhaustive.ts';

export type GroupState =
  /** Created and placed on `hostId`; member containers being created. No turn has run. */
  | 'PENDING'
  /** Member containers run on `hostId`; turns may run. */
  | 'RUNNING'
  /** A stop was requested; members got SIGTERM and are exiting. */
  | 'STOPPING'
  /** Containers stopped on `hostId`, writable layers kept; `stop` says clean or unclean (R-G2). */
  | 'STOPPED'
  /** Clean and checkpointed; being restored onto `migration.targetHostId` (source still STOPPED there). */
  | 'MIGRATING'
  /** Terminal: the native state cannot be recovered; `lostReason` says why (R-G6, R-R1). */
  | 'LOST'
  /** Terminal: destroyed by explicit request. */
  | 'DESTROYED';

export const GROUP_STATES = everyMemberOf<GroupState>()(['PENDING', 'RUNNING', 'STOPPING', 'STOPPED', 'MIGRATING', 'LOST', 'DESTROYED']);

export interface GroupLifecycle {
  readonly state: GroupState;
  /** The host of the current placement. */
  readonly hostId: string;
  /** Placement generation (fencing, R-H6): +1 on every new placement (migration). */
  readonly generation: number;
  /** +1 on every event that can change native state (start, completed turn, stop). */
  readonly activityVersion: number;
  readonly lastActivityAtMs: number;
  /**
   * Set in RUNNING and STOPPING: when the containers last started. Until a clean stop and a
   * checkpoint the group is unprotected (a host loss makes it LOST, R-G6): the exposure's start.
   */
  readonly runningSinceMs?: number;
  /** The verdict of the last stop; set in STOPPED and MIGRATING. */
  readonly stop?: StopVerdict;
  /** Set in MIGRATING. */
  readonly migration?: { readonly targetHostId: string; readonly checkpointId: string };
  /** Set in LOST; never undefined there. */
  readonly lostReason?: LossReason;
}

export type GroupEvent =
  /** Containers are running (first start on PENDING, or resume on the same host from STOPPED). */
  | { readonly type: 'started' }
  /** A native turn completed on a member (R-G4: makes older checkpoints stale). */
  | { readonly type: 'turn_completed' }
  /**
   * A process ran in a member container outside a turn (Exec, R-I9): it may have changed native
   * state (older checkpoints become stale, R-G4) and the group is not idle (no idle stop under it).
   */
  | { readonly type: 'exec_activity' }
  | { readonly type: 'stop_requested' }
  /** All member containers have stopped; the verdict comes from decideStopCleanliness. */
  | { readonly type: 'stopped'; readonly verdict: StopVerdict }
  | { readonly type: 'migration_started'; readonly targetHostId: string; readonly assessment: CheckpointAssessment }
  /** Restore proven on the target (R-G5): the group is placed there with a new generation. */
  | { readonly type: 'migration_completed'; readonly targetHostId: string }
  /** The restore failed; the group stays STOPPED on its source (which must still exist). */
  | { readonly type: 'migration_aborted' }
  | { readonly type: 'lost'; readonly reason: LossReason }
  | { readonly type: 'destroyed' };

/** A new group placed on `hostId` (generation 1). */
export function createGroup(hostId: string, nowMs: number): GroupLifecycle {
  return { state: 'PENDING', hostId, generation: 1, activityVersion: 0, lastActivityAtMs: nowMs };
}

function refuse(group: GroupLifecycle, event: GroupEvent, reason: 'invalid_transition' | 'unclean_stop' | 'checkpoint_not_usable' = 'invalid_transition', extra: Record<string, string> = {}): Result<GroupLifecycle, PreconditionFailed> {
  return err(new PreconditionFailed(reason, `group event ${event.type} refused in ${group.state}: ${reason}`, {
    details: { state: group.state, event: event.type, ...extra },
  }));
}

function touched(group: GroupLifecycle, nowMs: number): Pick<GroupLifecycle, 'activityVersion' | 'lastActivityAtMs'> {
  return { activityVersion: group.activityVersion + 1, lastActivityAtMs: Math.max(group.lastActivityAtMs, nowMs) };
}

function base(group: GroupLifecycle): Pick<GroupLifecycle, 'hostId' | 'generation' | 'activityVersion' | 'lastActivityAtMs'> {
  return { hostId: group.hostId, generation: group.generation, activityVersion: group.activityVersion, lastActivityAtMs: group.lastActivityAtMs };
}

/** The only way a group's lifecycle changes. */
export function transitionGroup(group: GroupLifecycle, event: GroupEvent, nowMs: number): Result<GroupLifecycle, PreconditionFailed> {
  if (group.state === 'DESTROYED') {
    return event.type === 'destroyed' ? ok(group) : refuse(group, event);
  }
  switch (event.type) {
    case 'started':
      // An unclean group may still resume on the same host (R-G2).
      if (group.state !== 'PENDING' && group.state !== 'STOPPED') return refuse(group, event);
      return ok({ ...base(group), ...touched(group, nowMs), state: 'RUNNING', runningSinceMs: nowMs });
    case 'turn_completed':
      if (group.state !== 'RUNNING' && group.state !== 'STOPPING') return refuse(group, event);
      return ok({ ...group, ...touched(group, nowMs) });
    case 'exec_activity':
      if (group.state !== 'RUNNING') return refuse(group, event);
      return ok({ ...group, ...touched(group, nowMs) });
    case 'stop_requested':
      if (group.state !== 'RUNNING') return refuse(group, event);
      return ok({ ...group, state: 'STOPPING' });
    case 'stopped':
      // RUNNING → STOPPED covers containers that exited without our stop (always unclean evidence).
      if (group.state !== 'STOPPING' && group.state !== 'RUNNING') return refuse(group, event);
      return ok({ ...base(group), ...touched(group, nowMs), state: 'STOPPED', stop: event.verdict });
    case 'migration_started':
      if (group.state !== 'STOPPED') return refuse(group, event);
      if (group.stop === undefined || !group.stop.clean) return refuse(group, event, 'unclean_stop');
      if (!event.assessment.usable) return refuse(group, event, 'checkpoint_not_usable', { checkpointReason: event.assessment.reason });
      if (event.targetHostId === group.hostId) return refuse(group, event);
      return ok({ ...group, state: 'MIGRATING', migration: { targetHostId: event.targetHostId, checkpointId: event.assessment.checkpointId } });
    case 'migration_completed':
      if (group.state !== 'MIGRATING' || group.migration?.targetHostId !== event.targetHostId) return refuse(group, event);
      // The restored layers are the checkpoint's: native state is unchanged, so the version stays and
      // the same checkpoint remains usable if the new host is lost before anything runs there.
      return ok({
        state: 'STOPPED',
        hostId: event.targetHostId,
        generation: group.generation + 1,
        activityVersion: group.activityVersion,
        lastActivityAtMs: group.lastActivityAtMs,
        stop: { clean: true },
      });
    case 'migration_aborted':
      if (group.state !== 'MIGRATING') return refuse(group, event);
      return ok({ ...base(group), state: 'STOPPED', ...(group.stop ? { stop: group.stop } : {}) });
    case 'lost':
      if (group.state === 'LOST') return ok(group);
      return ok({ ...base(group), state: 'LOST', lostReason: event.reason });
    case 'destroyed':
      return ok({ ...base(group), state: 'DESTROYED' });
  }
}
