// Who is calling (R-R5): runner, admin and host-agent clients all hold certificates from the same
// fleet CA, so a valid certificate alone does not say what its holder may do. The role is read from
// the client certificate: a SPIFFE-style URI SAN `spiffe://sandboxfleet/<role>[/<name>]` if present,
// else the subject OU. A host certificate leaked from a node therefore cannot open groups or drive
// turns, and a runner certificate cannot drain hosts.
//
// When runner and admin clients have separate CAs (the Helm chart's contract: runner-ca and
// admin-ca Secrets), the CA that signed the certificate decides the role too, and the two must
// agree: a certificate from the runner CA is a runner (or names no role), one from the admin CA an
// admin. A certificate that names another role than its CA's (e.g. a host certificate signed by
// the runner CA) gets no role and is refused everywhere.
import { X509Certificate } from 'node:crypto';
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

/** CA certificates per client role, when runner and admin clients have different CAs. */
export interface RoleCas {
  readonly runner: readonly X509Certificate[];
  readonly admin: readonly X509Certificate[];
}

const PEM_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** Every certificate of a PEM bundle; throws on a bundle without any (a config error). */
export function parseCaBundle(pem: Buffer | string, what = 'CA bundle'): X509Certificate[] {
  const blocks = pem.toString().match(PEM_BLOCK) ?? [];
  if (blocks.length === 0) throw new Error(`${what} contains no PEM certificate`);
  return blocks.map((b) => new X509Certificate(b));
}

/**
 * RoleCas for a runner and an admin CA bundle, or undefined when they hold the same certificates
 * (one CA for everyone: then only the certificate's own SAN/OU role can tell clients apart).
 */
export function roleCasFrom(runnerPem: Buffer, adminPem: Buffer): RoleCas | undefined {
  const runner = parseCaBundle(runnerPem, 'runner CA');
  const admin = parseCaBundle(adminPem, 'admin CA');
  const key = (certs: readonly X509Certificate[]) => certs.map((c) => c.fingerprint256).sort().join(',');
  return key(runner) === key(admin) ? undefined : { runner, admin };
}

/** True when `leaf` was signed by one of `cas` (issuer name matches and the signature verifies). */
function issuedByAny(leaf: X509Certificate, cas: readonly X509Certificate[]): boolean {
  return cas.some((ca) => {
    try {
      return leaf.checkIssued(ca) && leaf.verify(ca.publicKey);
    } catch {
      return false;
    }
  });
}

/**
 * Role from a peer certificate. Without `roleCas`: the role the certificate names. With them: the
 * role of the CA that signed it, which the named role (if any) must equal. The certificate was
 * already verified against the trust bundle by TLS; this only decides what it may do.
 */
export function identityFromCertificate(cert: PeerCertificate | undefined, roleCas?: RoleCas): PeerIdentity {
  const named = namedIdentity(cert);
  if (roleCas === undefined || cert?.raw === undefined || named.localDev) return named;
  let leaf: X509Certificate;
  try {
    leaf = new X509Certificate(cert.raw);
  } catch {
    return { role: undefined, name: named.name, localDev: false };
  }
  const byRunner = issuedByAny(leaf, roleCas.runner);
  const byAdmin = issuedByAny(leaf, roleCas.admin);
  // Both (a CA present in both bundles): the CA cannot tell, the certificate's own role decides.
  if (byRunner && byAdmin) return named;
  const caRole: PeerRole | undefined = byRunner ? 'runner' : byAdmin ? 'admin' : undefined;
  if (caRole === undefined) return { role: undefined, name: named.name, localDev: false };
  // Every role the certificate claims (sandboxfleet SPIFFE URIs, OUs naming a role) must be the CA's.
  if (roleClaims(cert).some((claim) => claim !== caRole)) return { role: undefined, name: named.name, localDev: false };
  return { role: caRole, name: named.name, localDev: false };
}

/** Role claims of a certificate: each sandboxfleet SPIFFE URI's role segment, and OUs that name a role. */
function roleClaims(cert: PeerCertificate): string[] {
  const uris = (cert.subjectaltname ?? '').split(',').map((s) => s.trim()).filter((s) => s.startsWith(`URI:${SPIFFE_PREFIX}`));
  const ous = cert.subject?.OU;
  const ouList = Array.isArray(ous) ? ous : ous === undefined ? [] : [ous];
  return [
    ...uris.map((u) => u.slice(4 + SPIFFE_PREFIX.length).split('/')[0] ?? ''),
    ...ouList.filter((o) => asRole(o) !== undefined),
  ];
}

/** Role the certificate names itself: URI SAN first (it is what SPIFFE-issuing CAs set), then OU. */
function namedIdentity(cert: PeerCertificate | undefined): PeerIdentity {
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
