// Checkpoint retention (R-G7): keep the newest `keepN` valid checkpoints per live group; everything
// else (older ones, invalid ones, those of destroyed groups) is garbage. Checkpoints pinned by an
// in-progress migration are never selected, whatever their age, so GC cannot race a restore.
import { InvalidArgument } from './errors.ts';
import type { GroupLifecycle } from './group.ts';

export interface RetainedCheckpoint {
  readonly checkpointId: string;
  readonly groupId: string;
  readonly createdAtMs: number;
  /** Manifest present and well-formed (a checkpoint without a manifest does not exist, R-G3). */
  readonly valid: boolean;
}

/**
 * The checkpoint ids to delete. `keepN` ≥ 1 (keeping none would delete the only way back).
 * Ties on `createdAtMs` are broken by id so the choice is deterministic across replicas.
 */
export function selectCheckpointsToDelete(
  checkpoints: readonly RetainedCheckpoint[],
  keepN: number,
  destroyedGroupIds: ReadonlySet<string>,
  pinnedIds: ReadonlySet<string> = new Set(),
): string[] {
  if (!Number.isInteger(keepN) || keepN < 1) {
    throw new InvalidArgument('out_of_range', 'keepN must be an integer >= 1', { details: { field: 'keepN', value: keepN } });
  }
  const keep = new Set<string>();
  const validByGroup = new Map<string, RetainedCheckpoint[]>();
  for (const c of checkpoints) {
    if (!c.valid || destroyedGroupIds.has(c.groupId)) continue;
    const list = validByGroup.get(c.groupId) ?? [];
    list.push(c);
    validByGroup.set(c.groupId, list);
  }
  for (const list of validByGroup.values()) {
    list.sort((a, b) => b.createdAtMs - a.createdAtMs || (a.checkpointId < b.checkpointId ? 1 : a.checkpointId > b.checkpointId ? -1 : 0));
    for (const c of list.slice(0, keepN)) keep.add(c.checkpointId);
  }
  const out = new Set<string>();
  for (const c of checkpoints) {
    if (!keep.has(c.checkpointId) && !pinnedIds.has(c.checkpointId)) out.add(c.checkpointId);
  }
  return [...out];
}

/**
 * True for a group STOPPED after a clean stop: the only groups R-G6 restores from a checkpoint after
 * a host loss (running ones are LOST `host_lost_running`, unclean ones `unclean_stop`, whatever
 * their checkpoints).
 */
export function restorableFromCheckpoint(lc: Pick<GroupLifecycle, 'state' | 'stop'>): boolean {
  return lc.state === 'STOPPED' && lc.stop?.clean === true;
}

/**
 * When the checkpoint `c` (the group's latest) was taken, if it covers the group's current state (same
 * activity version, taken after the last activity); undefined when there is none or it is stale.
 */
export function usableCheckpointTakenAt(
  lc: Pick<GroupLifecycle, 'activityVersion' | 'lastActivityAtMs'>,
  c: { readonly activityVersion: number; readonly createdAtMs: number } | undefined,
): number | undefined {
  if (c === undefined || c.activityVersion !== lc.activityVersion || c.createdAtMs < lc.lastActivityAtMs) return undefined;
  return c.createdAtMs;
}
