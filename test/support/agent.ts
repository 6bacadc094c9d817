// Test helpers for the host agent: start a real HostAgent in-process or as a child process
// (`node --import tsx cmd/host-agent/main.ts`, for kill tests), and the TEST DRIVER at the
// agent ↔ control-plane seam: `registrationResponder` answers registrations with an epoch the test
// chooses (it stands in for the control plane, which is tested on its own; it is not a mock of the
// agent), `sendCommand` sends a fenced AgentCommand and decodes the result, and `collect` gathers
// heartbeats / notices / probe echoes as the control plane would receive them.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { AgentSubjects } from '../../src/core/agent-subjects.ts';
import { DockerRuntime } from '../../src/docker/runtime.ts';
import { HostAgent } from '../../src/host-agent/agent.ts';
import { ChunkStore } from '../../src/store/chunk-store.ts';
import { parseHostAgentConfig, type HostAgentConfigInput } from '../../src/host-agent/config.ts';
import {
  AgentCommand,
  AgentCommandResult,
  CommandOutcome,
  Heartbeat,
  ProbeEcho,
  ProbeEchoAck,
  ReclaimNotice,
  Registration,
  type CopyVerdict,
  RegistrationAck,
} from '../../src/gen/sandboxfleet/v1/agent.ts';
import { HostState } from '../../src/gen/sandboxfleet/v1/common.ts';
import { silentLogger } from '../../src/observability/logger.ts';
import { FleetMetrics } from '../../src/observability/metrics.ts';
import type { DockerHost } from './docker.ts';

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const TEST_AGENT_SHA = '0123456789abcdef0123456789abcdef01234567';

export interface ResponderOptions {
  /** Epoch of the first answer; each further registration of the same host gets +1. */
  readonly firstEpoch?: number;
  readonly admitted?: boolean;
  /** Owned groups per answer (called per registration, so a test can change it between them). */
  /** The verdicts on the group copies a registration names (default: none, so every copy is kept). */
  readonly copyVerdicts?: (reg: Registration) => readonly CopyVerdict[];
}

export interface RegistrationResponder {
  readonly registrations: Registration[];
  /** Epoch handed out last per host. */
  readonly epochs: Map<string, number>;
  /** Resolves with the next registration of `hostId` (or of any host). */
  next(hostId?: string, timeoutMs?: number): Promise<Registration>;
  stop(): Promise<void>;
}

/** Test driver: answers Registration requests like the control plane's registration endpoint. */
export function registrationResponder(nc: NatsConnection, options: ResponderOptions = {}): RegistrationResponder {
  const registrations: Registration[] = [];
  const epochs = new Map<string, number>();
  const waiters: { hostId: string | undefined; resolve: (r: Registration) => void }[] = [];
  const sub = nc.subscribe(AgentSubjects.register, {
    callback: (_err, msg) => {
      const reg = Registration.decode(msg.data);
      registrations.push(reg);
      const epoch = epochs.has(reg.hostId) ? epochs.get(reg.hostId)! + 1 : (options.firstEpoch ?? 1);
      epochs.set(reg.hostId, epoch);
      const admitted = options.admitted ?? true;
      const ack: RegistrationAck = {
        hostId: reg.hostId,
        admitted,
        state: admitted ? HostState.READY : HostState.UNATTESTED,
        hostEpoch: epoch,
        leaseExpiresAtUnixMs: 0,
        refusalReasons: admitted ? [] : ['bridge_version'],
        mismatches: [],
        heartbeatIntervalMs: 1000,
        copyVerdicts: [...(options.copyVerdicts?.(reg) ?? [])],
      };
      msg.respond(RegistrationAck.encode(ack).finish());
      for (const w of waiters.splice(0)) {
        if (w.hostId === undefined || w.hostId === reg.hostId) w.resolve(reg);
        else waiters.push(w);
      }
    },
  });
  return {
    registrations,
    epochs,
    next(hostId, timeoutMs = 60_000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no registration from ${hostId ?? 'any host'} within ${timeoutMs} ms`)), timeoutMs);
        waiters.push({ hostId, resolve: (r) => (clearTimeout(timer), resolve(r)) });
      });
    },
    async stop() {
      await sub.drain();
    },
  };
}

export interface CommandFields {
  readonly hostId: string;
  readonly epoch: number;
  readonly generation?: number;
  readonly commandId?: string;
  readonly deadlineUnixMs?: number;
  readonly timeoutMs?: number;
}

/** Send one command as the control plane would and decode the answer. */
export async function sendCommand(nc: NatsConnection, f: CommandFields, command: NonNullable<AgentCommand['command']>): Promise<AgentCommandResult> {
  const cmd: AgentCommand = {
    commandId: f.commandId ?? randomUUID(),
    hostId: f.hostId,
    hostEpoch: f.epoch,
    placementGeneration: f.generation ?? 0,
    issuedAtUnixMs: Date.now(),
    deadlineUnixMs: f.deadlineUnixMs ?? 0,
    command,
  };
  const reply = await nc.request(AgentSubjects.commands(f.hostId), AgentCommand.encode(cmd).finish(), { timeout: f.timeoutMs ?? 120_000 });
  return AgentCommandResult.decode(reply.data);
}

/** Collects decoded messages of one subject; `waitFor` resolves on the first matching one. */
export class Collector<T> {
  readonly items: T[] = [];
  private readonly sub: Subscription;
  private waiters: { pred: (t: T) => boolean; resolve: (t: T) => void }[] = [];

  constructor(nc: NatsConnection, subject: string, decode: (b: Uint8Array) => T) {
    this.sub = nc.subscribe(subject, {
      callback: (_err, msg) => {
        const item = decode(msg.data);
        this.items.push(item);
        this.waiters = this.waiters.filter((w) => !(w.pred(item) && (w.resolve(item), true)));
      },
    });
  }

  waitFor(pred: (t: T) => boolean = () => true, timeoutMs = 30_000): Promise<T> {
    const found = this.items.find(pred);
    if (found !== undefined) return Promise.resolve(found);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no matching message within ${timeoutMs} ms`)), timeoutMs);
      this.waiters.push({ pred, resolve: (t) => (clearTimeout(timer), resolve(t)) });
    });
  }

  async stop(): Promise<void> {
    await this.sub.drain().catch(() => undefined);
  }
}

