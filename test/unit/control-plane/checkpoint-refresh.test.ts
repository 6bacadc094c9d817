// Which checkpoints the retention pass retakes (checkpointsDueForRefresh, R-G4/R-G6): the usable
// checkpoint of a cleanly STOPPED group that is not moving, once older than the refresh age; oldest
// first, bounded; and the refresh period that names the new checkpoint.
import { describe, expect, it } from 'vitest';
import type { GroupLifecycle } from '../../../src/core/index.ts';
import { checkpointsDueForRefresh } from '../../../src/control-plane/retention.ts';
import { checkpointIdFor } from '../../../src/control-plane/group-ops.ts';

const NOW = 1_800_000_000_000;
const H = 3_600_000;
const REFRESH_AFTER = 12 * H;
const READY = new Set(['host-a']);

function group(groupId: string, lc: Partial<GroupLifecycle> = {}, latestCheckpointId: string | null = `c-${groupId}`, evacuating = false) {
  const lifecycle: GroupLifecycle = { state: 'STOPPED', hostId: 'host-a', generation: 1, activityVersion: 4, lastActivityAtMs: NOW - 30 * H, stop: { clean: true }, ...lc };
  return { groupId, lifecycle, ...(latestCheckpointId !== null ? { latestCheckpointId } : {}), ...(evacuating ? { evacuation: { source: 'operator_drain' } as never } : {}) };
}
const ckpt = (groupId: string, ageMs: number, activityVersion = 4) => ({ groupId, checkpointId: `c-${groupId}`, activityVersion, createdAtMs: NOW - ageMs });

describe('checkpointsDueForRefresh', () => {
  it('picks clean-stopped groups whose usable checkpoint is older than the refresh age, oldest first, at most `limit`', () => {
    const groups = [group('young'), group('old'), group('older'), group('oldest')];
    const checkpoints = [ckpt('young', 11 * H), ckpt('old', 13 * H), ckpt('older', 20 * H), ckpt('oldest', 23 * H)];
    const due = checkpointsDueForRefresh(groups, READY, checkpoints, NOW, REFRESH_AFTER, 2);
    expect(due.map((d) => d.groupId)).toEqual(['oldest', 'older']);
    expect(due[0]).toEqual({ groupId: 'oldest', ageMs: 23 * H, period: Math.floor(NOW / REFRESH_AFTER) });
    expect(checkpointsDueForRefresh(groups, READY, checkpoints, NOW, REFRESH_AFTER, 10).map((d) => d.groupId)).toEqual(['oldest', 'older', 'old']);
  });

  it('leaves alone what a refresh cannot or must not retake', () => {
    const old = 30 * H;
    const groups = [
      group('running', { state: 'RUNNING', stop: undefined }),
      group('unclean', { stop: { clean: false, findings: [] } }),
      group('migrating', { state: 'MIGRATING', migration: { targetHostId: 'host-b', checkpointId: 'c-migrating' } }),
      group('evacuating', {}, 'c-evacuating', true),
      group('lost', { state: 'LOST', lostReason: 'no_checkpoint' }),
      group('none', {}, null),
      group('outdated'), // its checkpoint is of an older activity version: not a capture of this state
    ];
    const checkpoints = [...groups.filter((g) => g.groupId !== 'outdated').map((g) => ckpt(g.groupId, old)), ckpt('outdated', old, 3)];
    expect(checkpointsDueForRefresh(groups, READY, checkpoints, NOW, REFRESH_AFTER, 10)).toEqual([]);
  });

  it('asks only READY hosts (a silent one would hold the refresh for a command timeout)', () => {
    expect(checkpointsDueForRefresh([group('g')], new Set(['host-b']), [ckpt('g', 100 * H)], NOW, REFRESH_AFTER, 10)).toEqual([]);
  });

  it('is off at refresh age 0; a refresh gets its own deterministic checkpoint id per period', () => {
    expect(checkpointsDueForRefresh([group('g')], READY, [ckpt('g', 100 * H)], NOW, 0, 10)).toEqual([]);
    const base = checkpointIdFor('g', 1, 4);
    expect(checkpointIdFor('g', 1, 4, 7)).toBe(checkpointIdFor('g', 1, 4, 7));
    expect(new Set([base, checkpointIdFor('g', 1, 4, 7), checkpointIdFor('g', 1, 4, 8)]).size).toBe(3);
  });
});
