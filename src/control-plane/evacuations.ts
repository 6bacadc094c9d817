// Marking a group for evacuation (R-G6, R-H5, R-R3): the intent is written first, with CAS, and the
// migration controller advances it step by step (planned: stop → checkpoint → restore elsewhere;
// unplanned: restore from the last checkpoint if usable, LOST with the reason otherwise). Used by
// the controller for hosts going away, and by GroupOps when a host no longer has a group's
// containers (its writable layers are gone, like a lost Docker data dir, for that group only).
import type { RemovalSource } from '../core/index.ts';
import { isTerminal } from './fleet-state.ts';
import type { Evacuation } from './records.ts';
import type { ControlPlaneDeps } from './state.ts';

/** Mark `groupId` (still on `sourceHostId`) for evacuation; true when this call marked it. */
export async function markEvacuation(ctx: Pick<ControlPlaneDeps, 'groups' | 'config' | 'now'>, groupId: string, kind: Evacuation['kind'], source: RemovalSource, sourceHostId: string): Promise<boolean> {
  const now = ctx.now();
  const { after } = await ctx.groups.transact(groupId, (g) => {
    if (g === undefined || isTerminal(g) || g.lifecycle.hostId !== sourceHostId) return undefined;
    if (g.evacuation?.kind === 'unplanned' || g.evacuation?.kind === kind) return undefined;
    const evacuation: Evacuation = {
      kind,
      source,
      sourceHostId,
      startedAtMs: g.evacuation?.startedAtMs ?? now,
      deadlineMs: (g.evacuation?.startedAtMs ?? now) + ctx.config.evacuationDeadlineMs,
      attempts: g.evacuation?.attempts ?? 0,
      triedHostIds: g.evacuation?.triedHostIds ?? [],
    };
    return {
      record: { ...g, evacuation, updatedAtMs: now },
      events: [{ type: 'evacuation_started', reason: source, version: `${sourceHostId}:${kind}`, detail: { kind, sourceHostId } }],
    };
  });
  return after !== undefined;
}
