// The spot tally's reading of a group change (spot-evacuation.ts spotOutcomeOf): a group of a noticed
// host counts as saved the moment the read model shows it stopped cleanly with a checkpoint of its
// state, moving or moved off the host, whoever did the work; LOST counts as lost; anything else is
// still pending. Records and the checkpoint index are built here.
import { describe, expect, it } from 'vitest';
import { spotOutcomeOf } from '../../../src/control-plane/spot-evacuation.ts';
import type { CheckpointRecord, GroupRecord } from '../../../src/control-plane/records.ts';
import { Keys } from '../../../src/control-plane/state.ts';

function record(over: { state?: GroupRecord['lifecycle']['state']; clean?: boolean; hostId?: string; latest?: string; activityVersion?: number } = {}): GroupRecord {
  const { state = 'RUNNING', clean, hostId = 'host-a', latest, activityVersion = 4 } = over;
  return {
    groupId: 'g-1', conversationId: 'c-1',
    lifecycle: { state, hostId, generation: 1, activityVersion, lastActivityAtMs: 1_000, ...(clean !== undefined ? { stop: clean ? { clean: true } : { clean: false, findings: [] } } : {}) },
    members: [], starts: 1, stops: 1, createdAtMs: 0, updatedAtMs: 1_000, ...(latest !== undefined ? { latestCheckpointId: latest } : {}),
  } as unknown as GroupRecord;
}

const index = (entries: Record<string, number>) => ({
  checkpoint: (key: string) => {
    const id = Object.keys(entries).find((c) => Keys.checkpoint('g-1', c) === key);
    return id === undefined ? undefined : ({ activityVersion: entries[id] } as unknown as CheckpointRecord);
  },
});

describe('spotOutcomeOf', () => {
  it('saved: a checkpoint that arrives with a clean stop, one the index shows for this state, a migration, another host', () => {
    const stopped = record({ state: 'STOPPED', clean: true });
    expect(spotOutcomeOf(stopped, record({ state: 'STOPPED', clean: true, latest: 'c-2' }), 'host-a', index({}))).toBe('saved');
    expect(spotOutcomeOf(record({ state: 'STOPPED', clean: true, latest: 'c-2' }), record({ state: 'STOPPED', clean: true, latest: 'c-2' }), 'host-a', index({ 'c-2': 4 }))).toBe('saved');
    expect(spotOutcomeOf(undefined, record({ state: 'MIGRATING' }), 'host-a', index({}))).toBe('saved');
    expect(spotOutcomeOf(undefined, record({ state: 'STOPPED', clean: true, hostId: 'host-b' }), 'host-a', index({}))).toBe('saved');
  });

  it('pending: running, stopping, stopped unclean, or clean with only an older checkpoint', () => {
    expect(spotOutcomeOf(undefined, record(), 'host-a', index({}))).toBeUndefined();
    expect(spotOutcomeOf(undefined, record({ state: 'STOPPING' }), 'host-a', index({}))).toBeUndefined();
    expect(spotOutcomeOf(undefined, record({ state: 'STOPPED', clean: false, latest: 'c-1' }), 'host-a', index({ 'c-1': 4 }))).toBeUndefined();
    const old = record({ state: 'STOPPED', clean: true, latest: 'c-1' });
    expect(spotOutcomeOf(old, old, 'host-a', index({ 'c-1': 3 }))).toBeUndefined();
  });

  it('lost: LOST; a DESTROYED group is neither', () => {
    expect(spotOutcomeOf(undefined, record({ state: 'LOST' }), 'host-a', index({}))).toBe('lost');
    expect(spotOutcomeOf(undefined, record({ state: 'DESTROYED' }), 'host-a', index({}))).toBeUndefined();
  });
});
