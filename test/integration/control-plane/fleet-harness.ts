// Test harness for control-plane integration tests: a real nats-server, real dockerd hosts with
// one sandbox image (same id everywhere), real host agents (in-process, their own NATS
// connections) and real ControlPlane replicas over the same state store. Nothing is mocked; the
// test drives the control plane through its RunnerBackend and operator actions.
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { NatsConnection } from '@nats-io/transport-node';
import { hostPermissions } from '../../../src/core/agent-subjects.ts';
import { natsAuthOf } from '../../../src/host-agent/config.ts';
import type { NatsServerUser } from '../../../src/store/local-nats-server.ts';
import { newNkeyUser } from '../../../src/store/nats-auth.ts';
import { ControlPlaneConfigSchema, type ControlPlaneConfig } from '../../../src/config/control-plane.ts';
import { CONTROL_PLANE_BUCKETS, type ControlPlaneBuckets } from '../../../src/control-plane/buckets.ts';
import { ControlPlane, HEARTBEAT_READ_BATCH_MS } from '../../../src/control-plane/control-plane.ts';
import type { StepHook } from '../../../src/control-plane/migration-controller.ts';
import type { GroupRecord, HostRecord } from '../../../src/control-plane/records.ts';
import { Keys } from '../../../src/control-plane/state.ts';
import { API_SHA } from '../../../src/gen/api-sha.ts';
import { createLogger } from '../../../src/observability/logger.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { StateStore } from '../../../src/store/connection.ts';
import { startAgent, TEST_AGENT_SHA, type InProcessAgent } from '../../support/agent.ts';
import { destroyAll, dockerHostName, startDockerHosts, type DockerHost } from '../../support/docker.ts';
import { writeNativeSession } from '../../support/native-session.ts';
import type { Elector } from '../../../src/control-plane/leader.ts';
import type { CliKind } from '../../../src/core/turn-end-evidence.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';
import { provisionSandboxImage, type SandboxImage, type SandboxImageSpec } from '../../support/sandbox-image.ts';

export const FAST_CONFIG: Partial<ControlPlaneConfig> = {
  heartbeatIntervalMs: 500,
  heartbeatTtlMs: 3_000,
  deadGraceMs: 2_000,
  stallThresholdMs: 5_000,
  reconcileIntervalMs: 250,
  stopGraceMs: 5_000,
  turnWaitMs: 3_000,
  evacuationDeadlineMs: 30_000,
  agentCommandTimeoutMs: 60_000,
  leaderRenewMs: 1_000,
};

export interface Fleet {
  readonly nats: TestNats;
  readonly hosts: DockerHost[];
  readonly image: SandboxImage;
  readonly nc: NatsConnection;
  readonly store: StateStore<ControlPlaneBuckets>;
  readonly chunks: ChunkStore;
  readonly config: ControlPlaneConfig;
  readonly agents: Map<string, InProcessAgent>;
  readonly planes: ControlPlane[];
  /** `heartbeatNc`: the plane's heartbeat connection (default: the fleet's, straight to the server). */
  startPlane(opts?: { replicaId?: string; stepHook?: StepHook; autoReconcile?: boolean; metrics?: FleetMetrics; elector?: Elector; heartbeatNc?: NatsConnection }): Promise<ControlPlane>;
  startAgentOn(hostId: string, index: number, overrides?: Record<string, unknown>): Promise<InProcessAgent>;
  /** startAgentOn, then wait until the control plane has the host READY. */
  startReadyAgentOn(hostId: string, index: number): Promise<InProcessAgent>;
  stopAgent(hostId: string): Promise<void>;
  /** The host dies: its agent stops, its dockerd stops, its data root is deleted. */
  killHost(hostId: string): Promise<void>;
  group(groupId: string): Promise<GroupRecord>;
  host(hostId: string): Promise<HostRecord>;
  waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs?: number): Promise<T>;
  /** Act as the member's CLI: write its native session file for `locator` in the running container. */
  writeSession(hostId: string, containerId: string, locator: string, cli?: CliKind): Promise<string>;
  cleanup(): Promise<void>;
}

export interface FleetOptions {
  /**
   * Per-process NATS credentials (R-I2, R-R5): the server admits only the control plane's nkey
   * (every subject) and one nkey per host limited to hostPermissions(host).
   */
  readonly auth?: boolean;
  /** The sandbox image the hosts run (default: the plain bridge-4 test image). */
  readonly image?: SandboxImageSpec;
  /**
   * The host ids agents will use (default host-a, host-b, …, one per dockerd): with `auth`, each
   * gets its own credentials. An agent's host id need not be its dockerd's name (startAgentOn).
   */
  readonly hostIds?: readonly string[];
}

