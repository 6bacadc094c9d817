// The one wrapper every API method goes through: authorization by peer role (R-R5), deadlines
// (R-I1: a call whose deadline passed or that the client cancelled never starts work), error
// mapping through the single table in errors.ts, one structured log line and metrics per call.
// Handlers are plain async functions of (request, context); they never touch grpc-js callbacks.
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '../observability/logger.ts';
import { ApiError, toMappedError, toServiceError, type MappedError } from './errors.ts';
import type { ApiMetrics } from './metrics.ts';
import type { PeerIdentity, PeerRole } from './peer-identity.ts';

export interface CallContext {
  readonly method: string;
  readonly peer: PeerIdentity;
  /** Aborted when the client cancels or the deadline passes; long work should watch it. */
  readonly signal: AbortSignal;
  /** Absolute deadline in epoch ms, or undefined when the client set none. */
  readonly deadlineMs: number | undefined;
}

export interface HandlerDeps {
  readonly logger: Logger;
  readonly metrics?: ApiMetrics | undefined;
  /** Reads the caller's identity from the call (certificate, or local dev mode). */
  readonly identify: (call: AnyCall) => PeerIdentity;
}

export type AnyCall = grpc.ServerUnaryCall<unknown, unknown> | grpc.ServerWritableStream<unknown, unknown>;

function deadlineOf(call: AnyCall): number | undefined {
  const d = call.getDeadline();
  const ms = d instanceof Date ? d.getTime() : d;
  return Number.isFinite(ms) ? ms : undefined;
}

/**
 * The transport connection (TLS socket) a call arrived on, or undefined when grpc-js does not expose
 * it in the shape we know (then the identity is simply derived per call, as before). grpc-js has no
 * public accessor: a server call wraps a chain of intercepting calls (`call`, then `nextCall`...)
 * whose innermost one holds the HTTP/2 `stream`, whose `session.socket` is the connection.
 */
function connectionOf(call: AnyCall): object | undefined {
  let node: unknown = (call as { call?: unknown }).call;
  for (let depth = 0; depth < 8 && typeof node === 'object' && node !== null; depth += 1) {
    const stream = (node as { stream?: { session?: { socket?: unknown } } }).stream;
    if (stream !== undefined) {
      const socket = stream.session?.socket;
      return typeof socket === 'object' && socket !== null ? socket : undefined;
    }
    node = (node as { nextCall?: unknown }).nextCall;
  }
  return undefined;
}

// Identity per connection, per identify function (one per server). The peer certificate of an
// established TLS connection never changes: TLS 1.3 has no renegotiation and HTTP/2 forbids it
// under TLS 1.2 (RFC 9113 §9.2.1; Node's http2 disables it on the socket). So the role is derived
// once per connection instead of on every call: grpc-js's getAuthContext() rebuilds the whole
// parsed peer certificate object on each call (~6% of the API's CPU at c64). Entries die with
// their socket (WeakMap).
const identities = new WeakMap<HandlerDeps['identify'], WeakMap<object, PeerIdentity>>();

/** The caller's identity, from the per-connection cache when the connection is known (R-R5). */
export function identifyCall(deps: HandlerDeps, call: AnyCall): PeerIdentity {
  const connection = connectionOf(call);
  if (connection === undefined) return deps.identify(call);
  let perConnection = identities.get(deps.identify);
  if (perConnection === undefined) {
    perConnection = new WeakMap();
    identities.set(deps.identify, perConnection);
  }
  let peer = perConnection.get(connection);
  if (peer === undefined) {
    peer = deps.identify(call);
    perConnection.set(connection, peer);
  }
  return peer;
}

function authorize(peer: PeerIdentity, allowed: readonly PeerRole[], method: string): void {
  if (peer.localDev) return;
  if (peer.role === undefined) {
    throw new ApiError(grpc.status.PERMISSION_DENIED, 'role_missing', 'client certificate names no sandboxfleet role', { method });
  }
  if (!allowed.includes(peer.role)) {
    throw new ApiError(grpc.status.PERMISSION_DENIED, 'role_not_allowed', `a ${peer.role} certificate may not call ${method}`, { method, role: peer.role });
  }
}

