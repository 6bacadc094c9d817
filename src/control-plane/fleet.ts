// Snapshots of the fleet for decisions: host candidates with their load, groups by host. Load is
// counted from the group records (the source of truth), not from agent reports, so a placement
// decided a moment ago is already counted.
import { isFleetError } from '../core/index.ts';
import type { HostCandidate } from './placement.ts';
import type { GroupRecord, HostRecord } from './records.ts';
import type { ControlPlaneContext } from './state.ts';
import type { KeyedVersioned } from '../store/kv-repository.ts';

export function isTerminal(g: GroupRecord): boolean {
  return g.lifecycle.state === 'LOST' || g.lifecycle.state === 'DESTROYED';
}

export async function listHosts(ctx: ControlPlaneContext): Promise<KeyedVersioned<HostRecord>[]> {
  const { entries, invalid } = await ctx.repos.hosts.list();
  for (const e of invalid) ctx.logger.error({ err: e }, 'invalid host record skipped');
  return entries;
}

export async function listGroups(ctx: ControlPlaneContext): Promise<KeyedVersioned<GroupRecord>[]> {
  const { entries, invalid } = await ctx.repos.groups.list();
  for (const e of invalid) ctx.logger.error({ err: e }, 'invalid group record skipped');
  return entries;
}

/** Members each host holds or is about to hold (a migration target counts too). */
export function memberLoad(groups: readonly GroupRecord[]): Map<string, number> {
  const load = new Map<string, number>();
  const add = (hostId: string, n: number) => load.set(hostId, (load.get(hostId) ?? 0) + n);
  for (const g of groups) {
    if (isTerminal(g)) continue;
    add(g.lifecycle.hostId, g.members.length);
    if (g.lifecycle.migration) add(g.lifecycle.migration.targetHostId, g.members.length);
  }
  return load;
}

export function candidates(hosts: readonly HostRecord[], groups: readonly GroupRecord[]): HostCandidate[] {
  const load = memberLoad(groups);
  return hosts.map((h) => ({
    hostId: h.hostId,
    lifecycle: h.lifecycle,
    maxMembers: h.maxMembers,
    usedMembers: load.get(h.hostId) ?? 0,
    imageDigest: h.attestation.imageDigest,
    bridgeVersion: h.attestation.bridgeVersion,
  }));
}

/** Log-and-continue for reconcile loops: one failing item must not stop the others. */
export function describeError(err: unknown): Record<string, unknown> {
  if (isFleetError(err)) return { reason: err.reason, status: err.status, message: err.message };
  return { message: err instanceof Error ? err.message : String(err) };
}
