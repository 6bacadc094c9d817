// Runs a real single-node `nats-server -js` as a child process on 127.0.0.1. The control plane
// uses it when no NATS URL is configured (`npm start`, the local fleet of R-I8); tests use it
// through test/support/nats.ts. Restartable on the same port and store dir, so a restart keeps
// every KV revision, event and object.
//
// Durability (fsync) decision: by default JetStream fsyncs file stores only every 2 minutes
// (`sync_interval`), and the Jepsen analysis of NATS 2.12 (2025) showed acknowledged writes lost
// on power loss / OS crash under that default. Our KV holds placements, epochs and locators that
// must never silently roll back (R-R1, R-R2), so the default here is `sync_interval: always`:
// every acknowledged write has been fsynced before the ack. The cost is an fsync per write
// batch (~1 ms per awaited write here, about 5x slower than the default; figures at `fsync`
// below). It is configurable for throwaway setups (benchmarks) that prefer speed. A production
// R3 cluster is configured by its own chart, which should set the same policy.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { toolPath } from '../config/tools.ts';
import type { Logger } from '../observability/logger.ts';

/**
 * `always`: fsync before acknowledging every write (safe against OS crash / power loss).
 * `{ intervalMs }`: fsync periodically (nats-server default is 120000); an OS crash can lose
 * acknowledged writes from the last interval. A process crash loses nothing either way.
 */
export type FsyncPolicy = 'always' | { readonly intervalMs: number };

export interface LocalNatsServerOptions {
  /** Directory holding JetStream data; reuse it to keep state across restarts. */
  readonly storeDir: string;
  /** Directory for the generated config, log and ports file (created if missing). */
  readonly workDir: string;
  /** Client port; omit to let the server pick a free one (kept for restarts). */
  readonly port?: number;
  /** Monitoring (HTTP) port; omit for a free one, `false` to disable. */
  readonly monitorPort?: number | false;
  /**
   * Default 'always'. Measured on this 2-core VM (virtio disk, R1 file store, ~1 KiB records):
   * KV CAS updates awaited one at a time ≈ 1.0-1.2k/s with 'always' vs ≈ 6.6k/s with the 2 min
   * default; 16 concurrent writers ≈ 0.6-2.9k/s vs ≈ 12-13k/s; event appends ≈ 1.3-1.6k/s vs
   * ≈ 4.4k/s. About 1 ms per acknowledged write is far above what the control plane needs
   * (a few writes per turn, heartbeat or transition), so safety wins.
   */
  readonly fsync?: FsyncPolicy;
  /** Largest message the server accepts (nats max_payload); default 8 MiB for checkpoint chunks. */
  readonly maxPayloadBytes?: number;
  readonly serverName?: string;
  /** How long start() waits for readiness before killing the child; default 15 s. */
  readonly startTimeoutMs?: number;
  /** How long stop() waits after SIGTERM before SIGKILL; default 10 s. */
  readonly stopTimeoutMs?: number;
  /**
   * Users allowed to connect (R-R5), by nkey public key, each optionally restricted to subjects.
   * Omitted: no authentication (loopback dev and most tests).
   */
  readonly users?: readonly NatsServerUser[];
  /** nats-server binary; default toolPath('nats-server'). */
  readonly binary?: string;
  readonly logger?: Logger;
  /**
   * Member of a JetStream cluster (test/support/nats-cluster.ts: three servers on loopback). The
   * cluster port and the routes must be known before any member starts, so they are fixed here;
   * `serverName` must differ per member. Production clusters come from the official NATS chart.
   */
  readonly cluster?: NatsClusterMembership;
}

/** The `cluster {}` block of one member: its route listener and the routes to every other member. */
export interface NatsClusterMembership {
  readonly name: string;
  /** Route (cluster) port on 127.0.0.1. */
  readonly port: number;
  /** `nats-route://127.0.0.1:<port>` of the other members (a route to itself is ignored by the server). */
  readonly routes: readonly string[];
}

/** A user in the server's static authorization block. */
export interface NatsServerUser {
  /** The user's nkey public key (`U…`); its seed is the user's credential (nats-auth.ts). */
  readonly nkey: string;
  /** Without permissions the user may use every subject (the control plane). */
  readonly permissions?: {
    readonly publish: readonly string[];
    readonly subscribe: readonly string[];
    /** May publish replies to requests it received. */
    readonly allowResponses?: boolean;
  };
}

