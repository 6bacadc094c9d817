// The gRPC API server (R-I1, R-R4, R-R5): the runner service bound to a RunnerBackend (the control
// plane), optionally the admin service, the standard grpc.health.v1 service and server reflection.
// Security posture: mTLS with a required, CA-verified client certificate, and a role check per
// method (runner vs admin vs host). Plaintext exists only as an explicit local dev mode and only on
// a loopback address; anything else refuses to start. Messages are size-bounded, keepalive is
// bounded both ways, and every call passes through call-handler.ts (deadlines, auth, logs, metrics).
import * as grpc from '@grpc/grpc-js';
import { HealthImplementation } from 'grpc-health-check';
import type { Registry } from 'prom-client';
import type { ExecBackend } from '../core/exec-port.ts';
import type { RunnerBackend } from '../core/runner-port.ts';
import { AdminServiceService } from '../gen/sandboxfleet/v1/admin.ts';
import {
  RunnerServiceService,
  type BeginTurnRequest,
  type BeginTurnResponse,
  type CompleteTurnRequest,
  type CompleteTurnResponse,
  type GetGroupStateRequest,
  type GetGroupStateResponse,
  type OpenGroupRequest,
  type OpenGroupResponse,
  type RunnerServiceServer,
  type StopGroupRequest,
  type StopGroupResponse,
} from '../gen/sandboxfleet/v1/runner.ts';
import { silentLogger, type Logger } from '../observability/logger.ts';
import { adminServiceImplementation, type AdminHandlers } from './admin-service.ts';
import { unary, type HandlerDeps } from './call-handler.ts';
import { execHandlers } from './exec-handlers.ts';
import {
  beginTurnFromProto,
  beginTurnToProto,
  completeTurnFromProto,
  completeTurnToProto,
  getGroupStateFromProto,
  groupToProto,
  openGroupFromProto,
  stopGroupFromProto,
  stopGroupToProto,
} from './mapping.ts';
import { ApiMetrics } from './metrics.ts';
import { identityFromCertificate, LOCAL_DEV_IDENTITY, type PeerRole, type RoleCas } from './peer-identity.ts';
import { addReflectionService } from './reflection.ts';
import { compiledDescriptors } from './reflection-descriptors.ts';

export const RUNNER_SERVICE_NAME = 'sandboxfleet.v1.RunnerService';
export const ADMIN_SERVICE_NAME = 'sandboxfleet.v1.AdminService';
/** Default bound on one request (R-R4): the largest legitimate request is a few KiB. */
export const DEFAULT_MAX_RECEIVE_BYTES = 256 * 1024;
const DEFAULT_MAX_SEND_BYTES = 4 * 1024 * 1024;

export interface MtlsOptions {
  /** PEM of the CA(s) that sign client certificates: the TLS trust bundle. */
  readonly ca: Buffer;
  /**
   * Runner and admin client CAs when they differ (each must also be in `ca`): then the signing CA
   * decides the role, and the role the certificate names must agree (peer-identity.ts).
   */
  readonly roleCas?: RoleCas | undefined;
  /** PEM of this server's certificate chain and key. */
  readonly cert: Buffer;
  readonly key: Buffer;
}

export type TransportSecurity =
  | { readonly mode: 'mtls'; readonly mtls: MtlsOptions }
  /** Plaintext without authentication: refused unless the address is loopback (R-R5). */
  | { readonly mode: 'insecure-local-dev' };

export interface ApiServerOptions {
  readonly runner: RunnerBackend;
  /** Exec and RunTurn (R-I9); when absent both answer UNIMPLEMENTED. */
  readonly exec?: ExecBackend | undefined;
  /** Admin handlers from the control plane; when absent the admin service is not registered. */
  readonly admin?: Partial<AdminHandlers> | undefined;
  /** host:port; port 0 picks a free one. */
  readonly address: string;
  readonly security: TransportSecurity;
  readonly logger?: Logger | undefined;
  readonly registry?: Registry | undefined;
  readonly maxReceiveMessageBytes?: number | undefined;
}

/** Roles allowed to call the runner service: the runner, and admins (operators debugging a group). */
const RUNNER_ROLES: readonly PeerRole[] = ['runner', 'admin'];
/** Read-only state is also useful to operators; mutations are for runners only. */
const RUNNER_MUTATION_ROLES: readonly PeerRole[] = ['runner'];

/** The runner service: validate and map the request, call the backend, map the answer. */
export function runnerServiceImplementation(deps: HandlerDeps, backend: RunnerBackend, exec?: ExecBackend): RunnerServiceServer {
  return {
    ...(exec !== undefined ? execHandlers(deps, exec, RUNNER_MUTATION_ROLES) : UNIMPLEMENTED_EXEC),
    openGroup: unary<OpenGroupRequest, OpenGroupResponse>(deps, 'RunnerService/OpenGroup', RUNNER_MUTATION_ROLES, async (request) => {
      const result = await backend.openGroup(openGroupFromProto(request));
      return { group: groupToProto(result.group), created: result.created };
    }),
    beginTurn: unary<BeginTurnRequest, BeginTurnResponse>(deps, 'RunnerService/BeginTurn', RUNNER_MUTATION_ROLES, async (request) =>
      beginTurnToProto(await backend.beginTurn(beginTurnFromProto(request))),
    ),
    completeTurn: unary<CompleteTurnRequest, CompleteTurnResponse>(deps, 'RunnerService/CompleteTurn', RUNNER_MUTATION_ROLES, async (request) =>
      completeTurnToProto(await backend.completeTurn(completeTurnFromProto(request))),
    ),
    stopGroup: unary<StopGroupRequest, StopGroupResponse>(deps, 'RunnerService/StopGroup', RUNNER_MUTATION_ROLES, async (request) =>
      stopGroupToProto(await backend.stopGroup(stopGroupFromProto(request))),
    ),
    getGroupState: unary<GetGroupStateRequest, GetGroupStateResponse>(deps, 'RunnerService/GetGroupState', RUNNER_ROLES, async (request) => ({
      group: groupToProto(await backend.getGroupState(getGroupStateFromProto(request))),
    })),
  };
}

