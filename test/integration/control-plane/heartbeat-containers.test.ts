// Heartbeats that leave their container entries out (host-agent/inventory-elision.ts), on a real
// nats-server with real control planes (no Docker: the host record is written to its bucket as the
// registry would, and the beats are built by the agent's own InventoryElision and published on the
// host's subject as an agent does). A replica reuses entries it holds under the beat's digest; one
// that does not hold them records no containers (unknown, never "gone") until the next full beat;
// a digest that is not the control plane's own is never trusted.
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ControlPlaneConfigSchema } from '../../../src/config/control-plane.ts';
import { AgentSubjects } from '../../../src/core/agent-subjects.ts';
import { CONTROL_PLANE_BUCKETS } from '../../../src/control-plane/buckets.ts';
import { ControlPlane } from '../../../src/control-plane/control-plane.ts';
import { HostRegistry, policyFrom } from '../../../src/control-plane/host-registry.ts';
import { HostLeasePolicySchema } from '../../../src/control-plane/hosts.ts';
import type { HostRecord } from '../../../src/control-plane/records.ts';
import { Keys, openRepositories } from '../../../src/control-plane/state.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import { ContainerInfo, ContainerState, Heartbeat, Inventory } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { InventoryElision } from '../../../src/host-agent/inventory-elision.ts';
import { silentLogger } from '../../../src/observability/logger.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { StateStore } from '../../../src/store/connection.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;
let nc: NatsConnection;
let agentNc: NatsConnection;
let store: StateStore<typeof CONTROL_PLANE_BUCKETS>;
let chunks: ChunkStore;
const cleanups: (() => Promise<void> | void)[] = [];

beforeAll(async () => {
  nats = await startTestNats();
  nc = await nats.connect('control-plane');
  agentNc = await nats.connect('agent');
  store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
  chunks = await ChunkStore.open(nc);
}, 60_000);

afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  await nats?.cleanup();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, probe: () => T | undefined, timeoutMs = 5_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = probe();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

const HOST = 'hb-elide';

function hostRecord(): HostRecord {
  const now = Date.now();
  return {
    hostId: HOST, lifecycle: { state: 'READY', epoch: 1 },
    attestation: { agentSha: 'a', apiSha: API_SHA, dockerVersion: '28', storageDriver: 'overlay2', imageRef: 'sandbox', imageDigest: 'sha256:00', bridgeVersion: 4, mismatches: [] },
    agentInstanceId: `${HOST}-1`, registeredAtMs: now, maxMembers: 8, updatedAtMs: now,
  };
}

const container = (i: number, running: boolean): ContainerInfo => ContainerInfo.fromPartial({
  containerId: `c${i}`, groupId: `g${i}`, memberId: 'claude', placementGeneration: 1,
  state: running ? ContainerState.RUNNING : ContainerState.EXITED, writableLayerPresent: true, startedAtUnixMs: 1_700_000_000_000 + i,
});

/** A replica: its own control plane (read model) and host registry, subscribed to every heartbeat. */
async function replica(name: string): Promise<{ plane: ControlPlane; metrics: FleetMetrics }> {
  const metrics = new FleetMetrics();
  const plane = new ControlPlane({ config: ControlPlaneConfigSchema.parse({}), nc, store, chunks, metrics, logger: silentLogger(), apiSha: API_SHA, replicaId: name, autoReconcile: false });
  await plane.fleet.start();
  await plane.fleet.sync();
  const registry = new HostRegistry(plane.ctx, policyFrom(plane.ctx, undefined), store.repository('hostLeases', HostLeasePolicySchema));
  registry.start(nc);
  await nc.flush();
  cleanups.push(async () => {
    await registry.stop();
    await plane.fleet.stop();
  });
  return { plane, metrics };
}

async function counts(metrics: FleetMetrics): Promise<Record<string, number>> {
  const values = (await metrics.registry.getSingleMetric('sandboxfleet_heartbeat_containers_total')?.get())?.values ?? [];
  return Object.fromEntries(values.map((v) => [String(v.labels.how), v.value]));
}

