// Control-plane process: load config, build logger and metrics, connect the state store
// (launching an embedded nats-server when no NATS URL is configured), start the control plane
// (host registry, leader election, liveness, migration controller, runner backend), serve the gRPC
// API (runner + admin services, R-I1; mTLS or loopback-only plaintext, R-R5), /healthz, /readyz and
// /metrics, and shut down gracefully on SIGINT/SIGTERM: stop accepting gRPC and let calls in flight
// finish, stop the loops and resign leadership, then drain NATS and stop the embedded nats-server.
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createAdminHandlers } from '../../src/api/admin-handlers.ts';
import { roleCasFrom } from '../../src/api/peer-identity.ts';
import { ApiServer, type TransportSecurity } from '../../src/api/runner-server.ts';
import { BUILD_SHA_ENV, resolveBuildSha } from '../../src/config/build-sha.ts';
import { grpcSecurityProblem, loadControlPlaneConfig, type ControlPlaneConfig } from '../../src/config/control-plane.ts';
import { LeaseElector } from '../../src/kube/lease-elector.ts';
import { NodeWatcher, loadKubeConfig } from '../../src/kube/node-watcher.ts';
import { CONTROL_PLANE_BUCKETS, ControlPlane, HEARTBEAT_READ_BATCH_MS } from '../../src/control-plane/index.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { FleetMetrics } from '../../src/observability/metrics.ts';
import { startOpsServer } from '../../src/observability/http-server.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { connectNats, StateStore } from '../../src/store/connection.ts';
import { LocalNatsServer } from '../../src/store/local-nats-server.ts';
import { API_SHA } from '../../src/gen/api-sha.ts';

/** The repository root (a dev checkout's git HEAD is the build SHA when none is baked in). */
const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/**
 * The gRPC transport from config (already validated by grpcSecurityProblem): mTLS with the server
 * certificate and the client CA bundle; with distinct runner and admin CAs, the signing CA decides
 * the caller's role (the Helm chart's contract), else the certificate's SAN/OU role does.
 */
function transportSecurity(config: ControlPlaneConfig): TransportSecurity {
  if (config.grpcInsecure) return { mode: 'insecure-local-dev' };
  const read = (path: string | undefined): Buffer | undefined => (path === undefined ? undefined : readFileSync(path));
  const runnerCa = read(config.tlsRunnerCaFile);
  const adminCa = read(config.tlsAdminCaFile);
  const cas = [runnerCa, adminCa].filter((b): b is Buffer => b !== undefined);
  const roleCas = runnerCa !== undefined && adminCa !== undefined ? roleCasFrom(runnerCa, adminCa) : undefined;
  return {
    mode: 'mtls',
    mtls: {
      ca: Buffer.concat(roleCas === undefined ? cas.slice(0, 1) : cas.flatMap((c) => [c, Buffer.from('\n')])),
      cert: readFileSync(config.tlsCertFile!),
      key: readFileSync(config.tlsKeyFile!),
      roleCas,
    },
  };
}

