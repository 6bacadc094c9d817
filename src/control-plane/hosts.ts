// Host record transitions: the one place a host's lifecycle and lease term are written. Every
// change goes through core's transitionHost (lifecycle) or the lease rules below (term end), is
// written with compare-and-set, and is appended to the event log with the reason (R-H2..R-H6, R-R1).
//
// Leases (R-H4): a host's term end (`HostRecord.leaseExpiresAtMs`) is the earlier of
//   - a FIXED end the agent reported at registration (spot/rental term): never extended, and
//   - a RENEWABLE term `leaseTermMs` (config) counted from the latest accepted heartbeat.
// The lease policy of an epoch (fixed end, renewable term) is decided at registration and kept in
// the sf_host_leases bucket, so any replica handling a later heartbeat renews by the same rule.
import { z } from 'zod';
import { transitionHost, type HostEvent, type HostLifecycle } from '../core/index.ts';
import type { KvRepository, Versioned } from '../store/kv-repository.ts';
import type { EventRecorder, TransitionEvent } from './events.ts';
import type { HostRecord } from './records.ts';
import { Keys, type Clock } from './keys.ts';

export interface HostChange {
  readonly before: HostLifecycle;
  readonly after: HostLifecycle;
}

/** An event about the host being written (subject filled in by the store). */
export type HostEventRecord = Omit<TransitionEvent, 'subjectKind' | 'subjectId'>;

export interface HostWrite {
  readonly record: HostRecord;
  readonly events?: readonly HostEventRecord[];
}

/**
 * The one writer of host records: registration, lifecycle events and lease renewals all go through
 * `transact` (read, decide, compare-and-set, retry), and the change's events are appended after it.
 */
export class HostStore {
  constructor(private readonly deps: { readonly repo: KvRepository<HostRecord>; readonly events: EventRecorder; readonly now: Clock }) {}

  get now(): Clock {
    return this.deps.now;
  }

  /** The stored record, read fresh. */
  get(hostId: string): Promise<Versioned<HostRecord> | undefined> {
    return this.deps.repo.get(Keys.host(hostId));
  }

  /** Read-modify-write; `decide` may run once per attempt and returns undefined to write nothing. */
  async transact(hostId: string, decide: (current: HostRecord | undefined) => HostWrite | undefined): Promise<Versioned<HostRecord> | undefined> {
    let write: HostWrite | undefined;
    const result = await this.deps.repo.mutate(Keys.host(hostId), (current) => {
      write = decide(current);
      return write?.record;
    });
    if (write === undefined || result === undefined) return undefined;
    for (const e of write.events ?? []) await this.deps.events.record({ ...e, subjectKind: 'host', subjectId: hostId });
    return result;
  }
}

/**
 * Apply `event` to the host if it is still at `expectEpoch` (when given) and `guard` (when given)
 * still holds for the record being replaced — both checked inside the CAS, so a decision made on a
 * stale read (e.g. "the lease ends within the margin" while a renewal landed) is not applied.
 * `detail` is added to the event's detail (e.g. the operator's own words for a drain), next to the
 * epoch; `why` stays the short machine-readable reason. Returns the change, or undefined when the
 * event does not apply.
 */
export async function applyHostEvent(
  hosts: HostStore, hostId: string, event: HostEvent, why: string, expectEpoch?: number, guard?: (current: HostRecord) => boolean,
  detail?: Readonly<Record<string, string>>,
): Promise<HostChange | undefined> {
  let change: HostChange | undefined;
  await hosts.transact(hostId, (current) => {
    change = undefined;
    if (current === undefined) return undefined;
    if (expectEpoch !== undefined && current.lifecycle.epoch !== expectEpoch) return undefined;
    if (guard !== undefined && !guard(current)) return undefined;
    const next = transitionHost(current.lifecycle, event);
    if (!next.ok) return undefined;
    if (JSON.stringify(next.value) === JSON.stringify(current.lifecycle)) return undefined;
    change = { before: current.lifecycle, after: next.value };
    return {
      record: { ...current, lifecycle: next.value, updatedAtMs: hosts.now() },
      events: [{
        type: `host_${event.type}`,
        fromState: change.before.state,
        toState: change.after.state,
        reason: why,
        version: `${change.after.epoch}:${change.before.state}:${change.after.state}:${change.after.goingAway ?? ''}`,
        detail: { ...detail, epoch: change.after.epoch },
      }],
    };
  });
  return change;
}

