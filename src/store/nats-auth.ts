// NATS authentication of our processes (R-I2, R-R5): credentials and CA from files, for the control
// plane (full access to the state store) and for host agents (per-host least privilege, see
// core/agent-subjects.ts hostPermissions). Two credential formats, told apart by content:
// - a `.creds` file (user JWT + nkey seed; NATS operator mode, e.g. issued with `nsc`), or
// - a bare nkey user seed (`SU…`; static `authorization { users: [{ nkey: U… }] }` server config,
//   what the local fleet and the tests generate).
// The file is read again on every (re)connect, so a rotated credential is picked up without a
// restart. Options are plain data (paths), so worker threads can rebuild the same connection.
import { readFileSync } from 'node:fs';
import { credsAuthenticator, nkeyAuthenticator, nkeys, type Authenticator, type NodeConnectionOptions } from '@nats-io/transport-node';

/** How a process authenticates to NATS; every field optional (loopback dev needs none). */
export interface NatsAuthOptions {
  /** A `.creds` file or an nkey user seed file. */
  readonly credsFile?: string | undefined;
  /** PEM CA that signed the NATS server certificate; set it to require TLS. */
  readonly caFile?: string | undefined;
  /** Reply subjects under this prefix (a host may subscribe only to its own: hostInboxPrefix). */
  readonly inboxPrefix?: string | undefined;
}

export class NatsCredentialsError extends Error {
  override readonly name = 'NatsCredentialsError';
}

const JWT_BEGIN = '-----BEGIN NATS USER JWT-----';
const USER_SEED = /^SU[A-Z2-7]{56}$/;

/** Which kind of credential the file holds; throws NatsCredentialsError for anything else. */
export function credentialKind(text: string, file: string): 'creds' | 'nkey-seed' {
  if (text.includes(JWT_BEGIN)) return 'creds';
  const lines = text.split(/\r?\n/).map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  if (lines.length === 1 && USER_SEED.test(lines[0]!)) return 'nkey-seed';
  throw new NatsCredentialsError(`${file}: neither a NATS .creds file nor an nkey user seed (SU…)`);
}

function readCredential(file: string): { kind: 'creds' | 'nkey-seed'; bytes: Uint8Array } {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new NatsCredentialsError(`cannot read NATS credentials ${file}: ${(err as Error).message}`, { cause: err });
  }
  const kind = credentialKind(text, file);
  const bytes = new TextEncoder().encode(kind === 'creds' ? text : text.split(/\r?\n/).map((l) => l.trim()).find((l) => USER_SEED.test(l))!);
  return { kind, bytes };
}

/**
 * Connection options for `opts`. The credential file is validated now (a bad file fails start-up,
 * not the first reconnect) and re-read by the authenticator on every connect (rotation).
 */
export function natsAuthConnectOptions(opts: NatsAuthOptions): Partial<NodeConnectionOptions> {
  const out: { authenticator?: Authenticator; tls?: { caFile: string }; inboxPrefix?: string } = {};
  if (opts.credsFile !== undefined && opts.credsFile !== '') {
    const file = opts.credsFile;
    const { kind } = readCredential(file);
    out.authenticator = kind === 'creds' ? credsAuthenticator(() => readCredential(file).bytes) : nkeyAuthenticator(() => readCredential(file).bytes);
  }
  if (opts.caFile !== undefined && opts.caFile !== '') out.tls = { caFile: opts.caFile };
  if (opts.inboxPrefix !== undefined && opts.inboxPrefix !== '') out.inboxPrefix = opts.inboxPrefix;
  return out;
}

/** A new nkey user: the seed goes into the user's credential file, the public key into the server config. */
export function newNkeyUser(): { readonly seed: string; readonly publicKey: string } {
  const kp = nkeys.createUser();
  return { seed: new TextDecoder().decode(kp.getSeed()), publicKey: kp.getPublicKey() };
}

/** NatsAuthOptions resolved for a worker thread: plain data it can rebuild the options from. */
export interface WorkerAuth {
  readonly kind?: 'creds' | 'nkey-seed';
  readonly credsFile?: string;
  readonly caFile?: string;
  readonly inboxPrefix?: string;
}

/** Where and how a worker thread connects: the same servers and credentials as its parent. */
export interface WorkerConnection {
  readonly servers: string | readonly string[];
  readonly auth?: WorkerAuth;
}

/** Resolve `opts` for a worker (validating the credential file now, on the parent thread). */
export function workerAuth(opts: NatsAuthOptions | undefined): WorkerAuth | undefined {
  if (opts === undefined) return undefined;
  const kind = opts.credsFile !== undefined && opts.credsFile !== '' ? readCredential(opts.credsFile).kind : undefined;
  return {
    ...(kind !== undefined ? { kind, credsFile: opts.credsFile } : {}),
    ...(opts.caFile ? { caFile: opts.caFile } : {}),
    ...(opts.inboxPrefix ? { inboxPrefix: opts.inboxPrefix } : {}),
  };
}

/**
 * `natsAuthOptions(auth, transport)` as CommonJS source for the chunk workers (which are evaluated
 * from strings, see chunk-fetch-worker.ts): the worker side of natsAuthConnectOptions, kept here
 * next to it so the two cannot drift.
 */
export const WORKER_AUTH_SOURCE = `
function natsAuthOptions(auth, transport) {
  const out = {};
  if (!auth) return out;
  if (auth.credsFile) {
    const fs = require('node:fs');
    const read = () => {
      const text = fs.readFileSync(auth.credsFile, 'utf8');
      if (auth.kind === 'creds') return new TextEncoder().encode(text);
      const seed = text.split(/\\r?\\n/).map((l) => l.trim()).find((l) => ${USER_SEED.toString()}.test(l));
      return new TextEncoder().encode(seed || '');
    };
    out.authenticator = auth.kind === 'creds' ? transport.credsAuthenticator(read) : transport.nkeyAuthenticator(read);
  }
  if (auth.caFile) out.tls = { caFile: auth.caFile };
  if (auth.inboxPrefix) out.inboxPrefix = auth.inboxPrefix;
  return out;
}
`;