/** Nkey users and their seed files for a fleet with `auth`. */
async function fleetCredentials(dir: string, hostIds: readonly string[]): Promise<{ users: NatsServerUser[]; controlPlane: string; hosts: Map<string, string> }> {
  const write = async (name: string, seed: string): Promise<string> => {
    const file = join(dir, `${name}.nk`);
    await writeFile(file, `${seed}\n`, { mode: 0o600 });
    return file;
  };
  const cp = newNkeyUser();
  const users: NatsServerUser[] = [{ nkey: cp.publicKey }];
  const hosts = new Map<string, string>();
  for (const hostId of hostIds) {
    const u = newNkeyUser();
    hosts.set(hostId, await write(hostId, u.seed));
    users.push({ nkey: u.publicKey, permissions: hostPermissions(hostId) });
  }
  return { users, controlPlane: await write('control-plane', cp.seed), hosts };
}

export async function startFleet(hostCount: number, configOverrides: Partial<ControlPlaneConfig> = {}, options: FleetOptions = {}): Promise<Fleet> {
  const hostIds = options.hostIds ?? Array.from({ length: hostCount }, (_, i) => dockerHostName(i));
  const credsDir = options.auth ? await mkdtemp(join(tmpdir(), 'sf-creds-')) : undefined;
  const creds = credsDir !== undefined ? await fleetCredentials(credsDir, hostIds) : undefined;
  const [natsResult, hostsResult] = await Promise.allSettled([startTestNats(creds !== undefined ? { users: creds.users } : {}), startDockerHosts(hostCount)]);
  // A set-up that fails half way stops what it started (a leaked nats-server or dockerd outlives the test run).
  const abandon = async (err: unknown): Promise<never> => {
    if (natsResult.status === 'fulfilled') await natsResult.value.cleanup().catch(() => undefined);
    if (hostsResult.status === 'fulfilled') await destroyAll(hostsResult.value).catch(() => undefined);
    if (credsDir !== undefined) await rm(credsDir, { recursive: true, force: true });
    throw err;
  };
  if (natsResult.status === 'rejected') return abandon(natsResult.reason);
  if (hostsResult.status === 'rejected') return abandon(hostsResult.reason);
  const nats = natsResult.value;
  const hosts = hostsResult.value;
  let image: SandboxImage;
  let nc: NatsConnection;
  let heartbeatNc: NatsConnection;
  let store: StateStore<ControlPlaneBuckets>;
  let chunks: ChunkStore;
  try {
    image = await provisionSandboxImage(hosts.map((h) => h.docker), options.image ?? { bridgeVersion: 4 });
    nc = await nats.connect('control-plane', creds !== undefined ? { credsFile: creds.controlPlane } : undefined);
    // As cmd/control-plane wires it: heartbeats on their own connection, read in batches.
    heartbeatNc = await nats.connect('control-plane-heartbeats', creds !== undefined ? { credsFile: creds.controlPlane } : undefined, HEARTBEAT_READ_BATCH_MS);
    store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
    chunks = await ChunkStore.open(nc);
  } catch (err) {
    return abandon(err);
  }
  const config = ControlPlaneConfigSchema.parse({ ...FAST_CONFIG, allowedAgentShas: [TEST_AGENT_SHA], allowedImageDigests: [image.imageId], ...configOverrides });
  const agents = new Map<string, InProcessAgent>();
  const hostIndex = new Map<string, number>();
  const planes: ControlPlane[] = [];
  const fleet: Fleet = {
    nats, hosts, image, nc, store, chunks, config, agents, planes,
    async startPlane(opts = {}) {
      const plane = new ControlPlane({
        config, nc, heartbeatNc: opts.heartbeatNc ?? heartbeatNc, store, chunks, metrics: opts.metrics ?? new FleetMetrics(), logger: createLogger({ name: 'cp-test', level: process.env.CP_TEST_LOG ?? 'silent' }), apiSha: API_SHA,
        replicaId: opts.replicaId ?? `cp-${planes.length + 1}`,
        ...(opts.stepHook ? { stepHook: opts.stepHook } : {}),
        ...(opts.autoReconcile !== undefined ? { autoReconcile: opts.autoReconcile } : {}),
        ...(opts.elector !== undefined ? { elector: opts.elector } : {}),
      });
      await plane.start();
      planes.push(plane);
      return plane;
    },
    async startAgentOn(hostId, index, overrides = {}) {
      const credsFile = creds?.hosts.get(hostId);
      const auth = credsFile !== undefined ? natsAuthOf({ hostId, natsCredsFile: credsFile, natsCaFile: undefined }) : undefined;
      const agentNc = await nats.connect(hostId, auth);
      const agent = await startAgent(agentNc, { hostId, natsUrl: nats.server.url, host: hosts[index]!, imageRef: image.reference, overrides: { heartbeatIntervalMs: 500, ...(credsFile !== undefined ? { natsCredsFile: credsFile } : {}), ...overrides } });
      agents.set(hostId, agent);
      hostIndex.set(hostId, index);
      return agent;
    },
    async startReadyAgentOn(hostId, index) {
      const agent = await fleet.startAgentOn(hostId, index);
      await fleet.waitFor(`${hostId} READY`, async () => ((await fleet.host(hostId)).lifecycle.state === 'READY' ? true : undefined));
      return agent;
    },
    async killHost(hostId) {
      const host = hosts[hostIndex.get(hostId) ?? -1];
      if (host === undefined) throw new Error(`no agent was started on ${hostId}`);
      await fleet.stopAgent(hostId);
      await host.stop();
      await rm(host.dataRoot, { recursive: true, force: true });
    },
    async writeSession(hostId, containerId, locator, cli = 'claude_code') {
      const host = hosts[hostIndex.get(hostId) ?? -1];
      if (host === undefined) throw new Error(`no agent was started on ${hostId}`);
      return writeNativeSession(host.docker, containerId, cli, locator);
    },
    async stopAgent(hostId) {
      await agents.get(hostId)?.stop();
      agents.delete(hostId);
    },
    async group(groupId) {
      const g = await store.shardedRepository('groups', (await import('../../../src/control-plane/records.ts')).GroupRecordSchema).get(Keys.group(groupId));
      if (!g) throw new Error(`no group ${groupId}`);
      return g.value;
    },
    async host(hostId) {
      const h = await store.repository('hosts', (await import('../../../src/control-plane/records.ts')).HostRecordSchema).get(Keys.host(hostId));
      if (!h) throw new Error(`no host ${hostId}`);
      return h.value;
    },
    async waitFor(what, probe, timeoutMs = 60_000) {
      const end = Date.now() + timeoutMs;
      let last: unknown;
      while (Date.now() < end) {
        try {
          const v = await probe();
          if (v !== undefined) return v;
        } catch (err) {
          last = err;
        }
        await new Promise((r) => setTimeout(r, 200));
      }
      throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    },
    async cleanup() {
      await Promise.allSettled(planes.map((p) => p.stop()));
      await Promise.allSettled([...agents.values()].map((a) => a.stop()));
      await nats.cleanup();
      await destroyAll(hosts);
      if (credsDir !== undefined) await rm(credsDir, { recursive: true, force: true });
    },
  };
  return fleet;
}

