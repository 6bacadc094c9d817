// Clean-stop decision (R-G2). Only a clean stop may be checkpointed and migrated: every member's
// process must have exited *by itself* after SIGTERM within the grace (so the native CLI flushed its
// session files), with no turn in flight, and the container plus its writable layer must still exist.
// The host agent gathers the evidence; this module judges it, so the rule lives in one place.
import { everyMemberOf } from './exhaustive.ts';

export interface MemberStopEvidence {
  readonly memberId: string;
  /** A turn was in flight when the stop began (R-S8 bookkeeping). */
  readonly turnInFlight: boolean;
  /** When SIGTERM was sent; undefined if it was never sent (e.g. the container was already gone). */
  readonly sigtermAtMs?: number | undefined;
  /** When the process was seen to exit; undefined if it did not exit. */
  readonly exitedAtMs?: number | undefined;
  /** The recorded exit status; undefined if unknown. Any value counts: we need it recorded, not zero. */
  readonly exitCode?: number | undefined;
  /** SIGKILL was needed (by us or by the engine after its own timeout). */
  readonly killed: boolean;
  readonly containerExists: boolean;
  readonly writableLayerExists: boolean;
}

export interface StopEvidence {
  /** The grace between SIGTERM and the kill, as configured for this stop. */
  readonly graceMs: number;
  /** The group's members; each needs evidence. */
  readonly memberIds: readonly string[];
  readonly members: readonly MemberStopEvidence[];
}

export type UncleanReason =
  | 'turn_in_flight'
  | 'member_evidence_missing'
  | 'sigterm_not_sent'
  | 'not_exited'
  | 'killed'
  | 'exit_after_grace'
  | 'exit_status_missing'
  | 'container_missing'
  | 'writable_layer_missing'
  | 'no_members';

export const UNCLEAN_REASONS = everyMemberOf<UncleanReason>()(['turn_in_flight', 'member_evidence_missing', 'sigterm_not_sent', 'not_exited', 'killed', 'exit_after_grace', 'exit_status_missing', 'container_missing', 'writable_layer_missing', 'no_members']);

export interface UncleanFinding {
  readonly memberId: string;
  readonly reason: UncleanReason;
}

export type StopVerdict =
  | { readonly clean: true }
  | { readonly clean: false; readonly findings: readonly UncleanFinding[] };

/** Judge a stop. Lists every finding (all members, all reasons) so the event log shows the full picture. */
export function decideStopCleanliness(evidence: StopEvidence): StopVerdict {
  const findings: UncleanFinding[] = [];
  if (evidence.memberIds.length === 0) findings.push({ memberId: '', reason: 'no_members' });
  const byId = new Map(evidence.members.map((m) => [m.memberId, m]));
  for (const memberId of evidence.memberIds) {
    const m = byId.get(memberId);
    if (m === undefined) {
      findings.push({ memberId, reason: 'member_evidence_missing' });
      continue;
    }
    const add = (reason: UncleanReason) => findings.push({ memberId, reason });
    if (m.turnInFlight) add('turn_in_flight');
    if (m.sigtermAtMs === undefined) add('sigterm_not_sent');
    if (m.exitedAtMs === undefined) add('not_exited');
    if (m.killed) add('killed');
    if (m.sigtermAtMs !== undefined && m.exitedAtMs !== undefined && m.exitedAtMs - m.sigtermAtMs > evidence.graceMs) {
      add('exit_after_grace');
    }
    if (m.exitCode === undefined || !Number.isInteger(m.exitCode)) add('exit_status_missing');
    if (!m.containerExists) add('container_missing');
    if (!m.writableLayerExists) add('writable_layer_missing');
  }
  return findings.length === 0 ? { clean: true } : { clean: false, findings };
}
