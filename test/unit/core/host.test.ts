// Host lifecycle, attestation (R-H2), liveness + stall guard (R-H3), leases and fencing (R-H4, R-H6).
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  REQUIRED_BRIDGE_VERSION, UNREGISTERED, acceptsPlacements, assessLiveness, checkFence, createStallGuard, decisionsSuspended,
  evaluateAttestation, nextEpoch, observeNats, observeTick, parseBridgeVersion, shouldDrain, transitionHost, unwrap,
  type AttestationPolicy, type AttestationReport, type HostEvent, type HostLifecycle, type LivenessConfig,
} from '../../../src/core/index.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const SHA_A = 'a'.repeat(40);
const SHA_API = 'b'.repeat(40);
const DIGEST = `sha256:${'c'.repeat(64)}`;

const policy: AttestationPolicy = {
  allowedAgentShas: new Set([SHA_A]),
  apiSha: SHA_API,
  allowedImageDigests: new Set([DIGEST]),
  allowedStorageDrivers: new Set(['overlay2']),
};
const good: AttestationReport = {
  agentSha: SHA_A, apiSha: SHA_API, dockerVersion: '20.10.24', storageDriver: 'overlay2', imageRef: 'sandbox:1',
  imageDigest: DIGEST, claimedBridgeVersion: '4', helperVersionOutput: 'http-agent-live-bridge=4\n', imageLabelVersion: '4',
};

describe('attestation (R-H2)', () => {
  it('an exact match is READY with the proven bridge version', () => {
    expect(evaluateAttestation(good, policy)).toEqual({ verdict: 'ready', bridgeVersion: 4 });
  });

  it('names every mismatch', () => {
    const v = evaluateAttestation({ ...good, agentSha: 'd'.repeat(40), apiSha: 'e'.repeat(40), imageDigest: `sha256:${'f'.repeat(64)}`, storageDriver: 'vfs' }, policy);
    expect(v).toEqual({ verdict: 'refused', reasons: ['agent_sha_unknown', 'api_sha_mismatch', 'image_digest_not_allowed', 'storage_driver_unsupported'], bridgeVersion: 4 });
  });

  it('bridge 3 proven by helper and label is refused as bridge_version', () => {
    const v = evaluateAttestation({ ...good, claimedBridgeVersion: '3', helperVersionOutput: 'http-agent-live-bridge=3', imageLabelVersion: '3' }, policy);
    expect(v).toEqual({ verdict: 'refused', reasons: ['bridge_version'], bridgeVersion: 3 });
  });

  it('the agent claim alone proves nothing: missing helper or label, or disagreement, is bridge_unproven', () => {
    for (const patch of [
      { helperVersionOutput: undefined },
      { imageLabelVersion: undefined },
      { helperVersionOutput: 'http-agent-live-bridge=3' },
      { imageLabelVersion: '3' },
      { claimedBridgeVersion: '5' },
      { helperVersionOutput: 'garbage' },
    ]) {
      const v = evaluateAttestation({ ...good, ...patch }, policy);
      expect(v.verdict).toBe('refused');
      if (v.verdict === 'refused') expect(v.reasons).toContain('bridge_unproven');
    }
  });

  it('parses bridge versions strictly', () => {
    expect(parseBridgeVersion(' http-agent-live-bridge=4 ')).toBe(4);
    expect(parseBridgeVersion('4')).toBe(4);
    expect(parseBridgeVersion('4.0')).toBeUndefined();
    expect(parseBridgeVersion('other-bridge=4')).toBeUndefined();
    expect(parseBridgeVersion('')).toBeUndefined();
  });

  it('property: READY iff every field matches policy exactly and bridge is proven 4; bridge 3 never READY', () => {
    const pick = <T>(ok: T, bad: T) => fc.constantFrom(ok, bad);
    const version = fc.oneof(fc.constantFrom('4', '3', 'http-agent-live-bridge=4', 'http-agent-live-bridge=3', '', 'x'), fc.constant(undefined));
    fc.assert(fc.property(
      pick(SHA_A, 'd'.repeat(40)), pick(SHA_API, SHA_A), pick(DIGEST, `sha256:${'0'.repeat(64)}`), pick('overlay2', 'devicemapper'),
      version, version, version,
      (agentSha, apiSha, imageDigest, storageDriver, helper, label, claim) => {
        const report: AttestationReport = { ...good, agentSha, apiSha, imageDigest, storageDriver, helperVersionOutput: helper, imageLabelVersion: label, claimedBridgeVersion: claim };
        const v = evaluateAttestation(report, policy);
        const h = parseBridgeVersion(helper);
        const exact = agentSha === SHA_A && apiSha === SHA_API && imageDigest === DIGEST && storageDriver === 'overlay2'
          && h === REQUIRED_BRIDGE_VERSION && parseBridgeVersion(label) === h && (claim === undefined || parseBridgeVersion(claim) === h);
        expect(v.verdict === 'ready').toBe(exact);
        if (h === 3 || parseBridgeVersion(label) === 3) expect(v.verdict).toBe('refused');
        if (v.verdict === 'refused') expect(v.reasons.length).toBeGreaterThan(0);
      },
    ), { numRuns: PROPERTY_RUNS });
  });
});

