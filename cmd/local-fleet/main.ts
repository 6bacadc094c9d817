// `npm start`: the local fleet (R-I8) in one command — an embedded nats-server, three real dockerd
// "hosts" (own data roots; no bridge, no iptables), one sandbox image loaded into all of them (same
// image id), a host agent per host and the control plane, each as its own process, plus a status
// page (http://127.0.0.1:8090/, SANDBOXFLEET_STATUS_PORT) and a terminal table of hosts and groups
// refreshed every few seconds (status.ts). Ctrl-C stops everything.
// Docker hosts and the image come from test/support (the shared implementation of "a local dockerd
// host" and "the sandbox image", as agreed for cmd/local-fleet); they run dockerd with the safe flags.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { devCheckoutSha } from '../../src/config/build-sha.ts';
import { CONTROL_PLANE_BUCKETS } from '../../src/control-plane/buckets.ts';
import { GroupRecordSchema, HeartbeatRecordSchema, HostRecordSchema } from '../../src/control-plane/records.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { connectNats, DEFAULT_EVENT_STREAM, StateStore } from '../../src/store/connection.ts';
import { LocalNatsServer, type NatsServerUser } from '../../src/store/local-nats-server.ts';
import { newNkeyUser } from '../../src/store/nats-auth.ts';
import { hostPermissions } from '../../src/core/agent-subjects.ts';
import { destroyAll, dockerHostName, startDockerHosts, type DockerHost } from '../../test/support/docker.ts';
import { provisionSandboxImage } from '../../test/support/sandbox-image.ts';
import { renderStatusTable, startStatusServer, type StatusSnapshot } from './status.ts';

const HOSTS = Number(process.env.SANDBOXFLEET_LOCAL_HOSTS ?? 3);
/** The control plane's gRPC port (runner + admin services). */
const GRPC_PORT = process.env.SANDBOXFLEET_GRPC_PORT ?? '7443';
// The agents run this checkout, so they report its HEAD and `sandboxctl verify` shows which commit
// serves (R-H7); the placeholder only stands in outside a git checkout.
const LOCAL_AGENT_SHA = process.env.SANDBOXFLEET_AGENT_SHA ?? devCheckoutSha(process.cwd()) ?? '0000000000000000000000000000000000000001';

