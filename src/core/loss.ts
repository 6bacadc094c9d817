// Unplanned host loss (R-G6) and restore retries (R-G5). When a host dies or loses its Docker data
// dir, each of its groups is either restored elsewhere — only if it was STOPPED clean and has a
// recent, recoverable checkpoint — or declared LOST with a reason. The reason is a required field of
// every LOST decision, so "lost silently" cannot be expressed (R-R1).
import { everyMemberOf } from './exhaustive.ts';
import type { CheckpointAssessment, CheckpointUnusableReason } from './checkpoint.ts';
import type { GroupLifecycle } from './group.ts';
import type { MemberLossReason } from './member-session.ts';

/** Why a group (and its members' sessions) is LOST. Used as the `reason` label of the LOST metric. */
export type LossReason =
  /** The host went away while the group was running (or being started/stopped): nothing was saved. */
  | 'host_lost_running'
  /** The group's last stop was unclean, so it may not be migrated (R-G2). */
  | 'unclean_stop'
  | CheckpointUnusableReason
  /** Restores failed on the bounded number of hosts (R-G5). */
  | 'restore_failed'
  /** No READY host with the checkpoint's base image and bridge version could take it. */
  | 'no_eligible_host'
  /** The group's containers vanished on their own host. */
  | 'container_missing'
  /** A member's native session file is not in its writable layer: no checkpoint can restore it (R-G3). */
  | 'session_files_missing'
  /** An operator declared the group lost. */
  | 'operator_declared';

/** Every LossReason, for metrics that must exist at 0 before the first loss (alerting on increase()). */
export const LOSS_REASONS = everyMemberOf<LossReason>()([
  'host_lost_running',
  'unclean_stop',
  'no_checkpoint',
  'checkpoint_mismatch',
  'stale_checkpoint',
  'checkpoint_corrupt',
  'base_image_mismatch',
  'bridge_version_mismatch',
  'restore_failed',
  'no_eligible_host',
  'container_missing',
  'session_files_missing',
  'operator_declared',
]);

/** Every MemberLossReason (member-session.ts): one member LOST at its next begin, not its whole group. */
export const MEMBER_LOSS_REASONS = everyMemberOf<MemberLossReason>()([
  'turn_unconfirmed',
  'container_missing',
  'writable_layer_missing',
  'session_files_missing',
  'locator_missing',
  'group_lost',
]);

/**
 * Every value the `reason` label of the LOST metric can take: a group declared LOST counts each of
 * its members with the group's LossReason; a single member found LOST at its next begin counts
 * with its MemberLossReason (`group_lost` is what a member of a LOST group carries).
 */
export type LostSessionReason = LossReason | MemberLossReason;

/** LOSS_REASONS then MEMBER_LOSS_REASONS, each once: the LOST metric pre-creates exactly these. */
export const LOST_SESSION_REASONS: readonly LostSessionReason[] = [...new Set<LostSessionReason>([...LOSS_REASONS, ...MEMBER_LOSS_REASONS])];

export interface RestoreBudget {
  /** Restores already attempted for this loss. */
  readonly attempts: number;
  /** The bound (R-G5). */
  readonly maxAttempts: number;
}

export type HostLossDecision =
  /** Restore from this checkpoint on another host. */
  | { readonly action: 'restore'; readonly checkpointId: string; readonly attempt: number }
  | { readonly action: 'lost'; readonly reason: LossReason }
  /** Nothing to do: the group is already terminal (LOST or DESTROYED). */
  | { readonly action: 'none' };

/**
 * Decide for one group on a lost host. `assessment` is R-G4's verdict for the group's newest checkpoint
 * against the chosen target (pass `undefined` when there is none, which means `no_checkpoint`).
 */
export function decideOnHostLoss(
  group: Pick<GroupLifecycle, 'state' | 'stop'>,
  assessment: CheckpointAssessment | undefined,
  budget: RestoreBudget,
): HostLossDecision {
  switch (group.state) {
    case 'LOST':
    case 'DESTROYED':
      return { action: 'none' };
    case 'PENDING':
    case 'RUNNING':
    case 'STOPPING':
      return { action: 'lost', reason: 'host_lost_running' };
    case 'STOPPED':
    case 'MIGRATING':
      // MIGRATING could only start from a clean stop with a usable checkpoint; re-judge it anyway.
      if (group.stop === undefined || !group.stop.clean) return { action: 'lost', reason: 'unclean_stop' };
      if (assessment === undefined) return { action: 'lost', reason: 'no_checkpoint' };
      if (!assessment.usable) return { action: 'lost', reason: assessment.reason };
      if (budget.attempts >= budget.maxAttempts) return { action: 'lost', reason: 'restore_failed' };
      return { action: 'restore', checkpointId: assessment.checkpointId, attempt: budget.attempts + 1 };
  }
}

/** After a failed restore attempt (R-G5): try another host while the budget lasts, then LOST. */
export function decideAfterRestoreFailure(budget: RestoreBudget): { readonly action: 'retry'; readonly attempt: number } | { readonly action: 'lost'; readonly reason: 'restore_failed' } {
  return budget.attempts >= budget.maxAttempts ? { action: 'lost', reason: 'restore_failed' } : { action: 'retry', attempt: budget.attempts + 1 };
}
