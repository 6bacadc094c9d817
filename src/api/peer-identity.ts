// Who is calling (R-R5): runner, admin and host-agent clients all hold certificates from the same
// fleet CA, so a valid certificate alone does not say what its holder may do. The role is read from
// the client certificate: a SPIFFE-style URI SAN `spiffe://sandboxfleet/<role>[/<name>]` if present,
// else the subject OU. A host certificate leaked from a node therefore cannot open groups or drive
// turns, and a runner certificate cannot drain hosts.
import type { PeerCertificate } from 'node:tls';

export type PeerRole = 'runner' | 'admin' | 'host';
export const PEER_ROLES: readonly PeerRole[] = ['runner', 'admin', 'host'];
export const SPIFFE_PREFIX = 'spiffe://sandboxfleet/';

export interface PeerIdentity {
  /** undefined when the certificate names no known role (such a caller is refused everywhere). */
  readonly role: PeerRole | undefined;
  /** Subject CN, for logs. */
  readonly name: string;
  /** True only in loopback local dev mode, where there is no certificate at all. */
  readonly localDev: boolean;
}

function asRole(value: string | undefined): PeerRole | undefined {
  return (PEER_ROLES as readonly string[]).includes(value ?? '') ? (value as PeerRole) : undefined;
}

function first(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** Role from a peer certificate: URI SAN first (it is what SPIFFE-issuing CAs set), then OU. */
export function identityFromCertificate(cert: PeerCertificate | undefined): PeerIdentity {
  if (cert === undefined || Object.keys(cert).length === 0) return { role: undefined, name: '', localDev: false };
  const name = first(cert.subject?.CN) ?? '';
  const uris = (cert.subjectaltname ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.startsWith('URI:'))
    .map((s) => s.slice(4));
  const spiffe = uris.filter((u) => u.startsWith(SPIFFE_PREFIX)).map((u) => asRole(u.slice(SPIFFE_PREFIX.length).split('/')[0]));
  // Several sandboxfleet URIs naming different roles are ambiguous: no role rather than the first.
  const sanRoles = new Set(spiffe);
  if (sanRoles.size > 1) return { role: undefined, name, localDev: false };
  if (sanRoles.size === 1) return { role: [...sanRoles][0], name, localDev: false };
  const ous = cert.subject?.OU;
  const ouList = Array.isArray(ous) ? ous : ous === undefined ? [] : [ous];
  const ouRoles = new Set(ouList.map(asRole));
  if (ouRoles.size !== 1) return { role: undefined, name, localDev: false };
  return { role: [...ouRoles][0], name, localDev: false };
}

export const LOCAL_DEV_IDENTITY: PeerIdentity = { role: undefined, name: 'local-dev', localDev: true };