describe('host lifecycle', () => {
  const apply = (h: HostLifecycle, ...events: HostEvent[]) => events.reduce((s, e) => unwrap(transitionHost(s, e)), h);

  it('registers, attests, drains and is removed; epoch increases on every registration', () => {
    const h = apply(UNREGISTERED, { type: 'registered', epoch: nextEpoch(UNREGISTERED.epoch) }, { type: 'attestation_passed' });
    expect(h).toEqual({ state: 'READY', epoch: 1 });
    expect(acceptsPlacements(h)).toBe(true);
    const d = apply(h, { type: 'drain_requested', source: 'lease_ending' }, { type: 'removed' });
    expect(d).toMatchObject({ state: 'REMOVED', epoch: 1, goingAway: 'lease_ending' });
    expect(apply(d, { type: 'registered', epoch: nextEpoch(d.epoch) })).toEqual({ state: 'REGISTERING', epoch: 2 });
  });

  it('refuses re-registration with an old epoch and illegal jumps', () => {
    const h = apply(UNREGISTERED, { type: 'registered', epoch: 3 });
    expect(transitionHost(h, { type: 'registered', epoch: 3 }).ok).toBe(false);
    expect(transitionHost(h, { type: 'heartbeat_missed' }).ok).toBe(false);
    const r = transitionHost(apply(h, { type: 'attestation_passed' }), { type: 'declared_dead', source: 'heartbeat_lost' });
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.error.reason).toBe('invalid_transition');
  });

  it('an unattested host keeps its reasons and never accepts placements until a new attested registration', () => {
    const u = apply(UNREGISTERED, { type: 'registered', epoch: 1 }, { type: 'attestation_refused', reasons: ['bridge_version'] });
    expect(u).toEqual({ state: 'UNATTESTED', epoch: 1, refusals: ['bridge_version'] });
    expect(acceptsPlacements(u)).toBe(false);
    expect(transitionHost(u, { type: 'attestation_passed' }).ok).toBe(false);
  });

  it('SUSPECT → DEAD via heartbeats; a drain requested while suspect resumes on recovery; data loss is immediate', () => {
    const ready = apply(UNREGISTERED, { type: 'registered', epoch: 1 }, { type: 'attestation_passed' });
    expect(apply(ready, { type: 'heartbeat_missed' }, { type: 'declared_dead', source: 'heartbeat_lost' }).state).toBe('DEAD');
    expect(apply(ready, { type: 'heartbeat_missed' }, { type: 'drain_requested', source: 'node_cordoned' }, { type: 'heartbeat_resumed' }).state).toBe('DRAINING');
    expect(apply(ready, { type: 'heartbeat_missed' }, { type: 'heartbeat_resumed' }).state).toBe('READY');
    expect(apply(ready, { type: 'declared_dead', source: 'docker_data_lost' })).toMatchObject({ state: 'DEAD', goingAway: 'docker_data_lost' });
  });

  it('property: only REGISTERING → attestation_passed reaches READY, and the epoch never decreases', () => {
    const event: fc.Arbitrary<HostEvent> = fc.oneof(
      fc.integer({ min: 0, max: 20 }).map((epoch) => ({ type: 'registered' as const, epoch })),
      fc.constant({ type: 'attestation_passed' as const }),
      fc.constant({ type: 'attestation_refused' as const, reasons: ['bridge_unproven' as const] }),
      fc.constant({ type: 'heartbeat_missed' as const }),
      fc.constant({ type: 'heartbeat_resumed' as const }),
      fc.constantFrom('heartbeat_lost' as const, 'docker_data_lost' as const).map((source) => ({ type: 'declared_dead' as const, source })),
      fc.constant({ type: 'drain_requested' as const, source: 'operator_drain' as const }),
      fc.constant({ type: 'removed' as const }),
    );
    fc.assert(fc.property(fc.array(event, { maxLength: 30 }), (events) => {
      let h = UNREGISTERED;
      let attestedThisEpoch = false;
      for (const e of events) {
        const r = transitionHost(h, e);
        if (!r.ok) continue;
        expect(r.value.epoch).toBeGreaterThanOrEqual(h.epoch);
        if (e.type === 'registered') attestedThisEpoch = false;
        if (e.type === 'attestation_passed') attestedThisEpoch = true;
        if (r.value.state === 'READY') expect(attestedThisEpoch).toBe(true);
        h = r.value;
      }
    }), { numRuns: PROPERTY_RUNS });
  });
});

