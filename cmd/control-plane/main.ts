// Control-plane process: load config, build logger and metrics, connect the state store
// (launching an embedded nats-server when no NATS URL is configured), start the control plane
// (host registry, leader election, liveness, migration controller, runner backend), serve
// /healthz, /readyz and /metrics, and shut down gracefully on SIGINT/SIGTERM.
import { execFileSync } from 'node:child_process';
import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import { loadControlPlaneConfig } from '../../src/config/control-plane.ts';
import { CONTROL_PLANE_BUCKETS, ControlPlane } from '../../src/control-plane/index.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { FleetMetrics } from '../../src/observability/metrics.ts';
import { startOpsServer } from '../../src/observability/http-server.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { connectNats, StateStore } from '../../src/store/connection.ts';
import { LocalNatsServer } from '../../src/store/local-nats-server.ts';
import { API_SHA } from '../../src/gen/api-sha.ts';

/** This build's git SHA (the default allowed agent SHA): baked in via env, else read from git. */
function buildSha(): string | undefined {
  if (process.env.SANDBOXFLEET_BUILD_SHA) return process.env.SANDBOXFLEET_BUILD_SHA;
  try {
    return execFileSync('git', ['rev-parse', 'HEAD'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return undefined;
  }
}

async function main(): Promise<void> {
  const config = loadControlPlaneConfig();
  const logger = createLogger({ name: 'control-plane', level: config.logLevel });
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
  const nc = await connectNats({ servers: natsUrl, name: `control-plane-${replicaId}`, logger, waitOnFirstConnect: true });
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

  const plane = new ControlPlane({ config, nc, store, chunks, metrics, logger, apiSha: API_SHA, buildSha: buildSha(), replicaId });
  plane.start();
  // gRPC: src/api builds the runner and admin services from `plane.runner` (RunnerBackend) and the
  // operator actions (`plane.drainHost`, `plane.removeHost`) and listens here.

  const ops = await startOpsServer({
    host: config.httpHost,
    port: config.httpPort,
    registry: metrics.registry,
    readiness: async () => (nc.isClosed() ? 'NATS connection closed' : undefined),
  });
  logger.info({ ops: ops.url, nats: natsUrl, embeddedNats: embedded !== undefined, apiSha: API_SHA, replicaId }, 'control plane ready');

  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'shutting down');
    await plane.stop().catch((err: unknown) => logger.warn({ err }, 'control plane stop failed'));
    await ops.close();
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