interface Ports {
  readonly client: number;
  readonly monitor: number | undefined;
}

const DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024;

/** A nats-server child process; `start()` it, `stop()` it, start it again on the same port and data. */
export class LocalNatsServer {
  readonly #opts: LocalNatsServerOptions;
  #child: ChildProcess | undefined;
  #exited: Promise<void> | undefined;
  #ports: Ports | undefined;

  constructor(opts: LocalNatsServerOptions) {
    if (opts.port !== undefined) assertPort(opts.port, 'port');
    if (opts.cluster !== undefined) assertPort(opts.cluster.port, 'cluster.port');
    if (typeof opts.monitorPort === 'number') assertPort(opts.monitorPort, 'monitorPort');
    if (typeof opts.fsync === 'object' && !(Number.isInteger(opts.fsync.intervalMs) && opts.fsync.intervalMs > 0)) {
      throw new Error(`fsync.intervalMs must be a positive integer, got ${opts.fsync.intervalMs}`);
    }
    this.#opts = opts;
  }

  /** Create and start a server in one step. */
  static async start(opts: LocalNatsServerOptions): Promise<LocalNatsServer> {
    const server = new LocalNatsServer(opts);
    await server.start();
    return server;
  }

  /** nats://127.0.0.1:port — valid after the first start, and stays the same across restarts. */
  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  get port(): number {
    if (!this.#ports) throw new Error('nats-server has not been started');
    return this.#ports.client;
  }

  /** http://127.0.0.1:port of the monitoring endpoint, if enabled. */
  get monitorUrl(): string | undefined {
    return this.#ports?.monitor === undefined ? undefined : `http://127.0.0.1:${this.#ports.monitor}`;
  }

  get running(): boolean {
    return this.#child !== undefined;
  }

  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** Start the child and wait until it accepts clients with JetStream enabled. */
  async start(): Promise<void> {
    if (this.#child) throw new Error('nats-server is already running');
    const o = this.#opts;
    const portsDir = join(o.workDir, 'ports');
    const logFile = join(o.workDir, 'nats-server.log');
    await mkdir(o.storeDir, { recursive: true });
    await rm(portsDir, { recursive: true, force: true });
    await mkdir(portsDir, { recursive: true });
    const configFile = join(o.workDir, 'nats-server.conf');
    // After the first start, pin the ports that were picked so clients can reconnect.
    const clientPort = this.#ports?.client ?? o.port ?? -1;
    const monitorPort = o.monitorPort === false ? undefined : (this.#ports?.monitor ?? o.monitorPort ?? -1);
    await writeFile(configFile, renderConfig({ ...o, clientPort, monitorPort, portsDir, logFile }), { mode: 0o600 });

    const child = spawn(o.binary ?? toolPath('nats-server'), ['-c', configFile], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr?.setEncoding('utf8').on('data', (d: string) => {
      stderr = (stderr + d).slice(-4096);
    });
    let exitInfo: string | undefined;
    this.#exited = new Promise<void>((resolve) => {
      child.once('exit', (code, signal) => {
        exitInfo = `code ${code ?? '-'} signal ${signal ?? '-'}`;
        if (this.#child === child) this.#child = undefined;
        resolve();
      });
      child.once('error', (err) => {
        exitInfo = `spawn error: ${err.message}`;
        if (this.#child === child) this.#child = undefined;
        resolve();
      });
    });
    this.#child = child;
    // Safety net: if our process exits without stop(), do not leave an orphan server holding the
    // port and store dir. SIGTERM is enough: acknowledged writes are already on disk.
    const killOnExit = (): void => {
      child.kill('SIGTERM');
    };
    process.once('exit', killOnExit);
    void this.#exited.then(() => process.removeListener('exit', killOnExit));

    const deadline = Date.now() + (o.startTimeoutMs ?? 15_000);
    try {
      const ports = await waitForPorts(portsDir, child, deadline, () => exitInfo);
      await waitReady(ports, deadline, () => exitInfo);
      this.#ports = ports;
      o.logger?.info({ pid: child.pid, port: ports.client, monitorPort: ports.monitor, storeDir: o.storeDir, fsync: o.fsync ?? 'always' }, 'nats-server started');
    } catch (err) {
      await this.#terminate();
      const log = await readFile(logFile, 'utf8').catch(() => '');
      throw new Error(`nats-server failed to start: ${(err as Error).message}\n${(stderr + log).slice(-2048)}`, { cause: err });
    }
  }

  /** SIGTERM, then SIGKILL after stopTimeoutMs. Safe to call when not running. */
  async stop(): Promise<void> {
    if (!this.#child) return;
    const pid = this.#child.pid;
    await this.#terminate();
    this.#opts.logger?.info({ pid }, 'nats-server stopped');
  }

  /** Stop, then start again on the same ports and store dir. */
  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /**
   * Fault injection (tests): SIGKILL and wait for the exit, nothing flushed or handed over (a
   * crashed server). `start()` brings it back on the same ports and store dir.
   */
  async kill(): Promise<void> {
    const child = this.#child;
    const exited = this.#exited;
    if (!child || !exited) return;
    child.kill('SIGKILL');
    await exited;
    this.#child = undefined;
    this.#opts.logger?.info({ pid: child.pid }, 'nats-server killed');
  }

  /** Fault injection (tests): SIGSTOP freezes the server (sockets stay open, nothing answers), SIGCONT resumes it. */
  signal(signal: 'SIGSTOP' | 'SIGCONT'): void {
    if (!this.#child) throw new Error('nats-server is not running');
    this.#child.kill(signal);
  }

  async #terminate(): Promise<void> {
    const child = this.#child;
    const exited = this.#exited;
    if (!child || !exited) return;
    // A frozen server (signal('SIGSTOP')) handles SIGTERM only once resumed.
    child.kill('SIGCONT');
    child.kill('SIGTERM');
    const timeout = this.#opts.stopTimeoutMs ?? 10_000;
    const stoppedInTime = await Promise.race([exited.then(() => true), sleep(timeout).then(() => false)]);
    if (!stoppedInTime) {
      this.#opts.logger?.warn({ pid: child.pid, timeoutMs: timeout }, 'nats-server ignored SIGTERM; sending SIGKILL');
      child.kill('SIGKILL');
      await exited;
    }
    this.#child = undefined;
  }
}

function assertPort(p: number, name: string): void {
  if (!Number.isInteger(p) || p < 1 || p > 65535) throw new Error(`${name} must be an integer in 1..65535, got ${p}`);
}

interface RenderInput extends LocalNatsServerOptions {
  readonly clientPort: number;
  readonly monitorPort: number | undefined;
  readonly portsDir: string;
  readonly logFile: string;
}

/** nats-server config text. Strings are JSON-quoted, which the NATS config parser accepts. */
export function renderConfig(i: RenderInput): string {
  const q = (s: string): string => JSON.stringify(s);
  const sync = i.fsync === undefined || i.fsync === 'always' ? 'always' : `${i.fsync.intervalMs}ms`;
  const lines = [
    `server_name: ${q(i.serverName ?? 'sandboxfleet-local')}`,
    `host: "127.0.0.1"`,
    `port: ${i.clientPort}`,
    i.monitorPort === undefined ? '' : `http: ${q(`127.0.0.1:${i.monitorPort}`)}`,
    `ports_file_dir: ${q(i.portsDir)}`,
    `log_file: ${q(i.logFile)}`,
    // Bounded logs: rotate at 10 MiB, keep 3 files.
    `logfile_size_limit: ${10 * 1024 * 1024}`,
    `logfile_max_num: 3`,
    `max_payload: ${i.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD}`,
    `jetstream {`,
    `  store_dir: ${q(i.storeDir)}`,
    `  sync_interval: ${q(sync)}`,
    `}`,
    ...(i.cluster === undefined ? [] : renderCluster(i.cluster)),
    ...(i.users === undefined ? [] : renderAuthorization(i.users)),
  ];
  return `${lines.filter(Boolean).join('\n')}\n`;
}

/** Routes on loopback only; every member lists every other, so any two can reach each other directly. */
function renderCluster(c: NatsClusterMembership): string[] {
  const q = (s: string): string => JSON.stringify(s);
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(c.name)) throw new Error(`cluster name must be 1-64 of [A-Za-z0-9_-], got ${c.name}`);
  for (const r of c.routes) if (!/^nats-route:\/\/127\.0\.0\.1:\d{1,5}$/.test(r)) throw new Error(`route must be nats-route://127.0.0.1:<port>, got ${r}`);
  return ['cluster {', `  name: ${q(c.name)}`, `  listen: ${q(`127.0.0.1:${c.port}`)}`, `  routes: [${c.routes.map(q).join(', ')}]`, '}'];
}

const NKEY_USER = /^U[A-Z2-7]{55}$/;

/** `authorization { users = [...] }`: only these nkeys may connect, each with its allow-lists. */
function renderAuthorization(users: readonly NatsServerUser[]): string[] {
  const q = (s: string): string => JSON.stringify(s);
  const list = (xs: readonly string[]): string => `[${xs.map(q).join(', ')}]`;
  const lines = ['authorization {', '  users = ['];
  for (const u of users) {
    if (!NKEY_USER.test(u.nkey)) throw new Error(`not an nkey user public key: ${u.nkey.slice(0, 8)}…`);
    if (u.permissions === undefined) {
      lines.push(`    { nkey: ${q(u.nkey)} }`);
      continue;
    }
    const p = u.permissions;
    lines.push(`    { nkey: ${q(u.nkey)}, permissions: { publish: { allow: ${list(p.publish)} }, subscribe: { allow: ${list(p.subscribe)} }${p.allowResponses ? ', allow_responses: true' : ''} } }`);
  }
  lines.push('  ]', '}');
  return lines;
}

/** The server writes `<exe>_<pid>.ports` once it listens: the only race-free way to learn `port: -1`. */
async function waitForPorts(dir: string, child: ChildProcess, deadline: number, exitInfo: () => string | undefined): Promise<Ports> {
  const suffix = `_${child.pid}.ports`;
  for (;;) {
    const gone = exitInfo();
    if (gone) throw new Error(`nats-server exited (${gone})`);
    const name = (await readdir(dir).catch(() => [] as string[])).find((f) => f.endsWith(suffix));
    if (name) {
      const text = await readFile(join(dir, name), 'utf8').catch(() => '');
      const parsed = parsePortsFile(text);
      if (parsed) return parsed;
    }
    if (Date.now() > deadline) throw new Error('timed out waiting for the ports file');
    await sleep(25);
  }
}

function parsePortsFile(text: string): Ports | undefined {
  let doc: { nats?: unknown; monitoring?: unknown };
  try {
    doc = JSON.parse(text) as typeof doc;
  } catch {
    return undefined; // partially written; poll again
  }
  const portOf = (urls: unknown): number | undefined => {
    const first = Array.isArray(urls) ? urls[0] : undefined;
    if (typeof first !== 'string') return undefined;
    const port = Number(new URL(first).port);
    return Number.isInteger(port) && port > 0 ? port : undefined;
  };
  const client = portOf(doc.nats);
  return client === undefined ? undefined : { client, monitor: portOf(doc.monitoring) };
}

/** Ready = /healthz?js-enabled-only=true answers ok, or (no monitor) the client port greets with INFO. */
async function waitReady(ports: Ports, deadline: number, exitInfo: () => string | undefined): Promise<void> {
  for (;;) {
    const gone = exitInfo();
    if (gone) throw new Error(`nats-server exited (${gone})`);
    if (ports.monitor !== undefined ? await healthy(ports.monitor) : await greets(ports.client)) return;
    if (Date.now() > deadline) throw new Error('timed out waiting for readiness');
    await sleep(25);
  }
}

async function healthy(monitorPort: number): Promise<boolean> {
  try {
    const res = await fetch(`http://127.0.0.1:${monitorPort}/healthz?js-enabled-only=true`, { signal: AbortSignal.timeout(1000) });
    return res.ok;
  } catch {
    return false;
  }
}

/** JetStream is started before the client listener opens, so an INFO greeting implies JS is up. */
function greets(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port });
    const done = (ok: boolean): void => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1000, () => done(false));
    socket.once('error', () => done(false));
    socket.once('data', (d) => done(d.toString('utf8').startsWith('INFO ')));
  });
}
