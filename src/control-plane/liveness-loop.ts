// Host liveness and lease decisions (R-H3, R-H4), leader only, one host at a time (a keyed
// reconcile, reconcileHost): silence is judged by core's assessLiveness from the host's latest
// heartbeat in the read model (heartbeats live in memory: every replica receives them all), and the
// reconcile says when to look again — at the host's next deadline (TTL, TTL + grace, lease margin),
// so a fleet of steady hosts costs one in-memory check per host per TTL and no store reads. The
// stall guard is owned here: a fresh leader, a long gap between ticks (this process stalled) or a
// NATS outage suspends SUSPECT/DEAD decisions until a full TTL of fresh heartbeats had the chance to
// arrive, so a control-plane or NATS stall never mass-evicts. Lease terms are renewed on
// heartbeats (host-registry.ts); this loop only starts the drain.
// The heartbeat-age gauge (R-I3) is computed when Prometheus scrapes, for every registered host
// whatever its state: a DEAD or UNATTESTED host that stays silent keeps ageing (the missing-heartbeat
// alert, R-I4, must see it pass its threshold); a REMOVED host, or one whose record is gone, has none.
import { assessLiveness, createStallGuard, observeNats, observeTick, shouldDrain, type LivenessConfig, type StallGuard } from '../core/index.ts';
import { applyHostEvent } from './hosts.ts';
import type { ReconcileResult } from './keyed-queue.ts';
import type { HostRecord } from './records.ts';
import { Keys, type ControlPlaneDeps } from './state.ts';

export type LivenessDeps = Pick<ControlPlaneDeps, 'config' | 'fleet' | 'hosts' | 'metrics' | 'logger' | 'now'>;

/** Shortest wait before a host is looked at again (deadlines closer than this are rounded up). */
const MIN_REQUEUE_MS = 100;

export class LivenessLoop {
  #guard: StallGuard;
  readonly #cfg: LivenessConfig;

  constructor(private readonly ctx: LivenessDeps) {
    this.#cfg = { ttlMs: ctx.config.heartbeatTtlMs, graceMs: ctx.config.deadGraceMs, stallThresholdMs: ctx.config.stallThresholdMs };
    this.#guard = createStallGuard(ctx.now());
  }

  /** Called when this replica becomes leader: it has observed nothing yet. */
  reset(): void {
    this.#guard = createStallGuard(this.ctx.now());
  }

  natsAvailable(available: boolean): void {
    this.#guard = observeNats(this.#guard, available, this.ctx.now());
  }

  /** The leader's clock tick (no I/O): a long gap between ticks is a stall of this process. */
  observeTick(): void {
    this.#guard = observeTick(this.#guard, this.ctx.now(), this.#cfg);
  }

  /** A tick, then every host reconciled once (tests and the full pass of reconcileOnce). */
  async tick(): Promise<void> {
    this.observeTick();
    for (const key of [...this.ctx.fleet.hostKeys()]) {
      const host = this.ctx.fleet.host(key)?.value;
      if (host !== undefined) await this.reconcileHost(host.hostId);
    }
  }

  /** Heartbeat ages of every registered host, for a scrape (R-I3). */
  heartbeatAges(): { readonly hostId: string; readonly ageSeconds: number }[] {
    const now = this.ctx.now();
    const out: { hostId: string; ageSeconds: number }[] = [];
    for (const { value: h } of this.ctx.fleet.hosts()) {
      if (h.lifecycle.state === 'REMOVED') continue;
      out.push({ hostId: h.hostId, ageSeconds: Math.max(0, (now - this.#lastHeard(h)) / 1000) });
    }
    return out;
  }

  #lastHeard(host: HostRecord): number {
    const hb = this.ctx.fleet.heartbeat(host.hostId);
    return hb !== undefined && hb.epoch === host.lifecycle.epoch ? hb.receivedAtMs : host.registeredAtMs;
  }

  /** Judge one host now; answer when to judge it again. */
  async reconcileHost(hostId: string): Promise<ReconcileResult> {
    const host = this.ctx.fleet.host(Keys.host(hostId))?.value;
    if (host === undefined) return {};
    const now = this.ctx.now();
    const lc = host.lifecycle;
    const last = this.#lastHeard(host);
    // R-H4: drain `drainMarginMs` before the term end. Re-checked inside the CAS: a renewal that
    // landed after this read must win over a drain decided on the old term.
    const margin = this.ctx.config.drainMarginMs;
    if (lc.state === 'READY' && shouldDrain({ epoch: lc.epoch, expiresAtMs: host.leaseExpiresAtMs }, now, margin)) {
      await applyHostEvent(this.ctx.hosts, hostId, { type: 'drain_requested', source: 'lease_ending' }, 'lease term ends within the drain margin', lc.epoch,
        (current) => current.lifecycle.state === 'READY' && shouldDrain({ epoch: lc.epoch, expiresAtMs: current.leaseExpiresAtMs }, now, margin));
      return {};
    }
    if (lc.state !== 'READY' && lc.state !== 'DRAINING' && lc.state !== 'SUSPECT') return {};
    const verdict = assessLiveness(last, now, this.#cfg, this.#guard);
    if (verdict.verdict === 'suspect' || (verdict.verdict === 'dead' && lc.state !== 'SUSPECT')) {
      if (lc.state !== 'SUSPECT') await applyHostEvent(this.ctx.hosts, hostId, { type: 'heartbeat_missed' }, `no heartbeat for ${verdict.silentForMs} ms`, lc.epoch);
      return { requeueAfterMs: this.#until(last + this.#cfg.ttlMs + this.#cfg.graceMs, now) };
    }
    if (verdict.verdict === 'dead') {
      await applyHostEvent(this.ctx.hosts, hostId, { type: 'declared_dead', source: 'heartbeat_lost' }, `no heartbeat for ${verdict.silentForMs} ms`, lc.epoch);
      return {};
    }
    if (verdict.verdict === 'suspended') {
      this.ctx.logger.debug({ hostId, reason: verdict.reason }, 'liveness decisions suspended');
      return { requeueAfterMs: this.ctx.config.reconcileIntervalMs };
    }
    // Alive: the next possible change is the TTL running out, or the lease margin being reached.
    const leaseDue = lc.state === 'READY' && host.leaseExpiresAtMs !== undefined ? host.leaseExpiresAtMs - margin : Infinity;
    return { requeueAfterMs: this.#until(Math.min(last + this.#cfg.ttlMs, leaseDue), now) };
  }

  #until(dueMs: number, now: number): number {
    return Math.max(MIN_REQUEUE_MS, Math.min(dueMs - now + 1, 60_000));
  }
}