/** A server without an exec backend (tests of the turn API alone): Exec and RunTurn are not offered. */
const UNIMPLEMENTED_EXEC: Pick<RunnerServiceServer, 'exec' | 'runTurn'> = {
  exec: (call) => call.emit('error', { code: grpc.status.UNIMPLEMENTED, details: 'Exec is not served by this server' }),
  runTurn: (call) => call.emit('error', { code: grpc.status.UNIMPLEMENTED, details: 'RunTurn is not served by this server' }),
};

/** Thrown at start for a configuration that would weaken authentication (R-R5). */
export class InsecureConfigurationError extends Error {
  readonly reason = 'insecure_non_loopback' as const;
  constructor(address: string) {
    super(`refusing to serve without mTLS on non-loopback address ${address}: plaintext is for loopback local dev only`);
    this.name = 'InsecureConfigurationError';
  }
}

/** host part of host:port, without IPv6 brackets. */
export function hostOf(address: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(address);
  if (bracketed?.[1] !== undefined) return bracketed[1];
  const idx = address.lastIndexOf(':');
  return idx < 0 ? address : address.slice(0, idx);
}

export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127(?:\.\d{1,3}){3}$/.test(host);
}

export class ApiServer {
  readonly port: number;
  readonly address: string;
  readonly health: HealthImplementation;
  readonly #server: grpc.Server;
  readonly #logger: Logger;

  private constructor(server: grpc.Server, port: number, address: string, health: HealthImplementation, logger: Logger) {
    this.#server = server;
    this.port = port;
    this.address = address;
    this.health = health;
    this.#logger = logger;
  }

  static async start(opts: ApiServerOptions): Promise<ApiServer> {
    const logger = opts.logger ?? silentLogger();
    const host = hostOf(opts.address);
    if (opts.security.mode !== 'mtls' && !isLoopbackHost(host)) throw new InsecureConfigurationError(opts.address);

    const server = new grpc.Server({
      'grpc.max_receive_message_length': opts.maxReceiveMessageBytes ?? DEFAULT_MAX_RECEIVE_BYTES,
      'grpc.max_send_message_length': DEFAULT_MAX_SEND_BYTES,
      // Keepalive: ping idle clients every 30 s, drop them after 10 s without an answer; accept
      // client pings no more often than every 10 s (faster ones are abuse and get GOAWAY).
      'grpc.keepalive_time_ms': 30_000,
      'grpc.keepalive_timeout_ms': 10_000,
      'grpc.http2.min_ping_interval_without_data_ms': 10_000,
      'grpc.max_connection_age_grace_ms': 30_000,
      'grpc.max_concurrent_streams': 1_000,
    });
    const deps: HandlerDeps = {
      logger,
      metrics: opts.registry === undefined ? undefined : new ApiMetrics(opts.registry),
      identify: opts.security.mode === 'mtls'
        ? ((roleCas) => (call: Parameters<HandlerDeps['identify']>[0]) => identityFromCertificate(call.getAuthContext()?.sslPeerCertificate, roleCas))(opts.security.mtls.roleCas)
        : () => LOCAL_DEV_IDENTITY,
    };
    server.addService(RunnerServiceService, runnerServiceImplementation(deps, opts.runner, opts.exec));
    const services = ['', RUNNER_SERVICE_NAME];
    if (opts.admin !== undefined) {
      server.addService(AdminServiceService, adminServiceImplementation(deps, opts.admin));
      services.push(ADMIN_SERVICE_NAME);
    }
    const health = new HealthImplementation(Object.fromEntries(services.map((s) => [s, 'SERVING'])));
    health.addToServer(server);
    // Reflection serves the descriptors buf compiled, byte for byte (reflection-descriptors.ts).
    addReflectionService(server, compiledDescriptors(), [...services.filter((s) => s !== ''), 'grpc.health.v1.Health']);

    const credentials =
      opts.security.mode === 'mtls'
        ? grpc.ServerCredentials.createSsl(opts.security.mtls.ca, [{ cert_chain: opts.security.mtls.cert, private_key: opts.security.mtls.key }], true)
        : grpc.ServerCredentials.createInsecure();
    const port = await new Promise<number>((resolve, reject) => server.bindAsync(opts.address, credentials, (error, p) => (error ? reject(error) : resolve(p))));
    const bound = `${host.includes(':') ? `[${host}]` : host}:${port}`;
    logger.info({ address: bound, mode: opts.security.mode, admin: opts.admin !== undefined }, 'api server listening');
    return new ApiServer(server, port, bound, health, logger);
  }

  /** Marks every service NOT_SERVING, lets calls in flight finish within `graceMs`, then forces. */
  async shutdown(graceMs = 5_000): Promise<void> {
    for (const s of ['', RUNNER_SERVICE_NAME, ADMIN_SERVICE_NAME]) this.health.setStatus(s, 'NOT_SERVING');
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.#server.forceShutdown();
        resolve();
      }, graceMs);
      timer.unref();
      this.#server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    this.#logger.info({ address: this.address }, 'api server stopped');
  }
}
