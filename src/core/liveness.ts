// Heartbeat liveness with a stall guard (R-H3). A missed heartbeat is only evidence against the host
// if the observer (this control plane, and NATS between it and the agents) was itself working. After
// any observer stall or NATS outage — and after a new leader starts — no SUSPECT/DEAD decision is
// made until a full TTL has passed since recovery, so a control-plane or NATS stall never mass-evicts.

export interface LivenessConfig {
  /** Heartbeats missing this long make a host SUSPECT. */
  readonly ttlMs: number;
  /** A SUSPECT host becomes DEAD after this much more silence. */
  readonly graceMs: number;
  /** A gap between observer ticks longer than this means the observer itself was stalled. */
  readonly stallThresholdMs: number;
}

/** The observer's view of its own health; a value, advanced by `observeTick` / `observeNats`. */
export interface StallGuard {
  /** When the observer last ran its liveness loop. */
  readonly lastTickMs: number;
  /** False while NATS (the heartbeat path) is known unavailable. */
  readonly natsAvailable: boolean;
  /** Start of the current trust window: observer start, or the end of the last stall/outage. */
  readonly recoveredAtMs: number;
}

/** A new observer (process start, new leader) has seen nothing yet: it waits a full TTL. */
export function createStallGuard(nowMs: number): StallGuard {
  return { lastTickMs: nowMs, natsAvailable: true, recoveredAtMs: nowMs };
}

/** Record one run of the liveness loop; a long gap since the previous run counts as a stall. */
export function observeTick(guard: StallGuard, nowMs: number, cfg: LivenessConfig): StallGuard {
  const stalled = nowMs - guard.lastTickMs > cfg.stallThresholdMs;
  return { ...guard, lastTickMs: Math.max(guard.lastTickMs, nowMs), recoveredAtMs: stalled ? nowMs : guard.recoveredAtMs };
}

/** Record NATS availability; the moment it comes back starts a new trust window. */
export function observeNats(guard: StallGuard, available: boolean, nowMs: number): StallGuard {
  if (available === guard.natsAvailable) return guard;
  return available ? { ...guard, natsAvailable: true, recoveredAtMs: nowMs } : { ...guard, natsAvailable: false };
}

/** True while SUSPECT/DEAD decisions must not be made. */
export function decisionsSuspended(guard: StallGuard, nowMs: number, cfg: LivenessConfig): boolean {
  return !guard.natsAvailable || nowMs - guard.recoveredAtMs < cfg.ttlMs || nowMs - guard.lastTickMs > cfg.stallThresholdMs;
}

export type LivenessVerdict =
  /** Heard from within the TTL (counted from the trust window start). */
  | { readonly verdict: 'alive' }
  /** Silent for ≥ TTL: SUSPECT. */
  | { readonly verdict: 'suspect'; readonly silentForMs: number }
  /** Silent for ≥ TTL + grace: DEAD. */
  | { readonly verdict: 'dead'; readonly silentForMs: number }
  /** The observer cannot judge right now (stall or NATS outage): make no change. */
  | { readonly verdict: 'suspended'; readonly reason: 'nats_unavailable' | 'observer_recovering' };

/**
 * Judge one host. `lastHeartbeatMs` is when the last accepted heartbeat arrived (undefined if none
 * since registration: pass the registration time instead when known). Silence is counted from the
 * later of the last heartbeat and the trust window start, so a stall never counts against hosts.
 */
export function assessLiveness(
  lastHeartbeatMs: number | undefined,
  nowMs: number,
  cfg: LivenessConfig,
  guard: StallGuard,
): LivenessVerdict {
  if (!guard.natsAvailable) return { verdict: 'suspended', reason: 'nats_unavailable' };
  if (decisionsSuspended(guard, nowMs, cfg)) return { verdict: 'suspended', reason: 'observer_recovering' };
  const since = Math.max(lastHeartbeatMs ?? guard.recoveredAtMs, guard.recoveredAtMs);
  const silentForMs = nowMs - since;
  if (silentForMs >= cfg.ttlMs + cfg.graceMs) return { verdict: 'dead', silentForMs };
  if (silentForMs >= cfg.ttlMs) return { verdict: 'suspect', silentForMs };
  return { verdict: 'alive' };
}