/**
 * Starts the call's context, or throws if it must not start (cancelled, deadline passed, not allowed).
 * The abort signal, with its cancellation listener and deadline timer, is made on first use: most
 * handlers (every runner turn call) finish without ever watching it, and an AbortController, an
 * event listener and a timer per call were a measurable share of the turn hot path.
 */
function open(deps: HandlerDeps, call: AnyCall, method: string, allowed: readonly PeerRole[]): { ctx: CallContext; done: () => void } {
  const deadlineMs = deadlineOf(call);
  let controller: AbortController | undefined;
  let onCancel: (() => void) | undefined;
  let timer: NodeJS.Timeout | undefined;
  let finished = false;
  const done = (): void => {
    finished = true;
    if (onCancel !== undefined) call.removeListener('cancelled', onCancel);
    if (timer !== undefined) clearTimeout(timer);
  };
  const signal = (): AbortSignal => {
    if (controller !== undefined) return controller.signal;
    const c = new AbortController();
    controller = c;
    if (finished) {
      c.abort(new ApiError(grpc.status.CANCELLED, 'cancelled', 'call already finished'));
      return c.signal;
    }
    if (call.cancelled) c.abort(new ApiError(grpc.status.CANCELLED, 'cancelled', 'call cancelled'));
    onCancel = (): void => c.abort(new ApiError(grpc.status.CANCELLED, 'cancelled', 'call cancelled'));
    call.once('cancelled', onCancel);
    if (deadlineMs !== undefined) {
      timer = setTimeout(() => c.abort(new ApiError(grpc.status.DEADLINE_EXCEEDED, 'deadline_exceeded', 'deadline exceeded')), Math.max(0, deadlineMs - Date.now()));
      timer.unref();
    }
    return c.signal;
  };
  const ctx: CallContext = {
    method,
    peer: identifyCall(deps, call),
    deadlineMs,
    get signal(): AbortSignal {
      return signal();
    },
  };
  try {
    if (call.cancelled) throw new ApiError(grpc.status.CANCELLED, 'cancelled', 'call cancelled before it started');
    if (deadlineMs !== undefined && deadlineMs - Date.now() <= 0) throw new ApiError(grpc.status.DEADLINE_EXCEEDED, 'deadline_exceeded', 'deadline passed before the call started');
    authorize(ctx.peer, allowed, method);
  } catch (error) {
    done();
    throw Object.assign(error as object, { peer: ctx.peer });
  }
  return { ctx, done };
}

function record(deps: HandlerDeps, method: string, peer: PeerIdentity | undefined, startedAt: number, mapped: MappedError | undefined): void {
  const code = mapped?.code ?? grpc.status.OK;
  const durationMs = performance.now() - startedAt;
  deps.metrics?.requests.inc({ method, code: grpc.status[code] });
  deps.metrics?.duration.observe({ method }, durationMs / 1000);
  const line = { method, code: grpc.status[code], reason: mapped?.detail.reason, durationMs: Math.round(durationMs * 100) / 100, role: peer?.localDev ? 'local-dev' : peer?.role, peer: peer?.name };
  if (mapped === undefined) deps.logger.info(line, 'rpc');
  else if (mapped.code === grpc.status.INTERNAL) deps.logger.error(line, 'rpc failed');
  else deps.logger.info(line, 'rpc refused');
}

function logInternal(deps: HandlerDeps, method: string, error: unknown, mapped: MappedError): void {
  // The client gets a generic INTERNAL; the cause (with stack) stays in our logs only.
  if (mapped.code === grpc.status.INTERNAL) deps.logger.error({ method, err: error }, 'internal error in handler');
}

/** Wraps an async unary handler. */
export function unary<Req, Res>(
  deps: HandlerDeps,
  method: string,
  allowed: readonly PeerRole[],
  handler: (request: Req, ctx: CallContext) => Promise<Res>,
): grpc.handleUnaryCall<Req, Res> {
  return (call, callback) => {
    const startedAt = performance.now();
    let peer: PeerIdentity | undefined;
    let opened: ReturnType<typeof open> | undefined;
    const fail = (error: unknown): void => {
      opened?.done();
      const mapped = toMappedError(error);
      logInternal(deps, method, error, mapped);
      record(deps, method, peer ?? (error as { peer?: PeerIdentity }).peer, startedAt, mapped);
      callback(toServiceError(mapped));
    };
    try {
      opened = open(deps, call as AnyCall, method, allowed);
      peer = opened.ctx.peer;
    } catch (error) {
      fail(error);
      return;
    }
    const { ctx } = opened;
    handler(call.request, ctx).then(
      (response) => {
        opened?.done();
        record(deps, method, peer, startedAt, undefined);
        callback(null, response);
      },
      fail,
    );
  };
}

