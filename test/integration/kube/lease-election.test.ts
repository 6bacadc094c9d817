// Leader election on a Kubernetes Lease (R-I6) against a REAL kube-apiserver: one leader at a time,
// renewals keep it, a silent leader is replaced only after the lease duration has passed on the
// candidate's own clock, a deposed leader learns it on its next tick, a release hands over at once,
// and candidates racing for a free Lease never both win (the API server's resourceVersion check).
// Last, a whole control plane runs its reconcile loop under the Lease.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CoordinationV1Api } from '@kubernetes/client-node';
import { LeaseElector } from '../../../src/kube/lease-elector.ts';
import { createLogger } from '../../../src/observability/logger.ts';
import { startKubeApiServer, type TestKubeApiServer } from '../../support/kube-apiserver.ts';
import { startFleet, type Fleet } from '../control-plane/fleet-harness.ts';

let kube: TestKubeApiServer;
const logger = createLogger({ name: 'lease-test', level: process.env.CP_TEST_LOG ?? 'silent' });

beforeAll(async () => {
  kube = await startKubeApiServer();
}, 120_000);

afterAll(async () => {
  await kube?.stop();
});

const elector = (name: string, identity: string, now?: () => number) =>
  new LeaseElector({ kubeConfig: kube.kubeConfig(), namespace: 'default', name, identity, leaseDurationSeconds: 2, logger, ...(now ? { now } : {}) });

describe('Kubernetes Lease election', () => {
  it('one leader; renewals keep it; a silent leader is replaced after the duration, not before; the deposed one notices', async () => {
    let clock = 1_000_000;
    const now = () => clock;
    const a = elector('lease-one', 'replica-a', now);
    const b = elector('lease-one', 'replica-b', now);
    expect(await a.tick()).toBe(true);
    expect(await b.tick()).toBe(false);
    for (let i = 0; i < 5; i++) {
      clock += 1_500;
      expect(await a.tick()).toBe(true);
      expect(await b.tick()).toBe(false);
    }
    // a goes silent: b must see the record unchanged for 2 s of its own time.
    clock += 1_900;
    expect(await b.tick()).toBe(false);
    clock += 200;
    expect(await b.tick()).toBe(true);
    expect(b.term).toBeGreaterThan(a.term);
    expect(await a.tick()).toBe(false);
    expect(a.isLeader).toBe(false);
    const lease = await kube.kubeConfig().makeApiClient(CoordinationV1Api).readNamespacedLease({ name: 'lease-one', namespace: 'default' });
    expect(lease.spec).toMatchObject({ holderIdentity: 'replica-b', leaseDurationSeconds: 2, leaseTransitions: 1 });
  });

  it('a released Lease is taken at once', async () => {
    const a = elector('lease-two', 'replica-a');
    const b = elector('lease-two', 'replica-b');
    expect(await a.tick()).toBe(true);
    expect(await b.tick()).toBe(false);
    await a.resign();
    expect(a.isLeader).toBe(false);
    expect(await b.tick()).toBe(true);
  });

  it('candidates racing for a free or expired Lease never both win', async () => {
    for (let round = 0; round < 4; round++) {
      const name = `lease-race-${round}`;
      const candidates = ['c1', 'c2', 'c3'].map((id) => elector(name, id));
      const won = await Promise.all(candidates.map((c) => c.tick()));
      expect(won.filter(Boolean)).toHaveLength(1);
      // The winner goes silent; the others race for the expired Lease.
      const rest = candidates.filter((_, i) => !won[i]);
      await new Promise((r) => setTimeout(r, 50));
      await Promise.all(rest.map((c) => c.tick()));
      await new Promise((r) => setTimeout(r, 2_050));
      const again = await Promise.all(rest.map((c) => c.tick()));
      expect(again.filter(Boolean)).toHaveLength(1);
    }
  }, 60_000);

  it('drives a control plane: only the Lease holder reconciles', async () => {
    const fleet: Fleet = await startFleet(1);
    try {
      const mk = (id: string) => fleet.startPlane({ replicaId: id, elector: elector('cp-leader', id) });
      const [p1, p2] = [await mk('cp-1'), await mk('cp-2')];
      const leaders = await fleet.waitFor('one leader', async () => {
        const l = [p1, p2].filter((p) => p.leader.isLeader);
        return l.length === 1 ? l : undefined;
      }, 20_000);
      expect(leaders).toHaveLength(1);
      const [first] = leaders;
      const other = first === p1 ? p2 : p1;
      await first!.stop();
      await fleet.waitFor('the other takes over', async () => (other.leader.isLeader ? true : undefined), 20_000);
    } finally {
      await fleet.cleanup();
    }
  }, 120_000);
});
