// Identifier bounds (R-R4) and the error taxonomy (status per category, stable reasons).
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  Conflict, Fenced, IdentityRefused, InvalidArgument, NoCapacity, NotFound, PreconditionFailed, Unavailable,
  ID_RULES, isFleetError, parseDigest, parseGitSha, parseGroupId, parseHostId, parseLocator, parseOptionalLocator, unwrap,
} from '../../../src/core/index.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';


describe('ids (R-R4)', () => {
  it('accepts well-formed ids', () => {
    expect(unwrap(parseHostId('host-a.example-1'))).toBe('host-a.example-1');
    expect(unwrap(parseLocator('3f1c2a9e-1111-4c4c-9a9a-0123456789ab'))).toBe('3f1c2a9e-1111-4c4c-9a9a-0123456789ab');
    expect(unwrap(parseLocator('ses_01HZX'))).toBe('ses_01HZX');
    expect(unwrap(parseDigest(`sha256:${'a'.repeat(64)}`))).toBe(`sha256:${'a'.repeat(64)}`);
    expect(unwrap(parseGitSha('0123456789abcdef0123456789abcdef01234567'))).toHaveLength(40);
  });

  it('refuses empty, oversize, non-string and bad charset with distinct reasons and the field name', () => {
    const cases: Array<[unknown, string]> = [
      ['', 'empty_value'],
      ['a'.repeat(ID_RULES.groupId.maxLength + 1), 'value_too_long'],
      [42, 'not_a_string'],
      ['../etc', 'invalid_characters'],
      ['-flag', 'invalid_characters'],
      ['a/b', 'invalid_characters'],
      ['a b', 'invalid_characters'],
    ];
    for (const [raw, reason] of cases) {
      const r = parseGroupId(raw, 'request.groupId');
      expect(r.ok).toBe(false);
      if (!r.ok) {
        expect(r.error).toBeInstanceOf(InvalidArgument);
        expect(r.error.reason).toBe(reason);
        expect(r.error.status).toBe('INVALID_ARGUMENT');
        expect(r.error.details.field).toBe('request.groupId');
      }
    }
  });

  it('a locator can never contain a path separator or exceed its bound (property)', () => {
    fc.assert(fc.property(fc.string({ maxLength: 300 }), (s) => {
      const r = parseLocator(s);
      if (r.ok) {
        expect(s.length).toBeGreaterThan(0);
        expect(s.length).toBeLessThanOrEqual(ID_RULES.locator.maxLength);
        expect(s).not.toMatch(/[/\\\s]/);
        expect(s.startsWith('.')).toBe(false);
      }
    }), { numRuns: PROPERTY_RUNS });
  });

  it('optional locator: absent is not an error, present must be valid', () => {
    expect(parseOptionalLocator(undefined)).toEqual({ ok: true, value: undefined });
    expect(parseOptionalLocator('')).toEqual({ ok: true, value: undefined });
    expect(parseOptionalLocator('x/y').ok).toBe(false);
  });

  it('digests and git shas are strict', () => {
    expect(parseDigest('sha256:ABC').ok).toBe(false);
    expect(parseDigest(`sha512:${'a'.repeat(64)}`).ok).toBe(false);
    expect(parseGitSha('abc').ok).toBe(false);
    expect(parseGitSha('A'.repeat(40)).ok).toBe(false);
  });
});

describe('errors', () => {
  it('each category names one status and carries reason, details and cause', () => {
    const cause = new Error('boom');
    const all = [
      [new InvalidArgument('malformed', 'm'), 'INVALID_ARGUMENT'],
      [new IdentityRefused('locator_mismatch', 'm'), 'FAILED_PRECONDITION'],
      [new PreconditionFailed('invalid_transition', 'm'), 'FAILED_PRECONDITION'],
      [new Conflict('cas_conflict', 'm', { cause }), 'ABORTED'],
      [new NotFound('group_not_found', 'm'), 'NOT_FOUND'],
      [new Unavailable('store_unavailable', 'm'), 'UNAVAILABLE'],
      [new NoCapacity('no_capacity', 'm'), 'RESOURCE_EXHAUSTED'],
      [new Fenced('stale_epoch', 'm', { details: { messageEpoch: 1 } }), 'FAILED_PRECONDITION'],
    ] as const;
    for (const [e, status] of all) {
      expect(e.status).toBe(status);
      expect(isFleetError(e)).toBe(true);
      expect(e).toBeInstanceOf(Error);
      expect(e.name).toBe(e.constructor.name);
    }
    expect(all[3][0].cause).toBe(cause);
    expect(all[7][0].details).toEqual({ messageEpoch: 1 });
    expect(isFleetError(new Error('x'))).toBe(false);
  });
});
