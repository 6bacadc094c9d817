// Host-agent process: load config, build logger and metrics, connect NATS and the local Docker
// engine, start the agent; SIGTERM/SIGINT stop it gracefully (finish in-flight commands, drain
// NATS); SIGUSR2 reports a spot/preemption notice (R-H5). Wiring only: behaviour lives in
// src/host-agent.
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import Docker from 'dockerode';
import { DockerRuntime } from '../../src/docker/runtime.ts';
import { HostAgent } from '../../src/host-agent/agent.ts';
import { agentBuildSha } from '../../src/host-agent/build-info.ts';
import { loadHostAgentConfig, natsAuthOf } from '../../src/host-agent/config.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { FleetMetrics } from '../../src/observability/metrics.ts';
import { startOpsServer } from '../../src/observability/http-server.ts';
import { connectNats } from '../../src/store/connection.ts';

async function main(): Promise<void> {
  const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
  // R-H1: the exact build SHA (explicit, baked into the image, or the dev checkout's HEAD); with
  // none the agent refuses to start rather than register as "unknown" (build-info.ts).
  const build = agentBuildSha(process.env, repoRoot);
  const config = loadHostAgentConfig({ ...process.env, SANDBOXFLEET_AGENT_SHA: build.sha });
  const logger = createLogger({ name: 'host-agent', level: config.logLevel });
  logger.info({ agentSha: build.sha, source: build.source }, 'build identity');
  const metrics = new FleetMetrics(undefined, { defaultMetrics: true });
  const nc = await connectNats({ servers: config.natsUrl.split(','), name: `host-agent/${config.hostId}`, logger, waitOnFirstConnect: true, auth: natsAuthOf(config) });
  const runtime = new DockerRuntime(new Docker({ socketPath: config.dockerSocket }));
  const agent = new HostAgent({ config, nc, runtime, logger, metrics });
  // Ready only once registered and running: kubelet and the local fleet wait on /readyz.
  const ops = await startOpsServer({
    host: config.httpHost,
    port: config.httpPort,
    registry: metrics.registry,
    readiness: async () => (nc.isClosed() ? 'NATS connection closed' : agent.state === 'RUNNING' ? undefined : `agent ${agent.state}`),
  });
  logger.info({ ops: ops.url }, 'ops endpoints listening');

  let stopping = false;
  const shutdown = async (signal: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'shutting down');
    await agent.stop();
    await ops.close();
    await nc.drain().catch((err: unknown) => logger.warn({ err }, 'NATS drain failed'));
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
  process.on('SIGUSR2', () => agent.reportReclaimNotice({ source: 'preemption', deadlineUnixMs: 0 }));

  try {
    await agent.start();
  } catch (err) {
    if (stopping) return;
    throw err;
  }
}

main().catch((err: unknown) => {
  console.error('host agent failed:', err);
  process.exit(1);
});
