// Unit tests of src/api/peer-identity.ts (R-R5): the caller's role comes from the client
// certificate's SPIFFE URI SAN (`spiffe://sandboxfleet/<role>[/<name>]`), else its subject OU;
// ambiguous, unknown or hostile inputs yield no role (refused everywhere), never a guessed one.
import fc from 'fast-check';
import type { PeerCertificate } from 'node:tls';
import { describe, expect, it } from 'vitest';
import { LOCAL_DEV_IDENTITY, PEER_ROLES, SPIFFE_PREFIX, identityFromCertificate } from '../../../src/api/peer-identity.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

/** Only the fields the parser reads; the rest of PeerCertificate is irrelevant here. */
function cert(fields: { CN?: string | string[]; OU?: string | string[]; san?: string }): PeerCertificate {
  const subject: Record<string, string | string[]> = {};
  if (fields.CN !== undefined) subject.CN = fields.CN;
  if (fields.OU !== undefined) subject.OU = fields.OU;
  return { subject, ...(fields.san !== undefined ? { subjectaltname: fields.san } : {}) } as unknown as PeerCertificate;
}

const role = (c: PeerCertificate | undefined) => identityFromCertificate(c).role;

describe('role from the SPIFFE URI SAN', () => {
  it.each(PEER_ROLES)('reads %s with or without a name', (r) => {
    expect(role(cert({ san: `URI:${SPIFFE_PREFIX}${r}` }))).toBe(r);
    expect(role(cert({ san: `URI:${SPIFFE_PREFIX}${r}/worker-7`, CN: 'worker-7' }))).toBe(r);
  });

  it('takes the SAN over a contradicting OU', () => {
    expect(role(cert({ san: 'URI:spiffe://sandboxfleet/host/host-a', OU: 'runner' }))).toBe('host');
  });

  it('ignores DNS/IP SANs and URIs of other trust domains, then falls back to the OU', () => {
    expect(role(cert({ san: 'DNS:localhost, IP Address:127.0.0.1, URI:spiffe://other/runner', OU: 'admin' }))).toBe('admin');
    expect(role(cert({ san: 'DNS:runner, URI:https://sandboxfleet/runner' }))).toBeUndefined();
  });

  it('refuses several SANs naming different roles, and an unknown role in the SAN', () => {
    expect(role(cert({ san: 'URI:spiffe://sandboxfleet/runner/a, URI:spiffe://sandboxfleet/admin/b', OU: 'runner' }))).toBeUndefined();
    // Unknown role in the only sandboxfleet SAN: no role (the OU does not rescue it).
    expect(role(cert({ san: 'URI:spiffe://sandboxfleet/root', OU: 'runner' }))).toBeUndefined();
    expect(role(cert({ san: 'URI:spiffe://sandboxfleet/runner/a, URI:spiffe://sandboxfleet/runner/b' }))).toBe('runner');
  });

  it('is case-sensitive and exact: look-alikes are not roles', () => {
    for (const hostile of ['Runner', 'RUNNER', ' runner', 'runners', 'run', 'runner\u0000', 'ｒunner', 'admin\nrunner', 'runner.evil']) {
      expect(role(cert({ san: `URI:${SPIFFE_PREFIX}${hostile}` }))).toBeUndefined();
      expect(role(cert({ OU: hostile }))).toBeUndefined();
    }
    // Node renders SANs as "TYPE:value, TYPE:value" and entries are trimmed, so only the OU can
    // carry trailing whitespace; it is not a role there either.
    expect(role(cert({ OU: 'runner ' }))).toBeUndefined();
  });

  it('does not accept a role smuggled in a comma of another SAN value', () => {
    // Node renders SANs as "TYPE:value, TYPE:value"; a DNS name cannot contain ", URI:" legitimately,
    // but a CN or email can contain text that looks like it: only URI: entries are read.
    expect(role(cert({ san: 'email:a@b.c', CN: 'URI:spiffe://sandboxfleet/admin' }))).toBeUndefined();
  });
});

describe('role from the subject OU', () => {
  it('reads a single OU or several equal OUs', () => {
    expect(role(cert({ OU: 'runner' }))).toBe('runner');
    expect(role(cert({ OU: ['admin', 'admin'] }))).toBe('admin');
  });

  it('refuses several different OUs, an unknown OU and no OU', () => {
    expect(role(cert({ OU: ['runner', 'admin'] }))).toBeUndefined();
    expect(role(cert({ OU: ['runner', 'marketing'] }))).toBeUndefined();
    expect(role(cert({ OU: 'control-plane' }))).toBeUndefined();
    expect(role(cert({ CN: 'nobody' }))).toBeUndefined();
    expect(role(cert({ OU: [] }))).toBeUndefined();
  });
});

describe('name and absent certificates', () => {
  it('reports the CN (first one) for logs', () => {
    expect(identityFromCertificate(cert({ CN: 'runner-1', OU: 'runner' }))).toEqual({ role: 'runner', name: 'runner-1', localDev: false });
    expect(identityFromCertificate(cert({ CN: ['a', 'b'], OU: 'runner' })).name).toBe('a');
  });

  it('gives no role and no local-dev flag without a certificate', () => {
    expect(identityFromCertificate(undefined)).toEqual({ role: undefined, name: '', localDev: false });
    expect(identityFromCertificate({} as PeerCertificate)).toEqual({ role: undefined, name: '', localDev: false });
    expect(LOCAL_DEV_IDENTITY).toMatchObject({ role: undefined, localDev: true });
  });

  it('never throws and never yields a role outside the catalogue on random input', () => {
    const text = fc.oneof(fc.string({ maxLength: 80 }), fc.constantFrom(...PEER_ROLES), fc.constantFrom(...PEER_ROLES).map((r) => `URI:${SPIFFE_PREFIX}${r}`));
    fc.assert(
      fc.property(fc.option(fc.oneof(text, fc.array(text, { maxLength: 4 }))), fc.option(fc.array(text, { maxLength: 5 }).map((a) => a.join(', '))), fc.option(text), (ou, san, cn) => {
        const identity = identityFromCertificate(cert({ ...(ou !== null ? { OU: ou } : {}), ...(san !== null ? { san } : {}), ...(cn !== null ? { CN: cn } : {}) }));
        expect(identity.localDev).toBe(false);
        if (identity.role !== undefined) expect(PEER_ROLES).toContain(identity.role);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });
});