async function main(): Promise<void> {
  const config = loadControlPlaneConfig();
  const insecure = grpcSecurityProblem(config);
  if (insecure !== undefined) throw new Error(`invalid control-plane configuration: ${insecure}`);
  // This build's exact SHA (R-H7; the default allowed agent SHA): baked into release images, else
  // the dev checkout's HEAD; with neither, start-up is refused (src/config/build-sha.ts).
  const build = resolveBuildSha(process.env, [BUILD_SHA_ENV], REPO_ROOT);
  const logger = createLogger({ name: 'control-plane', level: config.logLevel });
  logger.info({ buildSha: build.sha, source: build.source, apiSha: API_SHA }, 'build identity');
  // Read the TLS material before anything starts: a missing file fails start-up, not the first call.
  const security = transportSecurity(config);
  const metrics = new FleetMetrics(undefined, { defaultMetrics: true });
  const stateDir = resolve(config.stateDir);
  const replicaId = config.replicaId ?? `${hostname().replace(/[^A-Za-z0-9._-]/g, '-').slice(0, 40)}-${process.pid}`;

  let embedded: LocalNatsServer | undefined;
  let natsUrl = config.natsUrl;
  if (natsUrl === '') {
    // Dev / local fleet: own a nats-server whose data survives restarts under the state dir.
    embedded = await LocalNatsServer.start({
      storeDir: join(stateDir, 'nats', 'jetstream'),
      workDir: join(stateDir, 'nats'),
      logger: logger.child({ component: 'nats-server' }),
    });
    natsUrl = embedded.url;
  }
  const natsAuth = { credsFile: config.natsCredsFile, caFile: config.natsCaFile };
  const nc = await connectNats({ servers: natsUrl, name: `control-plane-${replicaId}`, logger, waitOnFirstConnect: true, auth: natsAuth });
  // Heartbeats on their own connection, read every HEARTBEAT_READ_BATCH_MS (ControlPlaneOptions.heartbeatNc).
  const heartbeatNc = await connectNats({ servers: natsUrl, name: `control-plane-${replicaId}-heartbeats`, logger, waitOnFirstConnect: true, auth: natsAuth, readBatchMs: HEARTBEAT_READ_BATCH_MS });
  const store = await StateStore.open(nc, { replicas: config.storeReplicas as 1 | 3 | 5, buckets: CONTROL_PLANE_BUCKETS, logger });
  const chunks = await ChunkStore.open(nc, { replicas: config.storeReplicas });
  await store.events.append({
    id: `control-plane-start-${process.pid}-${Date.now()}`,
    timeMs: Date.now(),
    actor: `control-plane/${replicaId}`,
    subjectKind: 'control_plane',
    subjectId: 'local',
    type: 'started',
    detail: { apiSha: API_SHA, pid: String(process.pid) },
  });

  // R-I6: in-cluster, the leader holds a Kubernetes Lease; elsewhere the NATS KV lease.
  const elector = config.leaderElection === 'kubernetes-lease'
    ? new LeaseElector({ kubeConfig: loadKubeConfig(config.kubernetesNodes.startsWith('/') ? { kubeconfig: config.kubernetesNodes } : 'in-cluster'), namespace: config.leaseNamespace, name: config.leaseName, identity: replicaId, leaseDurationSeconds: config.leaseDurationSeconds, logger: logger.child({ component: 'leader' }) })
    : undefined;
  const plane = new ControlPlane({ config, nc, heartbeatNc, store, chunks, metrics, logger, apiSha: API_SHA, buildSha: build.sha, replicaId, ...(elector !== undefined ? { elector } : {}) });
  await plane.start();
  // R-H5/R-I6: Nodes that are going away drain their hosts (the leader acts; see src/kube).
  const nodes = config.kubernetesNodes === 'off' ? undefined : new NodeWatcher({
    kubeConfig: loadKubeConfig(config.kubernetesNodes === 'in-cluster' ? 'in-cluster' : { kubeconfig: config.kubernetesNodes }),
    drain: (hostId, source) => plane.drainHost(hostId, source),
    isLeader: () => plane.leader.isLeader,
    logger: logger.child({ component: 'kube-nodes' }),
  });
  await nodes?.start();
  const grpcHost = config.grpcHost.includes(':') ? `[${config.grpcHost}]` : config.grpcHost;
  const api = await ApiServer.start({
    runner: plane.runner,
    exec: plane.exec,
    admin: createAdminHandlers(plane),
    address: `${grpcHost}:${config.grpcPort}`,
    security,
    logger: logger.child({ component: 'api' }),
    registry: metrics.registry,
  });

  const ops = await startOpsServer({
    host: config.httpHost,
    port: config.httpPort,
    registry: metrics.registry,
    readiness: async () => (nc.isClosed() || heartbeatNc.isClosed() ? 'NATS connection closed' : undefined),
  });
  logger.info({
    ops: ops.url, grpc: api.address, grpcSecurity: security.mode, roleByCa: security.mode === 'mtls' && security.mtls.roleCas !== undefined,
    nats: natsUrl, embeddedNats: embedded !== undefined, apiSha: API_SHA, replicaId,
  }, 'control plane ready');
  if (security.mode === 'insecure-local-dev') logger.warn({ grpc: api.address }, 'gRPC is plaintext without client authentication (loopback local dev only, R-R5)');

  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'shutting down');
    // 1. Stop accepting gRPC; calls in flight get a grace period to finish.
    await api.shutdown(10_000).catch((err: unknown) => logger.warn({ err }, 'gRPC shutdown failed'));
    await nodes?.stop().catch((err: unknown) => logger.warn({ err }, 'Node watch stop failed'));
    // 2. Stop the loops and resign leadership, so another replica takes over at once.
    await plane.stop().catch((err: unknown) => logger.warn({ err }, 'control plane stop failed'));
    await ops.close();
    await heartbeatNc.drain().catch((err: unknown) => logger.warn({ err }, 'NATS drain failed (heartbeats)'));
    await nc.drain().catch((err: unknown) => logger.warn({ err }, 'NATS drain failed'));
    await embedded?.stop();
    logger.info('stopped');
    process.exit(0);
  };
  process.once('SIGINT', () => void shutdown('SIGINT'));
  process.once('SIGTERM', () => void shutdown('SIGTERM'));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