describe('heartbeats that leave their containers out', () => {
  it('reuse the entries a replica holds by digest; a replica that missed them records none until the next full beat; a foreign digest is never trusted', async () => {
    await openRepositories(store).hosts.create(Keys.host(HOST), hostRecord());
    const a = await replica('cp-a');
    const elision = new InventoryElision(3);
    let sequence = 0;
    const publish = (beat: Partial<Heartbeat>): number => {
      sequence += 1;
      agentNc.publish(AgentSubjects.heartbeat(HOST), Heartbeat.encode(Heartbeat.fromPartial({ hostId: HOST, hostEpoch: 1, sequence, sentAtUnixMs: Date.now(), capacity: { usedMembers: 2, maxMembers: 8 }, ...beat })).finish());
      return sequence;
    };
    const beat = (containers: ContainerInfo[]): { seq: number; omitted: boolean } => {
      const out = elision.next(1, Inventory.fromPartial({ containers, takenAtUnixMs: Date.now() }));
      return { seq: publish({ inventory: out.inventory, containersDigest: out.containersDigest, containersOmitted: out.containersOmitted }), omitted: out.containersOmitted };
    };
    const recorded = (plane: ControlPlane, seq: number) => until(`beat ${seq}`, () => {
      const hb = plane.fleet.heartbeat(HOST);
      return hb?.sequence === seq ? hb : undefined;
    });
    const listed = (hb: { containers: readonly { containerId: string; running: boolean }[] }) => hb.containers.map((c) => `${c.containerId}:${c.running ? 'running' : 'exited'}`);

    const two = [container(1, true), container(2, false)];
    // 1: full. 2, 3: left out, reused by replica A.
    let b = beat(two);
    expect(b.omitted).toBe(false);
    expect(listed(await recorded(a.plane, b.seq))).toEqual(['c1:running', 'c2:exited']);
    b = beat(two);
    expect(b.omitted).toBe(true);
    expect(listed(await recorded(a.plane, b.seq))).toEqual(['c1:running', 'c2:exited']);

    // Replica B starts now: it never saw the full beat, so the next omitted one is unknown to it
    // (recorded with no containers), while A still reuses its entries.
    const bReplica = await replica('cp-b');
    b = beat(two);
    expect(b.omitted).toBe(true);
    expect(listed(await recorded(a.plane, b.seq))).toEqual(['c1:running', 'c2:exited']);
    expect(listed(await recorded(bReplica.plane, b.seq))).toEqual([]);
    // 4: every third beat carries them again (fullEvery 3): B knows them from then on (A sees the
    // same bytes again: `repeated`).
    b = beat(two);
    expect(b.omitted).toBe(false);
    expect(listed(await recorded(bReplica.plane, b.seq))).toEqual(['c1:running', 'c2:exited']);
    b = beat(two);
    expect(b.omitted).toBe(true);
    expect(listed(await recorded(bReplica.plane, b.seq))).toEqual(['c1:running', 'c2:exited']);

    // A change goes out in full at once, on every replica.
    b = beat([container(1, false), container(2, false)]);
    expect(b.omitted).toBe(false);
    expect(listed(await recorded(a.plane, b.seq))).toEqual(['c1:exited', 'c2:exited']);
    expect(listed(await recorded(bReplica.plane, b.seq))).toEqual(['c1:exited', 'c2:exited']);

    // An omission naming entries the replica does not hold (the previous ones' digest) is unknown,
    // not a return to the old list; entries sent along with the flag are not taken either.
    const old = new InventoryElision().next(1, Inventory.fromPartial({ containers: two }));
    let seq = publish({ inventory: Inventory.fromPartial({}), containersDigest: old.containersDigest, containersOmitted: true });
    expect(listed(await recorded(a.plane, seq))).toEqual([]);
    seq = publish({ inventory: Inventory.fromPartial({ containers: two }), containersDigest: old.containersDigest, containersOmitted: true });
    expect(listed(await recorded(a.plane, seq))).toEqual([]);

    // A full beat whose digest is not the control plane's own is used, but its entries are not
    // remembered: a later omission naming that digest is unknown.
    const three = [container(3, true)];
    seq = publish({ inventory: Inventory.fromPartial({ containers: three }), containersDigest: Buffer.alloc(32, 7), containersOmitted: false });
    expect(listed(await recorded(a.plane, seq))).toEqual(['c3:running']);
    seq = publish({ inventory: Inventory.fromPartial({}), containersDigest: Buffer.alloc(32, 7), containersOmitted: true });
    expect(listed(await recorded(a.plane, seq))).toEqual([]);

    expect(await counts(a.metrics)).toEqual({ decoded: 3, repeated: 1, reused: 3, unknown: 3 });
    expect(await counts(bReplica.metrics)).toEqual({ decoded: 3, reused: 1, unknown: 4 });
  }, 60_000);
});
