// The host-copy rule (R-H6, R-R6): a copy is deleted only on positive proof from the group's record.
// Property: whatever the record says, DELETE comes only with destroyed / settled-elsewhere at the
// copy's generation or later / LOST past retention — and never reaches a generation newer than the
// copy's; an absent or unreadable record, a record naming the host, or an unfinished migration keep it.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decideHostCopy, type GroupLifecycle, type GroupRecordView } from '../../../src/core/index.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const HOSTS = ['host-a', 'host-b', 'host-c'] as const;
const STATES = ['PENDING', 'RUNNING', 'STOPPING', 'STOPPED', 'MIGRATING', 'LOST', 'DESTROYED'] as const;
const RETENTION = 7 * 24 * 3_600_000;

const lifecycle = fc.record({
  state: fc.constantFrom(...STATES),
  hostId: fc.constantFrom(...HOSTS),
  generation: fc.integer({ min: 1, max: 6 }),
  target: fc.constantFrom(...HOSTS),
}).map(({ state, hostId, generation, target }): GroupLifecycle => ({
  state, hostId, generation, activityVersion: 3, lastActivityAtMs: 0,
  ...(state === 'MIGRATING' ? { migration: { targetHostId: target, checkpointId: 'c-1' } } : {}),
  ...(state === 'LOST' ? { lostReason: 'host_lost_running' as const } : {}),
}));

const view: fc.Arbitrary<GroupRecordView> = fc.oneof(
  fc.constant({ kind: 'absent' as const }),
  fc.constant({ kind: 'unreadable' as const }),
  fc.record({ lifecycle, lostAtMs: fc.option(fc.integer({ min: 0, max: 2 * RETENTION }), { nil: undefined }) }).map((r) => ({ kind: 'present' as const, ...r })),
);

describe('decideHostCopy', () => {
  it('deletes only on positive proof, and never past the copy\'s generation', () => {
    fc.assert(fc.property(view, fc.constantFrom(...HOSTS), fc.integer({ min: 1, max: 6 }), fc.integer({ min: 0, max: 3 * RETENTION }), (record, hostId, generation, now) => {
      const v = decideHostCopy(record, { hostId, generation }, now, RETENTION);
      if (v.action !== 'delete') return;
      expect(v.upToGeneration).toBeLessThanOrEqual(generation);
      expect(record.kind).toBe('present');
      if (record.kind !== 'present') return;
      const lc = record.lifecycle;
      switch (v.reason) {
        case 'destroyed':
          expect(lc.state).toBe('DESTROYED');
          break;
        case 'lost_retention_expired':
          expect(lc.state).toBe('LOST');
          expect(record.lostAtMs).toBeDefined();
          expect(now).toBeGreaterThanOrEqual(record.lostAtMs! + RETENTION);
          break;
        case 'placed_elsewhere':
          expect(['RUNNING', 'STOPPING', 'STOPPED']).toContain(lc.state);
          expect(lc.hostId).not.toBe(hostId);
          expect(generation).toBeLessThanOrEqual(lc.generation);
          break;
      }
    }), { numRuns: PROPERTY_RUNS });
  });

  it('keeps the copy of the host the record names, whatever else is going on (an evacuation not finished included)', () => {
    fc.assert(fc.property(lifecycle, fc.integer({ min: 1, max: 6 }), (lc, generation) => {
      fc.pre(lc.state !== 'LOST' && lc.state !== 'DESTROYED');
      expect(decideHostCopy({ kind: 'present', lifecycle: lc }, { hostId: lc.hostId, generation }, 0, RETENTION).action).toBe('keep');
    }), { numRuns: PROPERTY_RUNS });
  });

  it('absence and unreadable records prove nothing; a migration in progress keeps every copy; LOST keeps layers (stopped) until retention ends', () => {
    const copy = { hostId: 'host-a', generation: 1 };
    expect(decideHostCopy({ kind: 'absent' }, copy, 0, RETENTION)).toEqual({ action: 'keep', reason: 'record_absent' });
    expect(decideHostCopy({ kind: 'unreadable' }, copy, 0, RETENTION)).toEqual({ action: 'keep', reason: 'record_unreadable' });
    const migrating: GroupLifecycle = { state: 'MIGRATING', hostId: 'host-b', generation: 2, activityVersion: 1, lastActivityAtMs: 0, migration: { targetHostId: 'host-c', checkpointId: 'c' } };
    expect(decideHostCopy({ kind: 'present', lifecycle: migrating }, copy, 0, RETENTION).action).toBe('keep');
    const lost: GroupLifecycle = { state: 'LOST', hostId: 'host-b', generation: 2, activityVersion: 1, lastActivityAtMs: 0, lostReason: 'host_lost_running' };
    expect(decideHostCopy({ kind: 'present', lifecycle: lost, lostAtMs: 1000 }, copy, 1000 + RETENTION - 1, RETENTION)).toEqual({ action: 'stop', reason: 'lost_retained' });
    expect(decideHostCopy({ kind: 'present', lifecycle: lost, lostAtMs: 1000 }, copy, 1000 + RETENTION, RETENTION)).toEqual({ action: 'delete', reason: 'lost_retention_expired', upToGeneration: 1 });
    // Retention 0: LOST layers stay until an operator destroys the group; a LOST record without a time stays too.
    expect(decideHostCopy({ kind: 'present', lifecycle: lost, lostAtMs: 0 }, copy, 10 * RETENTION, 0).action).toBe('stop');
    expect(decideHostCopy({ kind: 'present', lifecycle: lost }, copy, 10 * RETENTION, RETENTION).action).toBe('stop');
    // Settled elsewhere at an older generation than the copy: the copy may be newer than the record knows.
    const settled: GroupLifecycle = { state: 'STOPPED', hostId: 'host-b', generation: 2, activityVersion: 1, lastActivityAtMs: 0, stop: { clean: true } };
    expect(decideHostCopy({ kind: 'present', lifecycle: settled }, { hostId: 'host-a', generation: 3 }, 0, RETENTION)).toEqual({ action: 'keep', reason: 'newer_than_record' });
    expect(decideHostCopy({ kind: 'present', lifecycle: settled }, { hostId: 'host-a', generation: 2 }, 0, RETENTION)).toEqual({ action: 'delete', reason: 'placed_elsewhere', upToGeneration: 2 });
  });
});
