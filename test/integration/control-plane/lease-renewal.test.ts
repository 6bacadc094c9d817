// Lease renewal and lease-end drain (R-H4) with real parts: real nats-server, a real dockerd host
// with a real host agent, a real ControlPlane (leader). Config: renewable term 4 s, drain margin
// 1.5 s, TTL 8 s (longer than the term, so a lapse is seen as a lease end, not as silence).
// 1. Renewable term: the agent's heartbeats keep renewing the term (CAS, with events) well past the
//    first term; when its heartbeats stop, the term lapses into a lease_ending drain, then removal.
// 2. Fixed term (spot/rental end reported at registration — the agent reports none, so a test
//    client registers and heartbeats over NATS like an agent): renewal stops at the fixed end, and
//    the drain starts at fixed end - margin although heartbeats keep arriving.
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentSubjects } from '../../../src/core/agent-subjects.ts';
import { Heartbeat, Registration, RegistrationAck } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import type { HostRecord } from '../../../src/control-plane/records.ts';
import type { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { TEST_AGENT_SHA } from '../../support/agent.ts';
import { startFleet, type Fleet } from './fleet-harness.ts';

const TERM_MS = 4_000;
const MARGIN_MS = 1_500;
let fleet: Fleet;
let plane: ControlPlane;

beforeAll(async () => {
  fleet = await startFleet(1, { leaseTermMs: TERM_MS, drainMarginMs: MARGIN_MS, heartbeatTtlMs: 8_000, deadGraceMs: 4_000, stallThresholdMs: 5_000 });
  plane = await fleet.startPlane();
}, 120_000);

afterAll(async () => {
  await fleet?.cleanup();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function hostEvents(hostId: string) {
  return (await fleet.store.events.read({ subjectKind: 'host', subjectId: hostId, limit: 500 })).events.map((e) => e.event);
}

describe('renewable lease', () => {
  it('is renewed while heartbeats arrive and lapses into a lease_ending drain and removal when they stop', async () => {
    await fleet.startAgentOn('host-a', 0);
    const first = await fleet.waitFor('host-a READY', async () => {
      const h = await fleet.host('host-a');
      return h.lifecycle.state === 'READY' ? h : undefined;
    });
    expect(first.leaseExpiresAtMs).toBeDefined();
    // Two full terms: without renewal the host would have been drained twice over.
    await sleep(2 * TERM_MS);
    const renewed = await fleet.host('host-a');
    expect(renewed.lifecycle.state).toBe('READY');
    expect(renewed.lifecycle.epoch).toBe(first.lifecycle.epoch);
    expect(renewed.leaseExpiresAtMs!).toBeGreaterThan(first.leaseExpiresAtMs! + TERM_MS);
    expect(renewed.leaseExpiresAtMs! - Date.now()).toBeGreaterThan(MARGIN_MS);
    const events = await hostEvents('host-a');
    expect(events.find((e) => e.type === 'host_lease_set')?.reason).toBe('renewable');
    expect(events.filter((e) => e.type === 'host_lease_renewed').length).toBeGreaterThanOrEqual(3);

    // Heartbeats stop: the term is no longer renewed, the drain starts at its end - margin.
    await fleet.stopAgent('host-a');
    const stoppedAt = Date.now();
    // A heartbeat published just before the stop may still renew once: the term read now is a floor.
    const lastEnd = (await fleet.host('host-a')).leaseExpiresAtMs!;
    const draining = await fleet.waitFor('host-a draining for lease end', async () => {
      const h = await fleet.host('host-a');
      return h.lifecycle.goingAway === 'lease_ending' ? h : undefined;
    }, 20_000);
    const drainSeenAt = Date.now();
    // No renewal after the heartbeats stopped: the term ends at most one term after the stop.
    expect(draining.leaseExpiresAtMs!).toBeGreaterThanOrEqual(lastEnd);
    expect(draining.leaseExpiresAtMs!).toBeLessThanOrEqual(stoppedAt + TERM_MS + 1_000);
    expect(drainSeenAt).toBeGreaterThanOrEqual(draining.leaseExpiresAtMs! - MARGIN_MS - 50);
    // Detected before the heartbeat TTL would have called the host SUSPECT.
    expect(drainSeenAt - stoppedAt).toBeLessThan(8_000);
    // It holds nothing: the drain completes by removing the host for this epoch.
    await fleet.waitFor('host-a REMOVED', async () => ((await fleet.host('host-a')).lifecycle.state === 'REMOVED' ? true : undefined), 20_000);
    const drained = (await hostEvents('host-a')).find((e) => e.type === 'host_drain_requested');
    expect(drained?.reason).toBe('lease term ends within the drain margin');
  }, 90_000);
});

/** A host that registers and heartbeats over NATS exactly like an agent, reporting a fixed term end. */
async function simulatedHost(nc: NatsConnection, hostId: string, fixedEndMs: number) {
  const reg = Registration.fromPartial({
    hostId, agentInstanceId: `sim-${hostId}`, requestedLeaseEndUnixMs: fixedEndMs, sentAtUnixMs: Date.now(),
    capacity: { maxMembers: 10 },
    attestation: {
      agentBuildSha: TEST_AGENT_SHA, apiSha: API_SHA, engineVersion: '20.10.24', storageDriver: 'overlay2',
      imageRef: fleet.image.reference, imageDigest: fleet.image.imageId,
      bridge: { claimedVersion: '4', helperOutput: '4', labelVersion: '4' },
    },
  });
  const ack = RegistrationAck.decode((await nc.request(AgentSubjects.register, Registration.encode(reg).finish(), { timeout: 10_000 })).data);
  let sequence = 0;
  const timer = setInterval(() => {
    nc.publish(AgentSubjects.heartbeat(hostId), Heartbeat.encode(Heartbeat.fromPartial({
      hostId, hostEpoch: ack.hostEpoch, sequence: ++sequence, sentAtUnixMs: Date.now(), inventory: { containers: [] }, capacity: { usedMembers: 0, maxMembers: 10 },
    })).finish());
  }, 250);
  return { ack, stop: () => clearInterval(timer), sent: () => sequence };
}

describe('fixed lease term', () => {
  it('is never renewed past the reported end, and the drain starts at the margin while heartbeats continue', async () => {
    const nc = await fleet.nats.connect('sim-host');
    const fixedEnd = Date.now() + 7_000;
    const sim = await simulatedHost(nc, 'host-fixed', fixedEnd);
    try {
      expect(sim.ack.admitted).toBe(true);
      // The first term is the renewable one (earlier than the fixed end).
      expect(sim.ack.leaseExpiresAtUnixMs).toBeLessThan(fixedEnd);
      const seen: HostRecord[] = [];
      // It holds nothing, so DRAINING may turn into REMOVED between two polls: wait for the source.
      const draining = await fleet.waitFor('host-fixed draining', async () => {
        const h = await fleet.host('host-fixed');
        seen.push(h);
        return h.lifecycle.goingAway !== undefined ? h : undefined;
      }, 20_000);
      const drainSeenAt = Date.now();
      expect(draining.lifecycle.goingAway).toBe('lease_ending');
      expect(draining.leaseExpiresAtMs).toBe(fixedEnd);
      for (const h of seen) expect(h.leaseExpiresAtMs!).toBeLessThanOrEqual(fixedEnd);
      // Renewed up to the cap, then the drain at end - margin (within a reconcile pass or two + polling).
      expect(seen.some((h) => h.leaseExpiresAtMs === fixedEnd && h.lifecycle.state === 'READY')).toBe(true);
      expect(drainSeenAt).toBeGreaterThanOrEqual(fixedEnd - MARGIN_MS);
      expect(drainSeenAt).toBeLessThan(fixedEnd - MARGIN_MS + 2_500);
      const drained = (await hostEvents('host-fixed')).find((e) => e.type === 'host_drain_requested');
      expect(drained!.timeMs).toBeGreaterThanOrEqual(fixedEnd - MARGIN_MS);
      expect(drained!.timeMs).toBeLessThan(fixedEnd - MARGIN_MS + 1_500);
      const set = (await hostEvents('host-fixed')).find((e) => e.type === 'host_lease_set');
      expect(set?.reason).toBe('fixed_and_renewable');
      expect(set?.detail).toMatchObject({ fixedEndMs: fixedEnd, renewTermMs: TERM_MS });
      // Heartbeats were still being accepted when the drain started (the lease, not silence, drained it).
      // Heartbeats live in the control plane's read model (memory), not in a bucket.
      const lastBeat = plane.fleet.heartbeat('host-fixed')!;
      expect(lastBeat.receivedAtMs).toBeGreaterThanOrEqual(drained!.timeMs - 1_000);
      expect(sim.sent()).toBeGreaterThan(20);
    } finally {
      sim.stop();
    }
  }, 60_000);
});
