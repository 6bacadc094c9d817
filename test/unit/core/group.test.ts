// Group lifecycle (R-G1), clean stop (R-G2), checkpoint usability (R-G4), retention (R-G7), loss (R-G6).
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  assessCheckpoint, createGroup, decideAfterRestoreFailure, decideOnHostLoss, decideStopCleanliness, selectCheckpointsToDelete,
  transitionGroup, unwrap,
  type CheckpointSummary, type GroupEvent, type GroupLifecycle, type MemberStopEvidence, type RetainedCheckpoint, type StopEvidence,
} from '../../../src/core/index.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const IMG = `sha256:${'1'.repeat(64)}`;
const IMG2 = `sha256:${'2'.repeat(64)}`;

const exited = (memberId: string, patch: Partial<MemberStopEvidence> = {}): MemberStopEvidence => ({
  memberId, turnInFlight: false, sigtermAtMs: 1_000, exitedAtMs: 1_500, exitCode: 0, killed: false, containerExists: true, writableLayerExists: true, ...patch,
});
const stop = (members: MemberStopEvidence[], memberIds = members.map((m) => m.memberId)): StopEvidence => ({ graceMs: 10_000, memberIds, members });

describe('clean stop (R-G2)', () => {
  it('clean only when every member exited by itself within the grace with a recorded status, layers intact', () => {
    expect(decideStopCleanliness(stop([exited('a'), exited('b', { exitCode: 143 })]))).toEqual({ clean: true });
  });

  it.each([
    [{ turnInFlight: true }, 'turn_in_flight'],
    [{ sigtermAtMs: undefined }, 'sigterm_not_sent'],
    [{ exitedAtMs: undefined }, 'not_exited'],
    [{ killed: true }, 'killed'],
    [{ exitedAtMs: 11_001 }, 'exit_after_grace'],
    [{ exitCode: undefined }, 'exit_status_missing'],
    [{ containerExists: false }, 'container_missing'],
    [{ writableLayerExists: false }, 'writable_layer_missing'],
  ] as const)('unclean with %o → %s', (patch, reason) => {
    const v = decideStopCleanliness(stop([exited('a'), exited('b', patch)]));
    expect(v.clean).toBe(false);
    if (!v.clean) expect(v.findings).toContainEqual({ memberId: 'b', reason });
  });

  it('missing member evidence or no members is unclean', () => {
    const v = decideStopCleanliness(stop([exited('a')], ['a', 'b']));
    expect(v).toEqual({ clean: false, findings: [{ memberId: 'b', reason: 'member_evidence_missing' }] });
    expect(decideStopCleanliness(stop([])).clean).toBe(false);
  });
});

describe('group lifecycle (R-G1)', () => {
  const apply = (g: GroupLifecycle, events: GroupEvent[], now = 10) => events.reduce((s, e) => unwrap(transitionGroup(s, e, now)), g);
  const usable = { usable: true as const, checkpointId: 'cp1' };

  it('runs, stops clean, migrates to a new host with a new generation', () => {
    const g = apply(createGroup('h1', 0), [{ type: 'started' }, { type: 'turn_completed' }, { type: 'stop_requested' }, { type: 'stopped', verdict: { clean: true } }]);
    expect(g).toMatchObject({ state: 'STOPPED', hostId: 'h1', generation: 1, activityVersion: 3, stop: { clean: true } });
    const m = apply(g, [{ type: 'migration_started', targetHostId: 'h2', assessment: usable }]);
    expect(m).toMatchObject({ state: 'MIGRATING', migration: { targetHostId: 'h2', checkpointId: 'cp1' } });
    const done = apply(m, [{ type: 'migration_completed', targetHostId: 'h2' }]);
    expect(done).toEqual({ state: 'STOPPED', hostId: 'h2', generation: 2, activityVersion: 3, lastActivityAtMs: 10, stop: { clean: true } });
  });

  it('an unclean group resumes on the same host but is never migrated', () => {
    const g = apply(createGroup('h1', 0), [{ type: 'started' }, { type: 'stopped', verdict: { clean: false, findings: [{ memberId: 'a', reason: 'killed' }] } }]);
    const r = transitionGroup(g, { type: 'migration_started', targetHostId: 'h2', assessment: usable }, 20);
    expect(!r.ok && r.error.reason).toBe('unclean_stop');
    expect(apply(g, [{ type: 'started' }]).state).toBe('RUNNING');
  });

  it('refuses migration with an unusable checkpoint, naming the checkpoint reason', () => {
    const g = apply(createGroup('h1', 0), [{ type: 'started' }, { type: 'stop_requested' }, { type: 'stopped', verdict: { clean: true } }]);
    const r = transitionGroup(g, { type: 'migration_started', targetHostId: 'h2', assessment: { usable: false, reason: 'stale_checkpoint', reasons: ['stale_checkpoint'] } }, 20);
    expect(r.ok).toBe(false);
    if (!r.ok) expect([r.error.reason, r.error.details.checkpointReason]).toEqual(['checkpoint_not_usable', 'stale_checkpoint']);
  });

  it('LOST keeps its first reason; DESTROYED is terminal and idempotent', () => {
    const lost = apply(createGroup('h1', 0), [{ type: 'started' }, { type: 'lost', reason: 'host_lost_running' }, { type: 'lost', reason: 'restore_failed' }]);
    expect(lost).toMatchObject({ state: 'LOST', lostReason: 'host_lost_running' });
    const d = apply(lost, [{ type: 'destroyed' }, { type: 'destroyed' }]);
    expect(d.state).toBe('DESTROYED');
    expect(transitionGroup(d, { type: 'started' }, 1).ok).toBe(false);
  });
});

