// What an agent's own "this host is going away" report means (R-H5). The agent sees two such
// facts itself: a reclaim notice of its machine (spot/preemption, scheduled maintenance, ...) and
// the loss of its Docker data directory. They differ in kind, not degree: a notice leaves time to
// stop, checkpoint and move every group (a planned drain), while lost data leaves nothing to stop or
// checkpoint — the groups on it are gone unless a recent checkpoint of a clean stop exists (R-G6),
// so the host is DEAD at once (unplanned). One mapping, used for the notice subject and for the
// notice a heartbeat carries, so the two paths cannot disagree.
import type { HostEvent, RemovalSource } from './host.ts';

/** The notice source an agent reports when its Docker data root vanished or was replaced. */
export const DOCKER_DATA_LOST_NOTICE = 'docker_data_lost';

/** Notice sources that mean the provider takes the machine back (spot reclaim, preemption). */
const SPOT_SOURCES: ReadonlySet<string> = new Set(['spot', 'preemption', 'spot_preemption']);

export interface NoticeDecision {
  readonly event: HostEvent;
  /** The audit reason: the removal source first (machine-readable), then what the agent said. */
  readonly why: string;
}

/** The host event a notice of `source` asks for (the raw source is bounded, it is the agent's word). */
export function hostEventForNotice(source: string): NoticeDecision {
  const said = source.slice(0, 64) || 'unspecified';
  if (source === DOCKER_DATA_LOST_NOTICE) {
    return { event: { type: 'declared_dead', source: 'docker_data_lost' }, why: 'docker_data_lost: agent reported its Docker data dir lost' };
  }
  // Anything else is still a machine going away with some notice: drained, but not called a spot
  // reclaim in the audit log when it was something else (e.g. "maintenance").
  const drain: RemovalSource = SPOT_SOURCES.has(source) ? 'spot_preemption' : 'reclaim_notice';
  return { event: { type: 'drain_requested', source: drain }, why: `${drain}: reclaim notice "${said}"` };
}