export const heartbeats = (nc: NatsConnection, hostId: string) => new Collector(nc, AgentSubjects.heartbeat(hostId), (b) => Heartbeat.decode(b));
export const notices = (nc: NatsConnection, hostId: string) => new Collector(nc, AgentSubjects.notices(hostId), (b) => ReclaimNotice.decode(b));

/** Test driver for the reverse probe (R-H7): answers ProbeEcho on the host's probe subject. */
export function probeResponder(nc: NatsConnection, hostId: string, replica = 'test-replica'): { echoes: ProbeEcho[]; stop(): Promise<void> } {
  const echoes: ProbeEcho[] = [];
  const sub = nc.subscribe(AgentSubjects.probeCallback(hostId), {
    callback: (_err, msg) => {
      const echo = ProbeEcho.decode(msg.data);
      echoes.push(echo);
      msg.respond(ProbeEchoAck.encode({ nonce: echo.nonce, replica, receivedAtUnixMs: Date.now() }).finish());
    },
  });
  return { echoes, stop: () => sub.drain() };
}

export interface AgentSetup {
  readonly hostId: string;
  readonly natsUrl: string;
  readonly host: DockerHost;
  readonly imageRef: string;
  readonly overrides?: Partial<HostAgentConfigInput>;
  /** The agent's clock (in-process agents only): tests move it to pass deadlines mid-command. */
  readonly nowMs?: () => number;
  /**
   * Child agents only: the file whose number (milliseconds) the agent's wall clock reads ahead of the
   * real one, re-read at run time (clock-offset-preload.ts), so a test can step a host's clock.
   */
  readonly clockOffsetFile?: string;
}

function configInput(s: AgentSetup): HostAgentConfigInput {
  return {
    hostId: s.hostId,
    natsUrl: s.natsUrl,
    dockerSocket: s.host.socketPath,
    imageRef: s.imageRef,
    agentSha: TEST_AGENT_SHA,
    heartbeatIntervalMs: 500,
    registerMaxBackoffMs: 1000,
    logLevel: 'silent',
    // Each test host its own chunk cache, removed with the host's directory.
    layerCacheDir: `${s.host.dir}/chunk-cache`,
    ...s.overrides,
  };
}

export interface InProcessAgent {
  readonly agent: HostAgent;
  readonly metrics: FleetMetrics;
  stop(): Promise<void>;
}

/**
 * The checkpoint streams an agent expects to find: in production the control plane creates them (an
 * agent's credentials may not), here a test without a control plane needs them made for it.
 */
