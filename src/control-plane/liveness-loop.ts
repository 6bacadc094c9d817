// Host liveness and lease decisions (R-H3, R-H4), run by the leader each pass. Silence is judged by
// core's assessLiveness with a stall guard owned by this loop: a fresh leader, a long gap between
// passes (this process stalled) or a NATS outage suspends SUSPECT/DEAD decisions until a full TTL of
// fresh heartbeats had the chance to arrive, so a control-plane or NATS stall never mass-evicts.
// Lease terms are renewed by the registry on heartbeats; this loop only starts the drain.
// It also keeps the heartbeat-age gauge (R-I3) true for every registered host, whatever its state:
// a DEAD or UNATTESTED host that stays silent keeps ageing (the missing-heartbeat alert, R-I4, must
// see it pass its threshold); a REMOVED host, or one whose record is gone, loses its series.
import { assessLiveness, createStallGuard, observeNats, observeTick, shouldDrain, type LivenessConfig, type StallGuard } from '../core/index.ts';
import { listHosts } from './fleet.ts';
import { applyHostEvent } from './hosts.ts';
import type { HostRecord } from './records.ts';
import { Keys, type ControlPlaneContext } from './state.ts';

export class LivenessLoop {
  #guard: StallGuard;
  readonly #cfg: LivenessConfig;
  /** Hosts whose heartbeat-age series this loop exports. */
  #reported = new Set<string>();

  constructor(private readonly ctx: ControlPlaneContext) {
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

  async tick(): Promise<void> {
    const now = this.ctx.now();
    this.#guard = observeTick(this.#guard, now, this.#cfg);
    const hosts = (await listHosts(this.ctx)).map((e) => e.value);
    // REMOVED hosts, and hosts whose record is gone, drop their series.
    const registered = new Set(hosts.filter((h) => h.lifecycle.state !== 'REMOVED').map((h) => h.hostId));
    for (const id of this.#reported) if (!registered.has(id)) this.ctx.metrics.forgetHost(id);
    this.#reported = registered;
    for (const host of hosts) if (host.lifecycle.state !== 'REMOVED') await this.#host(host, now);
  }

  async #host(host: HostRecord, now: number): Promise<void> {
    const lc = host.lifecycle;
    const id = host.hostId;
    // Set for every state: a DEAD (or UNATTESTED) host that stays silent keeps ageing.
    const hb = (await this.ctx.repos.heartbeats.get(Keys.host(id)))?.value;
    const last = hb !== undefined && hb.epoch === lc.epoch ? hb.receivedAtMs : host.registeredAtMs;
    this.ctx.metrics.heartbeatAge.set({ host: id }, Math.max(0, (now - last) / 1000));
    // R-H4: drain `drainMarginMs` before the term end. Re-checked inside the CAS: a renewal that
    // landed after this read must win over a drain decided on the old term.
    const margin = this.ctx.config.drainMarginMs;
    if (lc.state === 'READY' && shouldDrain({ epoch: lc.epoch, expiresAtMs: host.leaseExpiresAtMs }, now, margin)) {
      await applyHostEvent(this.ctx, id, { type: 'drain_requested', source: 'lease_ending' }, 'lease term ends within the drain margin', lc.epoch,
        (current) => current.lifecycle.state === 'READY' && shouldDrain({ epoch: lc.epoch, expiresAtMs: current.leaseExpiresAtMs }, now, margin));
      return;
    }
    if (lc.state !== 'READY' && lc.state !== 'DRAINING' && lc.state !== 'SUSPECT') return;
    const verdict = assessLiveness(last, now, this.#cfg, this.#guard);
    if (verdict.verdict === 'suspect' || (verdict.verdict === 'dead' && lc.state !== 'SUSPECT')) {
      if (lc.state !== 'SUSPECT') await applyHostEvent(this.ctx, id, { type: 'heartbeat_missed' }, `no heartbeat for ${verdict.silentForMs} ms`, lc.epoch);
    } else if (verdict.verdict === 'dead') {
      await applyHostEvent(this.ctx, id, { type: 'declared_dead', source: 'heartbeat_lost' }, `no heartbeat for ${verdict.silentForMs} ms`, lc.epoch);
    } else if (verdict.verdict === 'suspended') {
      this.ctx.logger.debug({ hostId: id, reason: verdict.reason }, 'liveness decisions suspended');
    }
  }
}
