// Lease term rules (R-H4), pure part: a fixed term (spot/rental end reported at registration) is
// never extended; a renewable term is extended from accepted heartbeats, only when due, only
// forward, and never past a fixed end; drain starts `drainMarginMs` before whatever the end is.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { shouldDrain } from '../../../src/core/index.ts';
import { MAX_FIXED_TERM_MS, leasePolicyFor, leaseTermEnd, renewalFor } from '../../../src/control-plane/hosts.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const T0 = 1_700_000_000_000;

describe('lease policy', () => {
  it('a fixed term is the reported end and is never renewed', () => {
    const p = leasePolicyFor('h1', 3, T0 + 60_000, 0, T0);
    expect(p).toEqual({ hostId: 'h1', epoch: 3, fixedEndMs: T0 + 60_000, renewTermMs: 0, decidedAtMs: T0 });
    expect(leaseTermEnd(p, T0)).toBe(T0 + 60_000);
    expect(renewalFor(p, T0 + 60_000, T0 + 59_000)).toBeUndefined();
    // Drain starts exactly at end - margin.
    expect(shouldDrain({ epoch: 3, expiresAtMs: T0 + 60_000 }, T0 + 60_000 - 10_001, 10_000)).toBe(false);
    expect(shouldDrain({ epoch: 3, expiresAtMs: T0 + 60_000 }, T0 + 60_000 - 10_000, 10_000)).toBe(true);
  });

  it('no fixed end and no renewable term: no term at all', () => {
    const p = leasePolicyFor('h1', 1, 0, 0, T0);
    expect(leaseTermEnd(p, T0)).toBeUndefined();
    expect(renewalFor(p, undefined, T0 + 1)).toBeUndefined();
  });

  it('a renewable term renews once less than half of it remains', () => {
    const p = leasePolicyFor('h1', 1, 0, 10_000, T0);
    const end = leaseTermEnd(p, T0)!;
    expect(end).toBe(T0 + 10_000);
    expect(renewalFor(p, end, T0 + 4_000)).toBeUndefined();
    expect(renewalFor(p, end, T0 + 5_001)).toBe(T0 + 15_001);
  });

  it('renewal stops at a fixed end reported at registration', () => {
    const p = leasePolicyFor('h1', 1, T0 + 12_000, 10_000, T0);
    expect(leaseTermEnd(p, T0)).toBe(T0 + 10_000);
    expect(renewalFor(p, T0 + 10_000, T0 + 6_000)).toBe(T0 + 12_000);
    expect(renewalFor(p, T0 + 12_000, T0 + 8_000)).toBeUndefined();
  });

  it('a reported end absurdly far away is bounded', () => {
    expect(leasePolicyFor('h1', 1, Number.MAX_SAFE_INTEGER, 0, T0).fixedEndMs).toBe(T0 + MAX_FIXED_TERM_MS);
  });

  it('property: renewals only extend, never pass the fixed end, and never let a heartbeating host drain early', () => {
    fc.assert(fc.property(
      fc.option(fc.integer({ min: 1, max: 10_000_000 }), { nil: undefined }),
      fc.integer({ min: 1_000, max: 1_000_000 }),
      fc.array(fc.integer({ min: 1, max: 400 }), { minLength: 1, maxLength: 200 }),
      (fixedIn, term, gaps) => {
        const p = leasePolicyFor('h', 1, fixedIn === undefined ? 0 : T0 + fixedIn, term, T0);
        let end = leaseTermEnd(p, T0)!;
        let now = T0;
        for (const gap of gaps) {
          // Heartbeats every `gap` ms, well inside half a term (term >= 1000, gap <= 400).
          now += gap;
          const next = renewalFor(p, end, now);
          if (next !== undefined) {
            expect(next).toBeGreaterThan(end);
            end = next;
          }
          if (p.fixedEndMs !== undefined) expect(end).toBeLessThanOrEqual(p.fixedEndMs);
          // While heartbeats arrive, at least half a term remains, unless the fixed end is nearer.
          const floor = p.fixedEndMs === undefined ? now + term / 2 : Math.min(now + term / 2, p.fixedEndMs);
          expect(end).toBeGreaterThanOrEqual(Math.floor(floor));
        }
      }), { numRuns: PROPERTY_RUNS });
  });
});