async function main(): Promise<void> {
  const logger = createLogger({ name: 'local-fleet', level: process.env.LOG_LEVEL ?? 'info' });
  const stateDir = resolve(process.env.SANDBOXFLEET_STATE_DIR ?? '.state');
  const logDir = join(stateDir, 'logs');
  await mkdir(logDir, { recursive: true });
  const children: ChildProcess[] = [];
  let hosts: DockerHost[] = [];

  // Per-process NATS credentials (R-I2, R-R5), new on every start: the control plane may use every
  // subject, each host only its own (core/agent-subjects.ts hostPermissions). The host names are
  // known before the engines start (startDockerHosts names them host-a, host-b, ...).
  const credsDir = join(stateDir, 'nats', 'creds');
  await mkdir(credsDir, { recursive: true, mode: 0o700 });
  const writeSeed = async (name: string, seed: string): Promise<string> => {
    const file = join(credsDir, `${name}.nk`);
    await writeFile(file, `${seed}\n`, { mode: 0o600 });
    return file;
  };
  const controlPlaneUser = newNkeyUser();
  const controlPlaneCreds = await writeSeed('control-plane', controlPlaneUser.seed);
  const hostNames = Array.from({ length: HOSTS }, (_, i) => dockerHostName(i));
  const hostCreds = new Map<string, string>();
  const users: NatsServerUser[] = [{ nkey: controlPlaneUser.publicKey }];
  for (const name of hostNames) {
    const user = newNkeyUser();
    hostCreds.set(name, await writeSeed(name, user.seed));
    users.push({ nkey: user.publicKey, permissions: hostPermissions(name) });
  }
  const nats = await LocalNatsServer.start({ storeDir: join(stateDir, 'nats', 'jetstream'), workDir: join(stateDir, 'nats'), users, logger: logger.child({ component: 'nats-server' }) });
  let stopping = false;
  const shutdown = async (code: number) => {
    if (stopping) return;
    stopping = true;
    console.log('\nstopping the local fleet…');
    for (const c of children) c.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode === null ? new Promise((r) => c.once('exit', r)) : undefined)));
    await destroyAll(hosts).catch((err: unknown) => logger.warn({ err }, 'docker host cleanup failed'));
    await nats.stop();
    process.exit(code);
  };
  process.once('SIGINT', () => void shutdown(0));
  process.once('SIGTERM', () => void shutdown(0));
  // A failure anywhere below stops what was started (engines, processes, NATS) instead of
  // leaving them running behind a dead launcher.
  stopEverything = shutdown;

  console.log(`nats-server      ${nats.url}`);
  console.log(`docker hosts     starting ${HOSTS} dockerd engines (this takes a few seconds)…`);
  hosts = await startDockerHosts(HOSTS);
  const image = await provisionSandboxImage(hosts.map((h) => h.docker), { bridgeVersion: 4 });
  console.log(`sandbox image    ${image.reference} ${image.imageId}`);
  // For local tooling (`npm run demo` acts as the members' CLIs): which engine socket each host has.
  await writeFile(join(stateDir, 'hosts.json'), `${JSON.stringify(Object.fromEntries(hosts.map((h) => [h.name, { dockerSocket: h.socketPath }])), null, 2)}\n`);

  const run = (name: string, script: string, env: NodeJS.ProcessEnv) => {
    const out = createWriteStream(join(logDir, `${name}.log`), { flags: 'a' });
    const child = spawn(process.execPath, ['--import', 'tsx', script], { env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout!.pipe(out);
    child.stderr!.pipe(out);
    child.once('exit', (code, signal) => {
      if (!stopping) console.log(`${name} exited (${code ?? signal}); see ${join(logDir, `${name}.log`)}`);
    });
    children.push(child);
  };
  run('control-plane', 'cmd/control-plane/main.ts', {
    SANDBOXFLEET_NATS_URL: nats.url,
    SANDBOXFLEET_NATS_CREDS: controlPlaneCreds,
    SANDBOXFLEET_STATE_DIR: join(stateDir, 'control-plane'),
    SANDBOXFLEET_HTTP_PORT: process.env.SANDBOXFLEET_HTTP_PORT ?? '9464',
    SANDBOXFLEET_ALLOWED_AGENT_SHAS: LOCAL_AGENT_SHA,
    SANDBOXFLEET_ALLOWED_IMAGE_DIGESTS: image.imageId,
    SANDBOXFLEET_HEARTBEAT_INTERVAL_MS: '1000',
    SANDBOXFLEET_HEARTBEAT_TTL_MS: '5000',
    SANDBOXFLEET_DEAD_GRACE_MS: '5000',
    // Local dev: plaintext gRPC on loopback only (R-R5 allows nothing else without mTLS).
    SANDBOXFLEET_GRPC_HOST: '127.0.0.1',
    SANDBOXFLEET_GRPC_PORT: GRPC_PORT,
    SANDBOXFLEET_GRPC_INSECURE: '1',
    LOG_LEVEL: 'info',
  });
  hosts.forEach((h, i) => run(`agent-${h.name}`, 'cmd/host-agent/main.ts', {
    SANDBOXFLEET_HOST_ID: h.name,
    // Each agent's /metrics listener on its own port (9465, 9466, ...; 0 = any free port).
    SANDBOXFLEET_HTTP_PORT: process.env.SANDBOXFLEET_HTTP_PORT === '0' ? '0' : String(9465 + i),
    SANDBOXFLEET_NATS_URL: nats.url,
    SANDBOXFLEET_NATS_CREDS: hostCreds.get(h.name) ?? '',
    SANDBOXFLEET_DOCKER_SOCKET: h.socketPath,
    SANDBOXFLEET_IMAGE_REF: image.reference,
    SANDBOXFLEET_AGENT_SHA: LOCAL_AGENT_SHA,
    SANDBOXFLEET_HEARTBEAT_INTERVAL_MS: '1000',
    LOG_LEVEL: 'info',
  }));
  console.log(`logs             ${logDir}`);
  console.log(`metrics          http://127.0.0.1:${process.env.SANDBOXFLEET_HTTP_PORT ?? '9464'}/metrics`);
  console.log(`gRPC             127.0.0.1:${GRPC_PORT} (plaintext, loopback only: local dev mode)`);
  console.log(`operate it with  cmd/sandboxctl/sandboxctl.mjs --insecure -s 127.0.0.1:${GRPC_PORT} hosts   (verify, drain HOST, events -f, ...)\n`);

  // Status table, read straight from the state store.
  const nc = await connectNats({ servers: nats.url, name: 'local-fleet-status', waitOnFirstConnect: true, auth: { credsFile: controlPlaneCreds } });
  const store = await StateStore.open(nc, { buckets: CONTROL_PLANE_BUCKETS });
  const hostRepo = store.repository('hosts', HostRecordSchema);
  const hbRepo = store.repository('heartbeats', HeartbeatRecordSchema);
  const groupRepo = store.shardedRepository('groups', GroupRecordSchema);
  const snapshot = async (): Promise<StatusSnapshot> => {
    const [hs, hbs, gs, info] = await Promise.all([hostRepo.list(), hbRepo.list(), groupRepo.list(), store.jsm.streams.info(DEFAULT_EVENT_STREAM.stream)]);
    const last = info.state.last_seq;
    const events = last === 0 ? [] : (await store.events.read({ fromSeq: Math.max(1, last - 19), limit: 20 })).events;
    return { nowMs: Date.now(), hosts: hs.entries.map((e) => e.value), heartbeats: hbs.entries.map((e) => e.value), groups: gs.entries.map((e) => e.value), events };
  };
  const show = async () => console.log(renderStatusTable(await snapshot()));
  const page = await startStatusServer(Number(process.env.SANDBOXFLEET_STATUS_PORT ?? 8090), snapshot);
  console.log(`status page      ${page.url}   (hosts, groups and the latest events, live)\n`);
  const timer = setInterval(() => void show().catch((err: unknown) => logger.warn({ err }, 'status read failed')), Number(process.env.SANDBOXFLEET_STATUS_INTERVAL_MS ?? 5000));
  process.once('beforeExit', () => clearInterval(timer));
}

/** Set once NATS runs: stops every process and engine started so far, then exits. */
let stopEverything: ((code: number) => Promise<void>) | undefined;

main().catch((err: unknown) => {
  console.error(err);
  if (stopEverything !== undefined) void stopEverything(1);
  else process.exit(1);
});
