// What a host may do with the containers it holds of one group (R-H6, R-R6): the rule a returning
// or re-registering host's cleanup follows. Deleting a writable layer destroys the only copy of a
// conversation that has no checkpoint, so deletion needs POSITIVE proof read from the group's own
// record — the group was destroyed, or it is placed and settled at this generation or later on
// another host, or it has been LOST for longer than the retention period. Absence proves nothing:
// no record, an unreadable record, a record that names this host, a migration or evacuation not
// finished, or a copy newer than the record all keep the copy. Pure: the caller reads the record.
import { everyMemberOf } from './exhaustive.ts';
import type { GroupLifecycle } from './group.ts';

/** The group's record as the control plane could read it (by key, never from a listing). */
export type GroupRecordView =
  | { readonly kind: 'absent' }
  /** Present but not readable (corrupt, written by a newer schema, a read error). */
  | { readonly kind: 'unreadable' }
  | {
    readonly kind: 'present';
    readonly lifecycle: GroupLifecycle;
    /** When the group became LOST (absent on records written before it was kept: kept forever). */
    readonly lostAtMs?: number | undefined;
  };

/** Why a copy is kept. */
export type CopyKeepReason =
  /** The record names this host: the copy is the group's live placement (evacuating or not). */
  | 'owned'
  | 'record_absent'
  | 'record_unreadable'
  /** A migration to or from this copy's generation is not finished. */
  | 'migration_pending'
  /** The group is being created: no placement has settled anywhere yet. */
  | 'placement_pending'
  /** The copy's generation is newer than the record's: nothing proves it is not needed. */
  | 'newer_than_record';

/** Why a copy is deleted: each is positive proof from the record. */
export type CopyDeleteReason =
  | 'destroyed'
  /** The record names another host, settled at the copy's generation or later. */
  | 'placed_elsewhere'
  /** LOST for longer than the retention period (an operator had that long to examine or recover it). */
  | 'lost_retention_expired';

export const COPY_KEEP_REASONS = everyMemberOf<CopyKeepReason>()(['owned', 'record_absent', 'record_unreadable', 'migration_pending', 'placement_pending', 'newer_than_record']);
export const COPY_DELETE_REASONS = everyMemberOf<CopyDeleteReason>()(['destroyed', 'placed_elsewhere', 'lost_retention_expired']);

/** Why a copy's containers are stopped but kept: LOST within its retention. */
export type CopyStopReason = 'lost_retained';
export const COPY_STOP_REASONS = everyMemberOf<CopyStopReason>()(['lost_retained']);

export type CopyVerdict =
  | { readonly action: 'keep'; readonly reason: CopyKeepReason }
  /**
   * LOST within its retention: the layers stay for an operator, the containers are stopped (a LOST
   * group takes no turns, and a process left running could still change the layer).
   */
  | { readonly action: 'stop'; readonly reason: CopyStopReason }
  /** Delete the group's containers of generation ≤ `upToGeneration` (never a newer one). */
  | { readonly action: 'delete'; readonly reason: CopyDeleteReason; readonly upToGeneration: number };

export interface HostCopy {
  /** The host holding the copy. */
  readonly hostId: string;
  /** The newest placement generation among the group's containers on that host. */
  readonly generation: number;
}

/**
 * The verdict for `copy` given the group's record at `nowMs`. `lostRetentionMs` ≤ 0 means LOST
 * groups are kept until an operator destroys them.
 */
export function decideHostCopy(record: GroupRecordView, copy: HostCopy, nowMs: number, lostRetentionMs: number): CopyVerdict {
  if (record.kind === 'absent') return { action: 'keep', reason: 'record_absent' };
  if (record.kind === 'unreadable') return { action: 'keep', reason: 'record_unreadable' };
  const lc = record.lifecycle;
  switch (lc.state) {
    case 'DESTROYED':
      return { action: 'delete', reason: 'destroyed', upToGeneration: copy.generation };
    case 'LOST': {
      const expired = lostRetentionMs > 0 && record.lostAtMs !== undefined && nowMs >= record.lostAtMs + lostRetentionMs;
      return expired ? { action: 'delete', reason: 'lost_retention_expired', upToGeneration: copy.generation } : { action: 'stop', reason: 'lost_retained' };
    }
    case 'PENDING':
      return lc.hostId === copy.hostId ? { action: 'keep', reason: 'owned' } : { action: 'keep', reason: 'placement_pending' };
    case 'MIGRATING':
      // Source (lc.hostId) and target both hold copies until the switch; a third host waits too.
      return lc.hostId === copy.hostId ? { action: 'keep', reason: 'owned' } : { action: 'keep', reason: 'migration_pending' };
    case 'RUNNING':
    case 'STOPPING':
    case 'STOPPED':
      if (lc.hostId === copy.hostId) return { action: 'keep', reason: 'owned' };
      // Settled on another host at this generation or later: a copy here of the same generation can
      // only be an aborted restore target; an older one, a placement the group has left.
      if (copy.generation <= lc.generation) return { action: 'delete', reason: 'placed_elsewhere', upToGeneration: copy.generation };
      return { action: 'keep', reason: 'newer_than_record' };
  }
}
