// Host record transitions: the one place a host's lifecycle is written. Every change goes through
// core's transitionHost, is written with compare-and-set, and is appended to the event log with
// the reason (R-H2..R-H6, R-R1).
import { transitionHost, type HostEvent, type HostLifecycle } from '../core/index.ts';
import type { HostRecord } from './records.ts';
import { Keys, type ControlPlaneContext } from './state.ts';

export interface HostChange {
  readonly before: HostLifecycle;
  readonly after: HostLifecycle;
}

/**
 * Apply `event` to the host if it is still at `expectEpoch` (when given). Returns the change, or
 * undefined when the event does not apply (refused by the transition rules, or a new epoch).
 */
export async function applyHostEvent(ctx: ControlPlaneContext, hostId: string, event: HostEvent, why: string, expectEpoch?: number): Promise<HostChange | undefined> {
  let change: HostChange | undefined;
  await ctx.repos.hosts.mutate(Keys.host(hostId), (current) => {
    change = undefined;
    if (current === undefined) return undefined;
    if (expectEpoch !== undefined && current.lifecycle.epoch !== expectEpoch) return undefined;
    const next = transitionHost(current.lifecycle, event);
    if (!next.ok) return undefined;
    if (JSON.stringify(next.value) === JSON.stringify(current.lifecycle)) return undefined;
    change = { before: current.lifecycle, after: next.value };
    return { ...current, lifecycle: next.value, updatedAtMs: ctx.now() } satisfies HostRecord;
  });
  if (change !== undefined) {
    await ctx.events.record({
      subjectKind: 'host',
      subjectId: hostId,
      type: `host_${event.type}`,
      fromState: change.before.state,
      toState: change.after.state,
      reason: why,
      version: `${change.after.epoch}:${change.before.state}:${change.after.state}:${change.after.goingAway ?? ''}`,
      detail: { epoch: change.after.epoch },
    });
  }
  return change;
}