describe('liveness and the stall guard (R-H3)', () => {
  const cfg: LivenessConfig = { ttlMs: 10_000, graceMs: 20_000, stallThresholdMs: 3_000 };

  it('a fresh observer waits a full TTL before any decision', () => {
    const g = createStallGuard(1_000);
    expect(assessLiveness(0, 5_000, cfg, g)).toEqual({ verdict: 'suspended', reason: 'observer_recovering' });
    let guard = g;
    for (let t = 2_000; t <= 11_000; t += 1_000) guard = observeTick(guard, t, cfg);
    expect(assessLiveness(0, 11_000, cfg, guard)).toEqual({ verdict: 'suspect', silentForMs: 10_000 });
  });

  it('alive → suspect → dead by silence when the observer is healthy', () => {
    let g = createStallGuard(0);
    for (let t = 1_000; t <= 45_000; t += 1_000) {
      g = observeTick(g, t, cfg);
      const v = assessLiveness(12_000, t, cfg, g);
      if (t < 10_000) expect(v.verdict).toBe('suspended');
      else if (t < 22_000) expect(v.verdict).toBe('alive');
      else if (t < 42_000) expect(v.verdict).toBe('suspect');
      else expect(v.verdict).toBe('dead');
    }
  });

  it('an observer stall (long gap between ticks) suspends decisions for a full TTL', () => {
    let g = createStallGuard(0);
    for (let t = 1_000; t <= 30_000; t += 1_000) g = observeTick(g, t, cfg);
    expect(assessLiveness(5_000, 30_000, cfg, g).verdict).toBe('suspect');
    g = observeTick(g, 60_000, cfg); // 30 s without a tick: the observer itself was stalled
    expect(assessLiveness(5_000, 60_000, cfg, g)).toEqual({ verdict: 'suspended', reason: 'observer_recovering' });
    for (let t = 61_000; t < 70_000; t += 1_000) {
      g = observeTick(g, t, cfg);
      expect(assessLiveness(5_000, t, cfg, g).verdict).toBe('suspended');
    }
    g = observeTick(g, 70_000, cfg);
    expect(assessLiveness(5_000, 70_000, cfg, g).verdict).toBe('suspect');
  });

  it('NATS outage suspends decisions, and the full TTL restarts after it comes back', () => {
    let g = createStallGuard(0);
    for (let t = 1_000; t <= 30_000; t += 1_000) g = observeTick(g, t, cfg);
    g = observeNats(g, false, 30_000);
    expect(assessLiveness(0, 30_000, cfg, g)).toEqual({ verdict: 'suspended', reason: 'nats_unavailable' });
    g = observeNats(g, true, 100_000);
    for (let t = 100_000; t <= 109_000; t += 1_000) {
      g = observeTick(g, t, cfg);
      expect(assessLiveness(0, t, cfg, g).verdict).toBe('suspended');
    }
    g = observeTick(g, 110_000, cfg);
    expect(assessLiveness(0, 110_000, cfg, g).verdict).toBe('suspect');
  });

  it('property: no host is ever judged suspect or dead within a TTL after a stall or NATS recovery', () => {
    const step = fc.record({ dt: fc.integer({ min: 1, max: 15_000 }), nats: fc.boolean(), heartbeat: fc.boolean() });
    fc.assert(fc.property(fc.array(step, { minLength: 1, maxLength: 40 }), (steps) => {
      let now = 0;
      let g = createStallGuard(0);
      let lastHb = 0;
      let trustStart = 0;
      for (const s of steps) {
        now += s.dt;
        if (s.dt > cfg.stallThresholdMs) trustStart = now;
        g = observeTick(g, now, cfg);
        const wasAvailable = g.natsAvailable;
        g = observeNats(g, s.nats, now);
        if (s.nats && !wasAvailable) trustStart = now;
        if (s.heartbeat && s.nats) lastHb = now;
        const v = assessLiveness(lastHb, now, cfg, g);
        if (!s.nats) expect(v.verdict).toBe('suspended');
        if (now - trustStart < cfg.ttlMs) expect(['alive', 'suspended']).toContain(v.verdict);
        if (v.verdict === 'dead') expect(now - Math.max(lastHb, trustStart)).toBeGreaterThanOrEqual(cfg.ttlMs + cfg.graceMs);
        expect(decisionsSuspended(g, now, cfg)).toBe(v.verdict === 'suspended');
      }
    }), { numRuns: PROPERTY_RUNS });
  });
});