export async function ensureCheckpointStreams(nc: NatsConnection): Promise<void> {
  await ChunkStore.open(nc);
}

/**
 * A real HostAgent in this process, on its own NATS connection; resolves once registered. With
 * `nc` unrestricted (no credentials) the checkpoint streams are made first, as the control plane
 * would; an agent on per-host credentials finds them made by the control plane under test.
 */
export async function startAgent(nc: NatsConnection, s: AgentSetup): Promise<InProcessAgent> {
  if (s.overrides?.natsCredsFile === undefined) await ensureCheckpointStreams(nc);
  const config = parseHostAgentConfig(configInput(s));
  const metrics = new FleetMetrics();
  const agent = new HostAgent({ config, nc, runtime: new DockerRuntime(s.host.docker), logger: silentLogger(), metrics, ...(s.nowMs !== undefined ? { nowMs: s.nowMs } : {}) });
  await agent.start();
  return { agent, metrics, stop: () => agent.stop() };
}

export interface ChildAgent {
  readonly child: ChildProcess;
  readonly pid: number;
  /** stdout+stderr so far (pino JSON lines). */
  output(): string;
  /** Resolves with the exit code (or signal name) when the process ends. */
  readonly exited: Promise<number | string>;
  kill(signal?: NodeJS.Signals): void;
}

/** The real agent binary as a child process (`node --import tsx cmd/host-agent/main.ts`). */
export function spawnAgent(s: AgentSetup): ChildAgent {
  const c = configInput(s);
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    SANDBOXFLEET_HOST_ID: c.hostId,
    SANDBOXFLEET_NATS_URL: c.natsUrl,
    SANDBOXFLEET_DOCKER_SOCKET: c.dockerSocket,
    SANDBOXFLEET_IMAGE_REF: c.imageRef,
    SANDBOXFLEET_AGENT_SHA: c.agentSha,
    SANDBOXFLEET_HEARTBEAT_INTERVAL_MS: String(c.heartbeatIntervalMs),
    ...(c.layerCacheDir !== undefined ? { SANDBOXFLEET_LAYER_CACHE_DIR: c.layerCacheDir } : {}),
    LOG_LEVEL: 'info',
    // Several agents share this machine: let each ops listener take a free port.
    SANDBOXFLEET_HTTP_PORT: '0',
    ...(c.reclaimNoticeFile ? { SANDBOXFLEET_RECLAIM_NOTICE_FILE: c.reclaimNoticeFile } : {}),
    // `host` where member containers must reach a loopback fake model API (the real CLIs' tests).
    ...(c.memberNetworkMode !== undefined ? { SANDBOXFLEET_MEMBER_NETWORK_MODE: c.memberNetworkMode } : {}),
    ...(s.clockOffsetFile !== undefined ? { SF_CLOCK_OFFSET_FILE: s.clockOffsetFile } : {}),
  };
  const preload = s.clockOffsetFile !== undefined ? ['--import', join(REPO_ROOT, 'test/support/clock-offset-preload.ts')] : [];
  const child = spawn(process.execPath, ['--import', 'tsx', ...preload, 'cmd/host-agent/main.ts'], { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.setEncoding('utf8').on('data', (s: string) => (out += s));
  child.stderr!.setEncoding('utf8').on('data', (s: string) => (out += s));
  const exited = new Promise<number | string>((res) => child.on('exit', (code, signal) => res(code ?? signal ?? 'unknown')));
  if (child.pid === undefined) throw new Error('host agent did not spawn');
  return { child, pid: child.pid, output: () => out, exited, kill: (signal = 'SIGTERM') => void child.kill(signal) };
}

type ResultBody = NonNullable<AgentCommandResult['result']>;
export type ResultValue<C extends ResultBody['$case']> = Extract<ResultBody, { $case: C }>['value'];

/** The payload of an OK result of the expected kind; throws with outcome, reason and message otherwise. */
export function okValue<C extends ResultBody['$case']>(r: AgentCommandResult, c: C): ResultValue<C> {
  if (r.outcome !== CommandOutcome.OK || r.result?.$case !== c) {
    throw new Error(`expected OK ${c}, got outcome ${r.outcome} reason ${JSON.stringify(r.reason)} result ${r.result?.$case}: ${r.message}`);
  }
  return (r.result as { value: unknown }).value as ResultValue<C>;
}
