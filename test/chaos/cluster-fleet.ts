// The production shape on one machine, for the NATS-cluster integration tests and the chaos runner:
// a real 3-node NATS JetStream cluster (test/support/nats-cluster.ts) holding every bucket and
// stream R3, real dockerd hosts sharing one sandbox image, the real host-agent binary as a child
// process per host (so it can be SIGKILLed and SIGSTOPped), and control-plane replicas in this
// process, each on its OWN NATS connection to the seed list (every member). A replica "crash"
// closes its connection first and only then stops it: nothing it did not already write reaches
// NATS, and its leader lease is not given up (the resign fails on the closed connection), so the
// next leader waits for the lease to expire as after a SIGKILL of a control-plane pod.
// Each replica serves the runner API over gRPC with mTLS on loopback, as a control-plane pod does,
// and the fleet holds a runner SDK client per replica: the chaos workload's turns go through that
// API (R-I1), and a crash shuts the replica's server with its connection.
// Each replica takes its time from its own clock (the ControlPlane's injectable `now`): the real
// clock plus an offset the chaos runner can jump at run time (jumpClock), as NTP stepping the
// clock of the node a control-plane pod runs on would. A host's engine can be wiped (wipeDocker:
// dockerd SIGKILLed, data root deleted) and brought back empty on the same paths (restoreDocker).
import type { NatsConnection } from '@nats-io/transport-node';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiServer } from '../../src/api/runner-server.ts';
import { ControlPlaneConfigSchema, type ControlPlaneConfig } from '../../src/config/control-plane.ts';
import { CONTROL_PLANE_BUCKETS, type ControlPlaneBuckets } from '../../src/control-plane/buckets.ts';
import { ControlPlane } from '../../src/control-plane/control-plane.ts';
import { GroupRecordSchema, HostRecordSchema, type GroupRecord, type HostRecord } from '../../src/control-plane/records.ts';
import { Keys } from '../../src/control-plane/state.ts';
import { API_SHA } from '../../src/gen/api-sha.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { FleetMetrics } from '../../src/observability/metrics.ts';
import { RunnerClient } from '../../src/runner-sdk/index.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { StateStore } from '../../src/store/connection.ts';
import { createTestPki, type TestPki } from '../support/certs.ts';
import { spawnAgent, TEST_AGENT_SHA, type ChildAgent } from '../support/agent.ts';
import { destroyAll, dockerHostName, startDockerHosts, type DockerHost } from '../support/docker.ts';
import { startNatsCluster, type NatsCluster } from '../support/nats-cluster.ts';
import { loadImage, provisionSandboxImage, type SandboxImage } from '../support/sandbox-image.ts';

/** Short timings so faults are noticed and repaired within seconds. */
export const CLUSTER_FAST_CONFIG: Partial<ControlPlaneConfig> = {
  heartbeatIntervalMs: 500,
  heartbeatTtlMs: 3_000,
  deadGraceMs: 2_000,
  stallThresholdMs: 5_000,
  reconcileIntervalMs: 250,
  stopGraceMs: 3_000,
  turnWaitMs: 3_000,
  evacuationDeadlineMs: 60_000,
  agentCommandTimeoutMs: 30_000,
  leaderRenewMs: 1_000,
  storeReplicas: 3,
};

export interface Replica {
  readonly id: string;
  readonly plane: ControlPlane;
  readonly nc: NatsConnection;
  readonly metrics: FleetMetrics;
  /** The replica's runner API (gRPC, mTLS, loopback). */
  readonly api: ApiServer;
  /** A runner's SDK client of that API: no retries of its own (the caller retries, on any replica). */
  readonly runner: RunnerClient;
  /** offsetMs: what this replica's clock reads more than the real one; jumpClock moves it. */
  readonly clock: { offsetMs: number };
  crashed: boolean;
}

