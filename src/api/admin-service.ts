// Admin service wiring (R-I1, R-R5): the operator API is served by the same server as the runner
// API but only to admin certificates. The control plane supplies the handlers as async functions in
// protobuf types (its admin façade); this module adds authorization, deadlines, logging, metrics and
// error mapping through call-handler.ts, so no admin method can skip them.
import * as grpc from '@grpc/grpc-js';
import type { AdminServiceServer } from '../gen/sandboxfleet/v1/admin.ts';
import { ApiError } from './errors.ts';
import { serverStream, unary, type CallContext, type HandlerDeps } from './call-handler.ts';
import type { PeerRole } from './peer-identity.ts';

/** Every AdminService method, in proto order. */
export const ADMIN_METHODS = [
  'listHosts', 'getHost', 'drainHost', 'removeHost', 'listGroups', 'getGroup', 'migrateGroup', 'destroyGroup', 'listCheckpoints', 'verify', 'listEvents',
] as const;
export type AdminMethod = (typeof ADMIN_METHODS)[number];

/** The admin methods as async functions: unary ones return a promise, ListEvents an async iterable. */
export type AdminHandlers = {
  [K in AdminMethod]: AdminServiceServer[K] extends grpc.handleServerStreamingCall<infer Q, infer S>
    ? (request: Q, ctx: CallContext) => AsyncIterable<S>
    : AdminServiceServer[K] extends grpc.handleUnaryCall<infer Q, infer S>
      ? (request: Q, ctx: CallContext) => Promise<S>
      : never;
};

const ADMIN_ROLES: readonly PeerRole[] = ['admin'];

const STREAMING: ReadonlySet<AdminMethod> = new Set<AdminMethod>(['listEvents']);

/**
 * The grpc-js implementation of AdminService. Methods the control plane does not supply answer
 * UNIMPLEMENTED (reason `method_not_served`) after authorization, so an unauthorised caller learns
 * nothing about which methods exist.
 */
export function adminServiceImplementation(deps: HandlerDeps, handlers: Partial<AdminHandlers>): AdminServiceServer {
  const impl: Record<string, unknown> = {};
  for (const name of ADMIN_METHODS) {
    const method = `AdminService/${name[0]?.toUpperCase()}${name.slice(1)}`;
    const missing = (): never => {
      throw new ApiError(grpc.status.UNIMPLEMENTED, 'method_not_served', `${method} is not served by this control plane`, { method });
    };
    if (STREAMING.has(name)) {
      const fn = handlers[name] as ((q: unknown, c: CallContext) => AsyncIterable<unknown>) | undefined;
      impl[name] = serverStream(deps, method, ADMIN_ROLES, fn ?? missing);
    } else {
      const fn = handlers[name] as ((q: unknown, c: CallContext) => Promise<unknown>) | undefined;
      impl[name] = unary(deps, method, ADMIN_ROLES, fn ?? (async () => missing()));
    }
  }
  return impl as AdminServiceServer;
}