// ---- leases (R-H4) ---------------------------------------------------------------------------

/** Latest a reported fixed term end may lie in the future (a year): bounds a corrupt/hostile value. */
export const MAX_FIXED_TERM_MS = 366 * 24 * 3_600_000;

const ms = z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER);

/** The lease policy of one host epoch, decided at registration (sf_host_leases, keyed like hosts). */
export const HostLeasePolicySchema = z.object({
  hostId: z.string().min(1).max(253),
  epoch: z.number().int().positive(),
  /** Term end reported by the host (spot/rental); the lease is never renewed past it. */
  fixedEndMs: ms.optional(),
  /** Renewable term counted from each accepted heartbeat; 0 = no renewal. */
  renewTermMs: ms,
  decidedAtMs: ms,
});
export type HostLeasePolicy = z.infer<typeof HostLeasePolicySchema>;

/** The policy for a registration at `nowMs`: a reported end in the past still counts (drain now). */
export function leasePolicyFor(hostId: string, epoch: number, requestedEndMs: number, renewTermMs: number, nowMs: number): HostLeasePolicy {
  const fixed = requestedEndMs > 0 ? Math.min(requestedEndMs, nowMs + MAX_FIXED_TERM_MS) : undefined;
  return { hostId, epoch, ...(fixed !== undefined ? { fixedEndMs: fixed } : {}), renewTermMs, decidedAtMs: nowMs };
}

/** Term end granted at `nowMs`: the earlier of the fixed end and now + renewable term; none if neither. */
export function leaseTermEnd(policy: HostLeasePolicy, nowMs: number): number | undefined {
  const renewable = policy.renewTermMs > 0 ? nowMs + policy.renewTermMs : undefined;
  if (policy.fixedEndMs === undefined) return renewable;
  return renewable === undefined ? policy.fixedEndMs : Math.min(renewable, policy.fixedEndMs);
}

/**
 * The new term end if a heartbeat at `nowMs` should renew the lease, else undefined. Renewal is
 * due once less than half the renewable term remains (so a host record is written about twice per
 * term, not on every heartbeat); it only ever extends, and never past the fixed end.
 */
export function renewalFor(policy: HostLeasePolicy, currentEndMs: number | undefined, nowMs: number): number | undefined {
  if (policy.renewTermMs <= 0) return undefined;
  const proposed = leaseTermEnd(policy, nowMs);
  if (proposed === undefined) return undefined;
  if (currentEndMs !== undefined && (proposed <= currentEndMs || currentEndMs - nowMs >= policy.renewTermMs / 2)) return undefined;
  return proposed;
}

/** Persist the policy of a new epoch; an older epoch's policy is replaced, a newer one kept. */
export async function recordLeasePolicy(repo: KvRepository<HostLeasePolicy>, policy: HostLeasePolicy): Promise<void> {
  await repo.mutate(Keys.host(policy.hostId), (current) => (current !== undefined && current.epoch >= policy.epoch ? undefined : policy));
}

/**
 * Renew the lease of `hostId` at `epoch` by CAS if due (see renewalFor). Only a READY host of the
 * same epoch is renewed: a draining host is leaving anyway, and a later epoch has its own policy.
 * Returns the new term end, or undefined when nothing was written.
 */
export async function renewLease(hosts: HostStore, hostId: string, policy: HostLeasePolicy, nowMs: number): Promise<number | undefined> {
  let renewed: number | undefined;
  await hosts.transact(hostId, (current) => {
    renewed = undefined;
    if (current === undefined || current.lifecycle.epoch !== policy.epoch || current.lifecycle.state !== 'READY') return undefined;
    const to = renewalFor(policy, current.leaseExpiresAtMs, nowMs);
    if (to === undefined) return undefined;
    renewed = to;
    return {
      record: { ...current, leaseExpiresAtMs: to, updatedAtMs: nowMs },
      events: [{
        type: 'host_lease_renewed', toState: 'READY', reason: 'heartbeat', version: `${policy.epoch}:${to}`,
        detail: { epoch: policy.epoch, fromTermEndMs: current.leaseExpiresAtMs ?? null, termEndMs: to, fixedEndMs: policy.fixedEndMs ?? null },
      }],
    };
  });
  return renewed;
}