/**
 * A one-member (claude_code) conversation that ran one turn, which saved `locator`, and was then
 * stopped by its runner: cleanly, with a checkpoint.
 */
export async function stoppedAfterOneTurn(fleet: Fleet, plane: ControlPlane, conversationId: string, locator: string) {
  const key = (): string => `${conversationId}-${randomUUID()}`;
  const { group } = await plane.runner.openGroup({ idempotencyKey: key(), conversationId, members: [{ memberId: 'm1', cli: 'claude_code' }] });
  const groupId = group.groupId;
  const begun = await plane.runner.beginTurn({ idempotencyKey: key(), groupId, memberId: 'm1' });
  await fleet.writeSession(begun.hostId, begun.containerId, locator);
  await plane.runner.completeTurn({ idempotencyKey: key(), groupId, memberId: 'm1', turnId: begun.turnId, observedLocator: locator, evidence: SUCCESS });
  const stopped = await plane.runner.stopGroup({ idempotencyKey: key(), groupId });
  return { groupId, begun, stopped };
}

/** Turn-end evidence of a successful native turn (what the runner SDK reports). */
export const SUCCESS = {
  kind: 'result' as const, nativeTurnEnded: true, succeeded: true, cleanupFinished: true, transportUsable: true, locatorUsable: true, processExited: false, exitConfirmed: false,
};
