// Placement (R-H2, R-H3, R-H4): which READY host takes a new group or a restore. Pure: the caller
// passes a snapshot of hosts and their load. Only READY hosts qualify (never DRAINING, SUSPECT,
// DEAD or unattested ones); among them the least loaded wins (spread), ties broken by host id so
// replicas decide alike.
import { acceptsPlacements, type HostLifecycle } from '../core/index.ts';

export interface HostCandidate {
  readonly hostId: string;
  readonly lifecycle: HostLifecycle;
  readonly maxMembers: number;
  /** Members of non-terminal groups placed on (or migrating to) the host. */
  readonly usedMembers: number;
  /**
   * Member containers on the host's engine by its latest heartbeat (0: none yet). The agent counts
   * every one (a LOST group's kept for retention, a moved group's copy not yet deleted) and refuses
   * a create beyond its room, however empty the records make the host look: room is judged by the
   * larger count, the spread by the records (what the fleet placed there).
   */
  readonly reportedMembers?: number;
  readonly imageDigest: string;
  /** Proven live-bridge version (undefined when not proven: never eligible). */
  readonly bridgeVersion?: number | undefined;
}

export interface PlacementNeed {
  readonly members: number;
  /** Hosts that must not be chosen (the source, hosts a restore already failed on). */
  readonly exclude?: ReadonlySet<string>;
  /** Restores need the checkpoint's base image and bridge version on the target (R-G4). */
  readonly imageDigest?: string | undefined;
  readonly bridgeVersion?: number | undefined;
}

export function eligibleHosts(hosts: readonly HostCandidate[], need: PlacementNeed): HostCandidate[] {
  return hosts.filter((h) =>
    acceptsPlacements(h.lifecycle) &&
    h.bridgeVersion !== undefined &&
    !(need.exclude?.has(h.hostId) ?? false) &&
    h.maxMembers - Math.max(h.usedMembers, h.reportedMembers ?? 0) >= need.members &&
    (need.imageDigest === undefined || h.imageDigest === need.imageDigest) &&
    (need.bridgeVersion === undefined || h.bridgeVersion === need.bridgeVersion));
}

/** The host to use, or undefined when none qualifies. */
export function chooseHost(hosts: readonly HostCandidate[], need: PlacementNeed): HostCandidate | undefined {
  const load = (h: HostCandidate) => (h.maxMembers === 0 ? 1 : h.usedMembers / h.maxMembers);
  return eligibleHosts(hosts, need).sort((a, b) => load(a) - load(b) || a.usedMembers - b.usedMembers || (a.hostId < b.hostId ? -1 : a.hostId > b.hostId ? 1 : 0))[0];
}
