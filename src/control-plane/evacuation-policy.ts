// The controller's per-group decision (R-G2..R-G6, R-H4), pure so it can be model-tested: given a
// group's persisted record and the time, what is the next step of its evacuation? The effectful
// controller (migration-controller.ts) executes exactly what this returns, one step per call.
import type { GroupLifecycle, LossReason, MemberPhase } from '../core/index.ts';
import type { Evacuation } from './records.ts';

export interface EvacuationView {
  readonly lifecycle: GroupLifecycle;
  readonly memberPhases: readonly MemberPhase[];
  readonly evacuation?: Evacuation | undefined;
}

export type EvacuationStep =
  /** The group is terminal: drop any leftover evacuation mark. */
  | { readonly action: 'clear' }
  /** Nothing to do now (waiting for a turn to end, for a PENDING start, ...). */
  | { readonly action: 'wait' }
  /** Planned departure: stop the group cleanly (R-G2). */
  | { readonly action: 'stop' }
  | { readonly action: 'lost'; readonly reason: LossReason; readonly why: string }
  /** STOPPED clean: checkpoint if needed, assess (R-G4), pick a target, write the intent. */
  | { readonly action: 'plan_restore' }
  /** MIGRATING: restore on the target, prove it, switch placement (R-G5). */
  | { readonly action: 'restore' }
  | { readonly action: 'none' };

export function decideEvacuationStep(g: EvacuationView, nowMs: number, turnWaitMs: number): EvacuationStep {
  const lc = g.lifecycle;
  const ev = g.evacuation;
  if (lc.state === 'LOST' || lc.state === 'DESTROYED') return ev !== undefined ? { action: 'clear' } : { action: 'none' };
  if (lc.state === 'MIGRATING') return { action: 'restore' };
  if (ev === undefined) return { action: 'none' };
  switch (lc.state) {
    case 'PENDING':
    case 'RUNNING':
    case 'STOPPING':
      if (ev.kind === 'unplanned') return { action: 'lost', reason: 'host_lost_running', why: `host ${ev.sourceHostId} lost (${ev.source}) while ${lc.state}` };
      if (lc.state === 'PENDING') return nowMs > ev.deadlineMs ? { action: 'lost', reason: 'host_lost_running', why: 'never started before the host went away' } : { action: 'wait' };
      // A turn in flight gets a bounded wait to finish, then the stop goes ahead (R-H4).
      if (lc.state === 'RUNNING' && g.memberPhases.includes('IN_TURN') && nowMs < ev.startedAtMs + turnWaitMs) return { action: 'wait' };
      return { action: 'stop' };
    case 'STOPPED':
      if (!lc.stop?.clean) return { action: 'lost', reason: 'unclean_stop', why: 'last stop was unclean: it cannot be migrated (R-G2)' };
      return { action: 'plan_restore' };
  }
}

/**
 * How long a planned evacuation waits for a turn in flight before stopping anyway: `turnWaitMs`, but
 * under a spot notice at most a third of the notice, so the stop and the checkpoint still fit in it.
 */
export function turnWaitFor(ev: Evacuation | undefined, config: { readonly turnWaitMs: number; readonly spotNoticeMs: number }): number {
  if (ev?.kind === 'planned' && ev.source === 'spot_preemption') return Math.min(config.turnWaitMs, Math.floor(config.spotNoticeMs / 3));
  return config.turnWaitMs;
}

/**
 * The order a noticed host's groups are saved in (R-H5): least recently active first — the longest
 * idle are the likeliest to have no turn in flight and the cheapest to stop — ties by id.
 */
export function spotSaveOrder<T extends { readonly groupId: string; readonly lastActivityAtMs: number }>(groups: readonly T[]): T[] {
  return [...groups].sort((a, b) => a.lastActivityAtMs - b.lastActivityAtMs || (a.groupId < b.groupId ? -1 : a.groupId > b.groupId ? 1 : 0));
}