export interface ClusterFleet {
  readonly cluster: NatsCluster;
  readonly hosts: readonly DockerHost[];
  readonly hostIds: readonly string[];
  readonly image: SandboxImage;
  readonly config: ControlPlaneConfig;
  /** The test's own view of the store (its own connection, R3 like everything else). */
  readonly store: StateStore<ControlPlaneBuckets>;
  /** Control-plane replicas started and not crashed or stopped. */
  readonly replicas: Replica[];
  readonly agents: Map<string, ChildAgent>;
  startReplica(id: string): Promise<Replica>;
  /** SIGKILL-like: drop the replica's API server and NATS connection, then stop what is left of it. */
  crashReplica(r: Replica): Promise<void>;
  /** The replica that holds the leader lease now (at most one by construction of the lease). */
  leader(): Replica | undefined;
  /** Start the host agent binary for host `i` (after a kill, the same host id and engine). */
  startAgent(i: number): Promise<ChildAgent>;
  killAgent(i: number): Promise<void>;
  /** Host `i`'s disk wiped: dockerd SIGKILLed with its containers, data root and exec root deleted. */
  wipeDocker(i: number): Promise<void>;
  /** A fresh dockerd on host `i`'s paths, with the sandbox image loaded (the node's bootstrap). */
  restoreDocker(i: number): Promise<void>;
  /** Jump replica `r`'s clock by `deltaMs` (either way); every later `now()` of it reads the new time. */
  jumpClock(r: Replica, deltaMs: number): void;
  /** Jump host `i`'s agent's wall clock by `deltaMs` (either way), within 100 ms, and for its restarts too. */
  jumpAgentClock(i: number, deltaMs: number): Promise<void>;
  /** Agent reports the control plane rejected for a stale epoch or generation, over every replica ever started. */
  fencedReports(): Promise<number>;
  /** Member sessions counted LOST (sandboxfleet_lost_sessions_total), by reason, over every replica ever started. */
  lostSessions(): Promise<Map<string, number>>;
  group(groupId: string): Promise<GroupRecord | undefined>;
  host(hostId: string): Promise<HostRecord | undefined>;
  waitReady(hostId: string, timeoutMs?: number): Promise<void>;
  /** Containers labelled with the group on every engine (a stopped engine counts as none). */
  containersOf(groupId: string): Promise<{ host: string; id: string; running: boolean }[]>;
  cleanup(): Promise<void>;
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000, everyMs = 200): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < end) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    await sleep(everyMs);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last !== undefined ? `: ${String(last)}` : ''}`);
}

export async function startClusterFleet(hostCount: number, overrides: Partial<ControlPlaneConfig> = {}): Promise<ClusterFleet> {
  const [clusterR, hostsR, pkiR] = await Promise.allSettled([startNatsCluster(), startDockerHosts(hostCount), createTestPki()]);
  const abandon = async (err: unknown): Promise<never> => {
    if (clusterR.status === 'fulfilled') await clusterR.value.cleanup().catch(() => undefined);
    if (hostsR.status === 'fulfilled') await destroyAll(hostsR.value).catch(() => undefined);
    if (pkiR.status === 'fulfilled') await pkiR.value.cleanup().catch(() => undefined);
    throw err;
  };
  if (clusterR.status === 'rejected') return abandon(clusterR.reason);
  if (hostsR.status === 'rejected') return abandon(hostsR.reason);
  if (pkiR.status === 'rejected') return abandon(pkiR.reason);
  const cluster = clusterR.value;
  const hosts = hostsR.value;
  const pki: TestPki = pkiR.value;
  let image: SandboxImage;
  let store: StateStore<ControlPlaneBuckets>;
  try {
    image = await provisionSandboxImage(hosts.map((h) => h.docker), { bridgeVersion: 4 });
    const nc = await cluster.connect('chaos-observer');
    // R3 from the start: the agents find the checkpoint streams made (they never create them).
    store = await StateStore.open(nc, { replicas: 3, buckets: CONTROL_PLANE_BUCKETS });
    await ChunkStore.open(nc, { replicas: 3 });
  } catch (err) {
    return abandon(err);
  }
  const config = ControlPlaneConfigSchema.parse({ ...CLUSTER_FAST_CONFIG, allowedAgentShas: [TEST_AGENT_SHA], allowedImageDigests: [image.imageId], ...overrides });
  const hostIds = hosts.map((_, i) => dockerHostName(i));
  const replicas: Replica[] = [];
  // Crashed replicas' counters too: a fenced report is counted by whichever replica received it.
  const everyMetrics: FleetMetrics[] = [];
  // Each agent's wall-clock offset (jumpAgentClock), in a file its preload re-reads.
  const clockDir = await mkdtemp(join(tmpdir(), 'sf-chaos-clocks-'));
  const clockFile = (i: number): string => join(clockDir, `agent-${i}`);
  const agentClockMs: number[] = [];
  const agents = new Map<string, ChildAgent>();
  const groups = store.shardedRepository('groups', GroupRecordSchema);
  const hostRepo = store.repository('hosts', HostRecordSchema);

  const fleet: ClusterFleet = {
    cluster, hosts, hostIds, image, config, store, replicas, agents,
    async startReplica(id) {
      // Connections time out requests in 5 s: a request in flight when its server dies fails fast.
      const nc = await cluster.connect(`control-plane-${id}`);
      const rStore = await StateStore.open(nc, { replicas: 3, buckets: CONTROL_PLANE_BUCKETS });
      const chunks = await ChunkStore.open(nc, { replicas: 3 });
      const metrics = new FleetMetrics();
      everyMetrics.push(metrics);
      const clock = { offsetMs: 0 };
      const logger = createLogger({ name: `cp-${id}`, level: process.env.CP_TEST_LOG ?? 'silent' });
      const plane = new ControlPlane({ config, nc, store: rStore, chunks, metrics, logger, apiSha: API_SHA, replicaId: id, now: () => Date.now() + clock.offsetMs });
      await plane.start();
      let api: ApiServer | undefined;
      let runner: RunnerClient;
      try {
        api = await ApiServer.start({ runner: plane.runner, address: '127.0.0.1:0', security: { mode: 'mtls', mtls: { ca: pki.ca, cert: pki.server.cert, key: pki.server.key } }, logger });
        runner = new RunnerClient({ address: api.address, tls: { ca: pki.ca, cert: pki.runner.cert, key: pki.runner.key, serverName: 'localhost' }, retry: { maxRetries: 0 } });
      } catch (err) {
        // Not a replica without its API: nothing of it may stay behind (it would compete for the lease).
        await api?.shutdown(0).catch(() => undefined);
        await nc.close().catch(() => undefined);
        await plane.stop().catch(() => undefined);
        throw err;
      }
      const r: Replica = { id, plane, nc, metrics, api, runner, clock, crashed: false };
      replicas.push(r);
      return r;
    },
    async crashReplica(r) {
      r.crashed = true;
      replicas.splice(replicas.indexOf(r), 1);
      // A dead pod answers nothing: its server goes first, so a call in flight fails UNAVAILABLE (it
      // may or may not have been applied) and never gets an answer made from a closed connection.
      await r.api.shutdown(0).catch(() => undefined);
      await r.nc.close().catch(() => undefined);
      r.runner.close();
      await r.plane.stop().catch(() => undefined);
    },
    leader() {
      return replicas.find((r) => r.plane.leader.isLeader);
    },
    async startAgent(i) {
      const hostId = hostIds[i]!;
      const agent = spawnAgent({ hostId, natsUrl: cluster.urls.join(','), host: hosts[i]!, imageRef: image.reference, overrides: { maxMembers: 1000 }, clockOffsetFile: clockFile(i) });
      agents.set(hostId, agent);
      return agent;
    },
    async killAgent(i) {
      const agent = agents.get(hostIds[i]!);
      if (agent === undefined) return;
      agent.kill('SIGCONT');
      agent.kill('SIGKILL');
      await agent.exited;
      agents.delete(hostIds[i]!);
    },
    async wipeDocker(i) {
      await hosts[i]!.wipe();
    },
    async restoreDocker(i) {
      await hosts[i]!.restart();
      await loadImage(hosts[i]!.docker, image);
    },
    jumpClock(r, deltaMs) {
      r.clock.offsetMs += deltaMs;
    },
    async jumpAgentClock(i, deltaMs) {
      agentClockMs[i] = (agentClockMs[i] ?? 0) + deltaMs;
      await writeFile(clockFile(i), String(agentClockMs[i]));
    },
    async fencedReports() {
      let n = 0;
      for (const m of everyMetrics) for (const v of (await m.fencedReports.get()).values) n += v.value;
      return n;
    },
    async lostSessions() {
      const by = new Map<string, number>();
      for (const m of everyMetrics) {
        for (const v of (await m.lostSessions.get()).values) {
          const reason = String(v.labels.reason ?? '');
          by.set(reason, (by.get(reason) ?? 0) + v.value);
        }
      }
      return by;
    },
    async group(groupId) {
      return (await groups.get(Keys.group(groupId)))?.value;
    },
    async host(hostId) {
      return (await hostRepo.get(Keys.host(hostId)))?.value;
    },
    async waitReady(hostId, timeoutMs = 60_000) {
      await waitFor(`${hostId} READY`, async () => ((await fleet.host(hostId))?.lifecycle.state === 'READY' ? true : undefined), timeoutMs);
    },
    async containersOf(groupId) {
      const out: { host: string; id: string; running: boolean }[] = [];
      for (const [i, h] of hosts.entries()) {
        const list = await h.docker.listContainers({ all: true }).catch(() => []);
        for (const c of list) if (Object.values(c.Labels ?? {}).includes(groupId)) out.push({ host: hostIds[i]!, id: c.Id, running: c.State === 'running' });
      }
      return out;
    },
    async cleanup() {
      await Promise.allSettled(replicas.splice(0).map(async (r) => {
        r.runner.close();
        await r.api.shutdown(0);
        await r.plane.stop();
      }));
      for (const a of agents.values()) {
        a.kill('SIGCONT');
        a.kill('SIGKILL');
      }
      await Promise.allSettled([...agents.values()].map((a) => a.exited));
      await cluster.cleanup();
      await destroyAll(hosts);
      await rm(clockDir, { recursive: true, force: true });
      await pki.cleanup();
    },
  };
  return fleet;
}
