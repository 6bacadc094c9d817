// Host lifecycle (R-H1..R-H6): one state union, one transition function. The control plane stores a
// HostLifecycle per host and moves it only through `transitionHost`, so illegal jumps (e.g. an
// unattested host becoming READY without a new attestation) are refused in one place.
import { PreconditionFailed } from './errors.ts';
import { err, ok, type Result } from './result.ts';
import type { AttestationReason } from './attestation.ts';
import { everyMemberOf } from './exhaustive.ts';

export type HostState =
  /** A registration arrived with a new epoch; attestation not yet evaluated. No placements. */
  | 'REGISTERING'
  /** Attestation refused (R-H2): `refusals` holds why. Never receives a placement or a restore. */
  | 'UNATTESTED'
  /** Attested, heartbeating, lease not near its end: may receive placements and restores. */
  | 'READY'
  /** Going away (R-H4, R-H5): no new placements; its groups are stopped cleanly, checkpointed, moved. */
  | 'DRAINING'
  /** Heartbeats missing for the TTL (R-H3): no new placements; groups are left alone until DEAD. */
  | 'SUSPECT'
  /** Declared dead after the grace, or its Docker data dir was lost: its groups go through R-G6. */
  | 'DEAD'
  /** Taken out of the fleet for this epoch; it must re-register (new epoch) to come back (R-H6). */
  | 'REMOVED';

export const HOST_STATES = everyMemberOf<HostState>()(['REGISTERING', 'UNATTESTED', 'READY', 'DRAINING', 'SUSPECT', 'DEAD', 'REMOVED']);

/** Why a host is going away (R-H5). */
export type RemovalSource =
  | 'operator_drain'
  | 'operator_remove'
  | 'node_deleted'
  | 'node_cordoned'
  | 'disruption_taint'
  | 'spot_preemption'
  /** A reclaim notice from the agent other than spot/preemption (e.g. maintenance; host-notice.ts). */
  | 'reclaim_notice'
  | 'lease_ending'
  | 'heartbeat_lost'
  | 'docker_data_lost';

export const REMOVAL_SOURCES = everyMemberOf<RemovalSource>()([
  'operator_drain', 'operator_remove', 'node_deleted', 'node_cordoned', 'disruption_taint',
  'spot_preemption', 'reclaim_notice', 'lease_ending', 'heartbeat_lost', 'docker_data_lost',
]);

/**
 * Why a report (heartbeat or notice) was fenced, as the FencedNotice the agent gets back says: a
 * newer epoch exists (`stale_epoch`), no such host (`unknown_host`), the host was declared DEAD or
 * REMOVED (`host_dead`, `host_removed`: register again), or it left on purpose and stays out until
 * its agent restarts (`host_retired`).
 */
export type FencedNoticeReason = 'stale_epoch' | 'unknown_host' | 'host_dead' | 'host_removed' | 'host_retired';
export const FENCED_NOTICE_REASONS = everyMemberOf<FencedNoticeReason>()(['stale_epoch', 'unknown_host', 'host_dead', 'host_removed', 'host_retired']);

export interface HostLifecycle {
  readonly state: HostState;
  /** Fencing token (R-H4/R-H6): strictly increases on every (re)registration. */
  readonly epoch: number;
  /** Set while UNATTESTED. */
  readonly refusals?: readonly AttestationReason[];
  /** Set once a drain/removal source is known; survives SUSPECT so recovery resumes the drain. */
  readonly goingAway?: RemovalSource;
}

export type HostEvent =
  /** A (re)registration: the control plane assigns `epoch` (must exceed the current one). */
  | { readonly type: 'registered'; readonly epoch: number }
  | { readonly type: 'attestation_passed' }
  | { readonly type: 'attestation_refused'; readonly reasons: readonly AttestationReason[] }
  /** Liveness verdict `suspect` (see liveness.ts). */
  | { readonly type: 'heartbeat_missed' }
  /** A heartbeat arrived again while SUSPECT. */
  | { readonly type: 'heartbeat_resumed' }
  /** Liveness verdict `dead`, or the agent reported its Docker data dir lost. */
  | { readonly type: 'declared_dead'; readonly source: 'heartbeat_lost' | 'docker_data_lost' }
  | { readonly type: 'drain_requested'; readonly source: RemovalSource }
  /** All groups moved off (or the operator forced removal of an empty/dead host). */
  | { readonly type: 'removed' };

/** A freshly seen host (before its first registration is applied). */
export const UNREGISTERED: HostLifecycle = { state: 'REMOVED', epoch: 0 };

/** The epoch for the next registration of a host whose current epoch is `current` (R-H4). */
export function nextEpoch(current: number | undefined): number {
  return (current ?? 0) + 1;
}

/** True when the host may receive new placements and restores (R-H2). */
export function acceptsPlacements(host: HostLifecycle): boolean {
  return host.state === 'READY';
}

function refuse(host: HostLifecycle, event: HostEvent): Result<HostLifecycle, PreconditionFailed> {
  return err(new PreconditionFailed('invalid_transition', `host event ${event.type} not allowed in ${host.state}`, {
    details: { state: host.state, event: event.type },
  }));
}

/** The only way a host's lifecycle changes. Returns the next lifecycle or refuses the event. */
export function transitionHost(host: HostLifecycle, event: HostEvent): Result<HostLifecycle, PreconditionFailed> {
  switch (event.type) {
    case 'registered':
      // Any state may re-register (agent restart, a removed host coming back), but only forward:
      // an equal or older epoch would let a revoked agent impersonate the current one (R-H6).
      if (event.epoch <= host.epoch) return refuse(host, event);
      return ok({ state: 'REGISTERING', epoch: event.epoch });
    case 'attestation_passed':
      if (host.state !== 'REGISTERING') return refuse(host, event);
      return ok({ state: 'READY', epoch: host.epoch });
    case 'attestation_refused':
      if (host.state !== 'REGISTERING') return refuse(host, event);
      return ok({ state: 'UNATTESTED', epoch: host.epoch, refusals: [...event.reasons] });
    case 'heartbeat_missed':
      if (host.state !== 'READY' && host.state !== 'DRAINING') return refuse(host, event);
      return ok({ ...host, state: 'SUSPECT' });
    case 'heartbeat_resumed':
      if (host.state !== 'SUSPECT') return refuse(host, event);
      // A host that was going away keeps going away after it comes back.
      return ok({ ...host, state: host.goingAway === undefined ? 'READY' : 'DRAINING' });
    case 'declared_dead':
      // DEAD from heartbeats needs SUSPECT first (grace); a lost data dir is immediate (R-H5).
      if (event.source === 'heartbeat_lost' && host.state !== 'SUSPECT') return refuse(host, event);
      if (event.source === 'docker_data_lost' && !['READY', 'DRAINING', 'SUSPECT', 'UNATTESTED'].includes(host.state)) {
        return refuse(host, event);
      }
      return ok({ state: 'DEAD', epoch: host.epoch, goingAway: event.source });
    case 'drain_requested':
      if (host.state === 'READY' || host.state === 'DRAINING') return ok({ ...host, state: 'DRAINING', goingAway: event.source });
      // A suspect host remembers the drain and resumes it if it comes back.
      if (host.state === 'SUSPECT') return ok({ ...host, goingAway: event.source });
      return refuse(host, event);
    case 'removed':
      // Idempotent: reconcile loops may repeat a removal (R-R3).
      if (host.state === 'REMOVED') return ok(host);
      return ok({ state: 'REMOVED', epoch: host.epoch, ...(host.goingAway ? { goingAway: host.goingAway } : {}) });
  }
}
