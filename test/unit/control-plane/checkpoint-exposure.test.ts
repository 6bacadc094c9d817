// R-G4 exposure reported by the retention pass (sandboxfleet_checkpoint_oldest_age_seconds and
// sandboxfleet_stopped_groups_without_checkpoint): per cleanly STOPPED group, the checkpoint an
// unplanned host loss would restore from; the oldest age wins, and a group without a usable one is
// counted apart instead of being given an age.
import { describe, expect, it } from 'vitest';
import type { GroupLifecycle } from '../../../src/core/index.ts';
import { checkpointExposure } from '../../../src/control-plane/retention.ts';

const NOW = 1_800_000_000_000;
const H = 3_600_000;

function group(groupId: string, lc: Partial<GroupLifecycle>, latestCheckpointId?: string) {
  const lifecycle: GroupLifecycle = { state: 'STOPPED', hostId: 'host-a', generation: 1, activityVersion: 4, lastActivityAtMs: NOW - 30 * H, stop: { clean: true }, ...lc };
  return { groupId, lifecycle, ...(latestCheckpointId !== undefined ? { latestCheckpointId } : {}) };
}

const ckpt = (groupId: string, checkpointId: string, ageMs: number, activityVersion = 4) => ({ groupId, checkpointId, activityVersion, createdAtMs: NOW - ageMs });

describe('checkpointExposure', () => {
  it('is the oldest among the clean-stopped groups’ latest checkpoints, not the oldest checkpoint overall', () => {
    const groups = [group('g1', {}, 'c1-new'), group('g2', {}, 'c2')];
    const checkpoints = [ckpt('g1', 'c1-old', 40 * H, 3), ckpt('g1', 'c1-new', 2 * H), ckpt('g2', 'c2', 20 * H)];
    expect(checkpointExposure(groups, checkpoints, NOW)).toEqual({ oldestAgeMs: 20 * H, withoutCheckpoint: 0 });
  });

  it('ignores groups a checkpoint cannot save: running, unclean, migrating, lost, destroyed', () => {
    const old = 100 * H;
    const groups = [
      group('run', { state: 'RUNNING', stop: undefined }, 'c'),
      group('unclean', { stop: { clean: false, findings: [] } }, 'c'),
      group('mig', { state: 'MIGRATING', migration: { targetHostId: 'host-b', checkpointId: 'c' } }, 'c'),
      group('lost', { state: 'LOST', lostReason: 'no_checkpoint' }, 'c'),
      group('gone', { state: 'DESTROYED' }, 'c'),
    ];
    const checkpoints = groups.map((g) => ckpt(g.groupId, 'c', old));
    expect(checkpointExposure(groups, checkpoints, NOW)).toEqual({ oldestAgeMs: 0, withoutCheckpoint: 0 });
  });

  it('counts a clean-stopped group without a checkpoint of its current state apart, and gives it no age', () => {
    const groups = [
      group('none', {}),
      group('index-gone', {}, 'missing'),
      group('older-state', {}, 'c-v3'),
      group('before-activity', { lastActivityAtMs: NOW - H }, 'c-early'),
      group('ok', {}, 'c-ok'),
    ];
    const checkpoints = [ckpt('older-state', 'c-v3', H, 3), ckpt('before-activity', 'c-early', 2 * H), ckpt('ok', 'c-ok', 5 * H)];
    expect(checkpointExposure(groups, checkpoints, NOW)).toEqual({ oldestAgeMs: 5 * H, withoutCheckpoint: 4 });
  });

  it('keeps reporting a checkpoint past the maximum age (it is stale, not missing)', () => {
    expect(checkpointExposure([group('g', { lastActivityAtMs: NOW - 60 * H }, 'c')], [ckpt('g', 'c', 50 * H)], NOW)).toEqual({ oldestAgeMs: 50 * H, withoutCheckpoint: 0 });
  });

  it('is 0 with no stopped group', () => {
    expect(checkpointExposure([], [], NOW)).toEqual({ oldestAgeMs: 0, withoutCheckpoint: 0 });
  });
});