function drainOrAbort(call: grpc.ServerWritableStream<unknown, unknown>, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const finish = (): void => {
      call.removeListener('drain', finish);
      signal.removeEventListener('abort', finish);
      resolve();
    };
    call.once('drain', finish);
    signal.addEventListener('abort', finish, { once: true });
  });
}

/** Wraps an async-iterable server-streaming handler (admin ListEvents). */
export function serverStream<Req, Res>(
  deps: HandlerDeps,
  method: string,
  allowed: readonly PeerRole[],
  handler: (request: Req, ctx: CallContext) => AsyncIterable<Res>,
): grpc.handleServerStreamingCall<Req, Res> {
  return (call) => {
    const startedAt = performance.now();
    let opened: ReturnType<typeof open> | undefined;
    const fail = (error: unknown): void => {
      opened?.done();
      const mapped = toMappedError(error);
      logInternal(deps, method, error, mapped);
      record(deps, method, opened?.ctx.peer ?? (error as { peer?: PeerIdentity }).peer, startedAt, mapped);
      if (!call.cancelled) call.emit('error', toServiceError(mapped));
    };
    try {
      opened = open(deps, call as AnyCall, method, allowed);
    } catch (error) {
      fail(error);
      return;
    }
    const { ctx } = opened;
    void (async () => {
      try {
        for await (const item of handler(call.request, ctx)) {
          if (ctx.signal.aborted) break;
          // Respect backpressure: wait for drain when the socket buffer is full.
          if (!call.write(item)) await drainOrAbort(call as grpc.ServerWritableStream<unknown, unknown>, ctx.signal);
        }
        opened.done();
        record(deps, method, ctx.peer, startedAt, undefined);
        if (!call.cancelled) call.end();
      } catch (error) {
        fail(error);
      }
    })();
  };
}

/**
 * Wraps a bidirectional-streaming handler (RunnerService.Exec): the handler reads the client's
 * frames as an async iterable and yields its answers; each answer is written with the socket's
 * backpressure respected (the next one is pulled only once the stream took it), so the handler
 * can grant its producers credit exactly as fast as the client reads.
 */
export function bidiStream<Req, Res>(
  deps: HandlerDeps,
  method: string,
  allowed: readonly PeerRole[],
  handler: (requests: AsyncIterable<Req>, ctx: CallContext) => AsyncIterable<Res>,
): grpc.handleBidiStreamingCall<Req, Res> {
  return (call) => {
    const startedAt = performance.now();
    let opened: ReturnType<typeof open> | undefined;
    const fail = (error: unknown): void => {
      opened?.done();
      const mapped = toMappedError(error);
      logInternal(deps, method, error, mapped);
      record(deps, method, opened?.ctx.peer ?? (error as { peer?: PeerIdentity }).peer, startedAt, mapped);
      if (!call.cancelled) call.emit('error', toServiceError(mapped));
    };
    try {
      // A duplex call has what open() reads of a call (deadline, cancellation, peer) in the same shape.
      opened = open(deps, call as unknown as AnyCall, method, allowed);
    } catch (error) {
      fail(error);
      return;
    }
    const { ctx } = opened;
    void (async () => {
      try {
        for await (const item of handler(call as AsyncIterable<Req>, ctx)) {
          if (ctx.signal.aborted) break;
          if (!call.write(item)) await drainOrAbort(call as unknown as grpc.ServerWritableStream<unknown, unknown>, ctx.signal);
        }
        opened.done();
        record(deps, method, ctx.peer, startedAt, undefined);
        if (!call.cancelled) call.end();
      } catch (error) {
        fail(error);
      }
    })();
  };
}
