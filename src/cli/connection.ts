// How `sandboxctl` reaches the control plane's AdminService (R-I7, R-R5): mTLS with an admin client
// certificate by default; plaintext only with --insecure (for `npm start`'s loopback dev mode).
// Flags win over environment variables, so a kubectl plugin can be pointed elsewhere per call.
// Every call has a deadline, and failures become RunnerError with the server's machine reason.
import * as grpc from '@grpc/grpc-js';
import { readFileSync } from 'node:fs';
import { AdminServiceClient } from '../gen/sandboxfleet/v1/admin.ts';
import { toRunnerError } from '../runner-sdk/client.ts';

export const DEFAULT_SERVER = '127.0.0.1:7443';

export interface ConnectionOptions {
  readonly server?: string | undefined;
  readonly ca?: string | undefined;
  readonly cert?: string | undefined;
  readonly key?: string | undefined;
  readonly insecure?: boolean | undefined;
  /** Per-call deadline in ms. */
  readonly timeout?: number | undefined;
}

export interface ResolvedConnection {
  readonly server: string;
  readonly insecure: boolean;
  readonly ca?: string | undefined;
  readonly cert?: string | undefined;
  readonly key?: string | undefined;
  readonly timeoutMs: number;
}

/** A usage problem (exit code 2), as opposed to a failed call (exit code 1). */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

function envFlag(v: string | undefined): boolean {
  return v !== undefined && ['1', 'true', 'yes'].includes(v.trim().toLowerCase());
}

/** Flags, then SANDBOXFLEET_SERVER / _CA / _CERT / _KEY / _INSECURE, then defaults. */
export function resolveConnection(opts: ConnectionOptions, env: NodeJS.ProcessEnv = process.env): ResolvedConnection {
  const insecure = opts.insecure === true || (opts.insecure === undefined && envFlag(env.SANDBOXFLEET_INSECURE));
  const pick = (flag: string | undefined, name: string) => flag ?? (env[name] === '' ? undefined : env[name]);
  const conn = {
    server: pick(opts.server, 'SANDBOXFLEET_SERVER') ?? DEFAULT_SERVER,
    insecure,
    ca: pick(opts.ca, 'SANDBOXFLEET_CA'),
    cert: pick(opts.cert, 'SANDBOXFLEET_CERT'),
    key: pick(opts.key, 'SANDBOXFLEET_KEY'),
    timeoutMs: opts.timeout ?? 30_000,
  };
  if (!insecure && (conn.ca === undefined || conn.cert === undefined || conn.key === undefined)) {
    throw new UsageError('mTLS needs --ca, --cert and --key (or SANDBOXFLEET_CA/_CERT/_KEY); use --insecure only against a loopback dev control plane');
  }
  if (!Number.isInteger(conn.timeoutMs) || conn.timeoutMs < 1) throw new UsageError('--timeout must be a positive number of milliseconds');
  return conn;
}

function readPem(path: string, what: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new UsageError(`cannot read ${what} ${path}: ${(err as Error).message}`);
  }
}

export function adminClient(conn: ResolvedConnection): AdminServiceClient {
  const credentials = conn.insecure
    ? grpc.credentials.createInsecure()
    : grpc.credentials.createSsl(readPem(conn.ca!, 'CA'), readPem(conn.key!, 'key'), readPem(conn.cert!, 'certificate'));
  return new AdminServiceClient(conn.server, credentials, { 'grpc.max_receive_message_length': 16 * 1024 * 1024 });
}

type UnaryMethod<Req, Res> = (request: Req, metadata: grpc.Metadata, options: Partial<grpc.CallOptions>, callback: (error: grpc.ServiceError | null, response: Res) => void) => grpc.ClientUnaryCall;

/** One unary call with the connection's deadline; rejects with a RunnerError (code + reason). */
export function call<Req, Res>(client: AdminServiceClient, method: UnaryMethod<Req, Res>, request: Req, timeoutMs: number, deadlineMs?: number): Promise<Res> {
  return new Promise((resolve, reject) => {
    method.call(client, request, new grpc.Metadata(), { deadline: Date.now() + (deadlineMs ?? timeoutMs) }, (error, response) => {
      if (error) reject(toRunnerError(error));
      else resolve(response);
    });
  });
}
