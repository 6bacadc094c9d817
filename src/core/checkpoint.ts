// Is a checkpoint recent and recoverable? (R-G4). A checkpoint may be used for migration only if
// nothing happened to the group since it was taken, it is not older than the configured maximum,
// every blob is present and digest-verified, and it fits the target host (same base image digest,
// same live-bridge version). Anything less is a named reason, which loss.ts turns into LOST (R-G6).
// `CheckpointSummary` is the control plane's compact view of a stored manifest (R-G3).

export interface CheckpointMemberSummary {
  readonly memberId: string;
  /** The layer blob exists in the checkpoint store. */
  readonly blobPresent: boolean;
  /** The blob was read and its sha256 equals the manifest's digest. */
  readonly digestVerified: boolean;
}

export interface CheckpointSummary {
  readonly checkpointId: string;
  readonly groupId: string;
  /** The placement generation the checkpoint was taken from (audit, fencing of its writer). */
  readonly placementGeneration: number;
  readonly createdAtMs: number;
  /** The group's `activityVersion` when the checkpoint was taken (see group.ts). */
  readonly activityVersion: number;
  readonly baseImageDigest: string;
  readonly bridgeVersion: number;
  readonly members: readonly CheckpointMemberSummary[];
}

/** What the assessment needs to know about the group now. */
export interface GroupFreshness {
  readonly groupId: string;
  /** Bumped by every event that can change native state (completed turns, start, stop). */
  readonly activityVersion: number;
  /** When that last happened (a second, clock-based guard next to the version). */
  readonly lastActivityAtMs: number;
  readonly memberIds: readonly string[];
}

/** The host a restore would go to. */
export interface CheckpointTarget {
  /** Base image digests present on the target (its attested image digest). */
  readonly imageDigests: ReadonlySet<string>;
  /** The target's proven live-bridge version. */
  readonly bridgeVersion: number;
}

export type CheckpointUnusableReason =
  | 'no_checkpoint'
  /** The checkpoint belongs to another group or does not cover exactly the group's members. */
  | 'checkpoint_mismatch'
  /** Taken before the last completed turn / state change, or older than the maximum age. */
  | 'stale_checkpoint'
  /** A blob is missing or its digest was not verified. */
  | 'checkpoint_corrupt'
  | 'base_image_mismatch'
  | 'bridge_version_mismatch';

export type CheckpointAssessment =
  | { readonly usable: true; readonly checkpointId: string }
  | {
      readonly usable: false;
      /** The reason a LOST decision reports (the first in `reasons`). */
      readonly reason: CheckpointUnusableReason;
      /** Every reason found, most fundamental first. */
      readonly reasons: readonly CheckpointUnusableReason[];
      readonly checkpointId?: string;
    };

function unusable(reasons: CheckpointUnusableReason[], checkpointId?: string): CheckpointAssessment {
  const [reason] = reasons;
  if (reason === undefined) throw new Error('unusable() needs a reason');
  return checkpointId === undefined ? { usable: false, reason, reasons } : { usable: false, reason, reasons, checkpointId };
}

/** Judge one checkpoint (normally the group's newest) for a restore onto `target` at `nowMs`. */
export function assessCheckpoint(
  group: GroupFreshness,
  checkpoint: CheckpointSummary | undefined,
  target: CheckpointTarget,
  nowMs: number,
  maxAgeMs: number,
): CheckpointAssessment {
  if (checkpoint === undefined) return unusable(['no_checkpoint']);
  const reasons: CheckpointUnusableReason[] = [];

  const ids = checkpoint.members.map((m) => m.memberId);
  const sameMembers = ids.length === group.memberIds.length && new Set(ids).size === ids.length && group.memberIds.every((id) => ids.includes(id));
  if (checkpoint.groupId !== group.groupId || !sameMembers) reasons.push('checkpoint_mismatch');

  // "Nothing happened since": the version must be exactly the group's current one. A version above
  // the group's is impossible for a genuine checkpoint of this group and is treated as stale too.
  const behind = checkpoint.activityVersion !== group.activityVersion || checkpoint.createdAtMs < group.lastActivityAtMs;
  const tooOld = nowMs - checkpoint.createdAtMs > maxAgeMs;
  if (behind || tooOld) reasons.push('stale_checkpoint');

  if (checkpoint.members.length === 0 || checkpoint.members.some((m) => !m.blobPresent || !m.digestVerified)) {
    reasons.push('checkpoint_corrupt');
  }
  if (!target.imageDigests.has(checkpoint.baseImageDigest)) reasons.push('base_image_mismatch');
  if (checkpoint.bridgeVersion !== target.bridgeVersion) reasons.push('bridge_version_mismatch');

  return reasons.length === 0 ? { usable: true, checkpointId: checkpoint.checkpointId } : unusable(reasons, checkpoint.checkpointId);
}