describe('leases and fencing (R-H4, R-H6)', () => {
  it('drains a margin before the term ends; no term never drains', () => {
    expect(shouldDrain({ epoch: 1, expiresAtMs: 100_000 }, 89_999, 10_000)).toBe(false);
    expect(shouldDrain({ epoch: 1, expiresAtMs: 100_000 }, 90_000, 10_000)).toBe(true);
    expect(shouldDrain({ epoch: 1 }, Number.MAX_SAFE_INTEGER, 10_000)).toBe(false);
  });

  it('refuses stale and unknown epochs and generations with their reasons', () => {
    expect(checkFence({ epoch: 2, generation: 3 }, { epoch: 2, generation: 3 }).ok).toBe(true);
    expect(checkFence({ epoch: 2 }, { epoch: 2 }).ok).toBe(true);
    const reasonOf = (r: ReturnType<typeof checkFence>) => (r.ok ? 'ok' : r.error.reason);
    expect(reasonOf(checkFence({ epoch: 1, generation: 3 }, { epoch: 2, generation: 3 }))).toBe('stale_epoch');
    expect(reasonOf(checkFence({ epoch: 3 }, { epoch: 2 }))).toBe('unknown_epoch');
    expect(reasonOf(checkFence({ epoch: 2, generation: 2 }, { epoch: 2, generation: 3 }))).toBe('stale_generation');
    expect(reasonOf(checkFence({ epoch: 2, generation: 4 }, { epoch: 2, generation: 3 }))).toBe('unknown_generation');
    expect(reasonOf(checkFence({ epoch: 2, generation: 1 }, { epoch: 2 }))).toBe('unknown_generation');
    expect(reasonOf(checkFence({ epoch: 2 }, { epoch: 2, generation: 1 }))).toBe('stale_generation');
  });

  it('property: accepted iff epoch and generation are exactly current; stale ones are always refused', () => {
    const gen = fc.option(fc.integer({ min: 0, max: 5 }), { nil: undefined });
    fc.assert(fc.property(fc.integer({ min: 0, max: 5 }), gen, fc.integer({ min: 0, max: 5 }), gen, (me, mg, ce, cg) => {
      const r = checkFence({ epoch: me, generation: mg }, { epoch: ce, generation: cg });
      expect(r.ok).toBe(me === ce && mg === cg);
      if (me < ce) expect(!r.ok && r.error.reason).toBe('stale_epoch');
      if (me === ce && mg !== undefined && cg !== undefined && mg < cg) expect(!r.ok && r.error.reason).toBe('stale_generation');
      if (!r.ok) expect(r.error.status).toBe('FAILED_PRECONDITION');
    }), { numRuns: PROPERTY_RUNS });
  });
});