describe('checkpoint usability (R-G4)', () => {
  const group = { groupId: 'g1', activityVersion: 7, lastActivityAtMs: 1_000, memberIds: ['a', 'b'] };
  const target = { imageDigests: new Set([IMG]), bridgeVersion: 4 };
  const cp: CheckpointSummary = {
    checkpointId: 'cp1', groupId: 'g1', placementGeneration: 1, createdAtMs: 2_000, activityVersion: 7, baseImageDigest: IMG, bridgeVersion: 4,
    members: [{ memberId: 'a', blobPresent: true, digestVerified: true }, { memberId: 'b', blobPresent: true, digestVerified: true }],
  };

  it('usable only when fresh, verified and compatible', () => {
    expect(assessCheckpoint(group, cp, target, 5_000, 60_000)).toEqual({ usable: true, checkpointId: 'cp1' });
  });

  it.each([
    ['none', undefined, 'no_checkpoint'],
    ['activity since', { ...cp, activityVersion: 6 }, 'stale_checkpoint'],
    ['taken before last activity', { ...cp, createdAtMs: 999 }, 'stale_checkpoint'],
    ['too old', { ...cp, createdAtMs: 1_000 - 0 }, 'stale_checkpoint'],
    ['blob missing', { ...cp, members: [cp.members[0]!, { memberId: 'b', blobPresent: false, digestVerified: false }] }, 'checkpoint_corrupt'],
    ['digest unverified', { ...cp, members: [cp.members[0]!, { memberId: 'b', blobPresent: true, digestVerified: false }] }, 'checkpoint_corrupt'],
    ['other group', { ...cp, groupId: 'g2' }, 'checkpoint_mismatch'],
    ['member set differs', { ...cp, members: [cp.members[0]!] }, 'checkpoint_mismatch'],
    ['base image', { ...cp, baseImageDigest: IMG2 }, 'base_image_mismatch'],
    ['bridge', { ...cp, bridgeVersion: 3 }, 'bridge_version_mismatch'],
  ] as const)('%s → %s', (_name, summary, reason) => {
    const now = _name === 'too old' ? 100_000 : 5_000;
    const a = assessCheckpoint(group, summary, target, now, 60_000);
    expect(a.usable).toBe(false);
    if (!a.usable) expect(a.reasons).toContain(reason);
  });

  it('property: usable implies every R-G4 condition holds', () => {
    fc.assert(fc.property(
      fc.integer({ min: 5, max: 9 }), fc.integer({ min: 0, max: 3_000 }), fc.boolean(), fc.boolean(), fc.constantFrom(IMG, IMG2), fc.constantFrom(3, 4), fc.integer({ min: 0, max: 100_000 }),
      (version, createdAtMs, present, verified, image, bridge, now) => {
        const summary = { ...cp, activityVersion: version, createdAtMs, baseImageDigest: image, bridgeVersion: bridge, members: cp.members.map((m) => ({ ...m, blobPresent: present, digestVerified: verified })) };
        const a = assessCheckpoint(group, summary, target, now, 60_000);
        const expectUsable = version === 7 && createdAtMs >= 1_000 && now - createdAtMs <= 60_000 && present && verified && image === IMG && bridge === 4;
        expect(a.usable).toBe(expectUsable);
        if (!a.usable) expect(a.reasons[0]).toBe(a.reason);
      },
    ), { numRuns: PROPERTY_RUNS });
  });
});

