// Marking a group for evacuation (R-G6, R-H5, R-R3): the intent is written first, with CAS, and the
// migration controller advances it step by step (planned: stop → checkpoint → restore elsewhere;
// unplanned: restore from the last checkpoint if usable, LOST with the reason otherwise). Used by
// the controller for hosts going away, and by GroupOps when a host no longer has a group's
// containers (its writable layers are gone, like a lost Docker data dir, for that group only).
//
// When the marked group's next step is a LOST that needs no I/O to decide (a running or unclean
// group, or a clean one without a checkpoint), the caller may pass `lossOf`: the mark and the LOST
// are then one compare-and-set with both events (evacuation_started, group_lost), in that order —
// one write instead of two on a host loss (bench/scale: host DEAD → decisions).
import { markMemberLost, transitionGroup, type LossReason, type RemovalSource } from '../core/index.ts';
import type { Versioned } from '../store/kv-repository.ts';
import { isTerminal } from './fleet-state.ts';
import { lifecycleEvent, type GroupEventRecord } from './group-store.ts';
import type { Evacuation, GroupRecord } from './records.ts';
import type { ControlPlaneDeps } from './state.ts';

/** A LOST a marked group's next step would declare without any I/O (see the controller). */
export interface ImmediateLoss {
  readonly reason: LossReason;
  readonly why: string;
}

/**
 * Where the group must still be for the mark to be written: on `hostId`, and, when the caller's
 * proof is about one placement (a host's listing at that generation), at `generation` — a group
 * that moved since (even back to the same host) is not marked on stale evidence.
 */
export interface EvacuationFrom {
  readonly hostId: string;
  readonly generation?: number;
}

/** Mark `groupId` (still where `from` says) for evacuation; true when this call marked it. */
export async function markEvacuation(ctx: Pick<ControlPlaneDeps, 'groups' | 'config' | 'now'>, groupId: string, kind: Evacuation['kind'], source: RemovalSource, from: EvacuationFrom): Promise<boolean> {
  return (await markEvacuationRecord(ctx, groupId, kind, source, from)) !== undefined;
}

/**
 * markEvacuation returning the record it wrote with its revision (undefined when it wrote nothing),
 * so the caller decides the next step without reading it back. With `lossOf`, a marked record for
 * which it returns a loss is written LOST in the same compare-and-set (as GroupOps.declareLost
 * would write it: members' sessions LOST, evacuation cleared, the reason and detail recorded).
 */
export async function markEvacuationRecord(
  ctx: Pick<ControlPlaneDeps, 'groups' | 'config' | 'now'>,
  groupId: string,
  kind: Evacuation['kind'],
  source: RemovalSource,
  from: EvacuationFrom,
  lossOf?: (marked: GroupRecord) => ImmediateLoss | undefined,
): Promise<Versioned<GroupRecord> | undefined> {
  const now = ctx.now();
  const sourceHostId = from.hostId;
  const { after } = await ctx.groups.transact(groupId, (g) => {
    if (g === undefined || isTerminal(g) || g.lifecycle.hostId !== sourceHostId) return undefined;
    if (from.generation !== undefined && g.lifecycle.generation !== from.generation) return undefined;
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
    const marked: GroupRecord = { ...g, evacuation, updatedAtMs: now };
    const events: GroupEventRecord[] = [{ type: 'evacuation_started', reason: source, version: `${sourceHostId}:${kind}`, detail: { kind, sourceHostId } }];
    const loss = lossOf?.(marked);
    if (loss !== undefined) {
      const lost = lostRecord(marked, loss, now);
      if (lost !== undefined) return { record: lost.record, events: [...events, lost.event] };
    }
    return { record: marked, events };
  });
  return after;
}

/** The LOST write GroupOps.declareLost makes from `g`, or undefined when core refuses the transition. */
function lostRecord(g: GroupRecord, loss: ImmediateLoss, now: number): { record: GroupRecord; event: GroupEventRecord } | undefined {
  const next = transitionGroup(g.lifecycle, { type: 'lost', reason: loss.reason }, now);
  if (!next.ok) return undefined;
  const lostDetail = loss.why.slice(0, 1024);
  const record: GroupRecord = {
    ...g,
    members: g.members.map((m) => ({ ...m, session: markMemberLost(m.session, 'group_lost') })),
    evacuation: undefined,
    lostDetail,
    lifecycle: next.value,
    updatedAtMs: now,
  };
  return { record, event: lifecycleEvent('lost', g, record, loss.why, { detail: lostDetail }) };
}