describe('checkpoint retention (R-G7)', () => {
  const c = (checkpointId: string, groupId: string, createdAtMs: number, valid = true): RetainedCheckpoint => ({ checkpointId, groupId, createdAtMs, valid });

  it('keeps the newest N valid per group, deletes the rest and everything of destroyed groups, never pinned ones', () => {
    const all = [c('a1', 'A', 1), c('a2', 'A', 2), c('a3', 'A', 3, false), c('b1', 'B', 1), c('d1', 'D', 9), c('d2', 'D', 10)];
    expect(selectCheckpointsToDelete(all, 1, new Set(['D'])).sort()).toEqual(['a1', 'a3', 'd1', 'd2']);
    expect(selectCheckpointsToDelete(all, 2, new Set(['D']), new Set(['d2'])).sort()).toEqual(['a3', 'd1']);
    expect(() => selectCheckpointsToDelete(all, 0, new Set())).toThrow(/keepN/);
  });

  it('property: every live group with a valid checkpoint keeps its newest valid one', () => {
    const arb = fc.array(fc.record({ checkpointId: fc.uuid(), groupId: fc.constantFrom('A', 'B', 'C'), createdAtMs: fc.integer({ min: 0, max: 50 }), valid: fc.boolean() }), { maxLength: 20 });
    fc.assert(fc.property(arb, fc.integer({ min: 1, max: 3 }), fc.subarray(['A', 'B', 'C']), (cps, keepN, destroyed) => {
      const del = new Set(selectCheckpointsToDelete(cps, keepN, new Set(destroyed)));
      for (const g of ['A', 'B', 'C']) {
        const valid = cps.filter((x) => x.groupId === g && x.valid);
        const kept = valid.filter((x) => !del.has(x.checkpointId));
        if (destroyed.includes(g)) expect(cps.filter((x) => x.groupId === g).every((x) => del.has(x.checkpointId))).toBe(true);
        else if (valid.length > 0) {
          const newest = Math.max(...valid.map((x) => x.createdAtMs));
          expect(kept.some((x) => x.createdAtMs === newest)).toBe(true);
          expect(kept.length).toBe(Math.min(keepN, valid.length));
        }
      }
    }), { numRuns: PROPERTY_RUNS });
  });
});

describe('host loss (R-G6)', () => {
  const budget = { attempts: 0, maxAttempts: 3 };
  const ok = { usable: true as const, checkpointId: 'cp' };

  it('restores only a clean STOPPED group with a usable checkpoint, within the budget', () => {
    expect(decideOnHostLoss({ state: 'STOPPED', stop: { clean: true } }, ok, budget)).toEqual({ action: 'restore', checkpointId: 'cp', attempt: 1 });
    expect(decideOnHostLoss({ state: 'MIGRATING', stop: { clean: true } }, ok, budget).action).toBe('restore');
    expect(decideOnHostLoss({ state: 'STOPPED', stop: { clean: true } }, ok, { attempts: 3, maxAttempts: 3 })).toEqual({ action: 'lost', reason: 'restore_failed' });
  });

  it.each([
    [{ state: 'RUNNING' }, ok, 'host_lost_running'],
    [{ state: 'STOPPING' }, ok, 'host_lost_running'],
    [{ state: 'PENDING' }, ok, 'host_lost_running'],
    [{ state: 'STOPPED', stop: { clean: false, findings: [] } }, ok, 'unclean_stop'],
    [{ state: 'STOPPED', stop: { clean: true } }, undefined, 'no_checkpoint'],
    [{ state: 'STOPPED', stop: { clean: true } }, { usable: false, reason: 'checkpoint_corrupt', reasons: ['checkpoint_corrupt'] }, 'checkpoint_corrupt'],
  ] as const)('%o → LOST %s', (group, assessment, reason) => {
    expect(decideOnHostLoss(group as Pick<GroupLifecycle, 'state' | 'stop'>, assessment as never, budget)).toEqual({ action: 'lost', reason });
  });

  it('terminal groups need nothing; restore failures retry within the bound, then LOST', () => {
    expect(decideOnHostLoss({ state: 'LOST' }, ok, budget)).toEqual({ action: 'none' });
    expect(decideOnHostLoss({ state: 'DESTROYED' }, ok, budget)).toEqual({ action: 'none' });
    expect(decideAfterRestoreFailure({ attempts: 1, maxAttempts: 3 })).toEqual({ action: 'retry', attempt: 2 });
    expect(decideAfterRestoreFailure({ attempts: 3, maxAttempts: 3 })).toEqual({ action: 'lost', reason: 'restore_failed' });
  });
});
