// The control plane's idle-stop work rule (idle-stop.ts idleWork) and the spot evacuation's order
// and turn wait (evacuation-policy.ts), and sandboxctl's protection column (cli/commands.ts), on
// records and views built here.
import { describe, expect, it } from 'vitest';
import { spotSaveOrder, turnWaitFor } from '../../../src/control-plane/evacuation-policy.ts';
import { checkpointRetryDelayMs, idleWork } from '../../../src/control-plane/idle-stop.ts';
import type { Evacuation, GroupRecord } from '../../../src/control-plane/records.ts';
import { unprotected } from '../../../src/cli/commands.ts';
import { Group, GroupState, StopOutcome } from '../../../src/gen/sandboxfleet/v1/common.ts';

const settings = { idleStopAfterMs: 600_000 as const, idleStopStartGraceMs: 30_000, stopGraceMs: 10_000 };

function record(over: Partial<GroupRecord> & { state?: GroupRecord['lifecycle']['state']; clean?: boolean } = {}): GroupRecord {
  const { state = 'RUNNING', clean, ...rest } = over;
  return {
    groupId: 'g-1', conversationId: 'c-1',
    lifecycle: { state, hostId: 'host-a', generation: 1, activityVersion: 4, lastActivityAtMs: 1_000, ...(clean !== undefined ? { stop: clean ? { clean: true } : { clean: false, findings: [] } } : {}) },
    members: [{ session: { memberId: 'm1', cli: 'claude_code', phase: 'RETAINED', completedTurns: 1, savedLocator: 'loc-1' as never } }],
    starts: 1, stops: 0, lastTurnCompletedAtMs: 1_000, createdAtMs: 0, updatedAtMs: 1_000, ...rest,
  } as GroupRecord;
}

describe('idleWork', () => {
  it('parks a running group until its idle deadline, then stops it; its own setting wins', () => {
    expect(idleWork(record(), false, false, settings, 2_000)).toEqual({ kind: 'wait', atMs: 601_000 });
    expect(idleWork(record(), false, false, settings, 601_000)).toEqual({ kind: 'stop' });
    // 0: the completing call stops it; the queue steps in after the stop grace + 10 s (a completion cut off).
    expect(idleWork(record({ idleStopAfterMs: 0 }), false, false, settings, 1_000)).toEqual({ kind: 'wait', atMs: 21_000 });
    expect(idleWork(record({ idleStopAfterMs: 0 }), false, false, settings, 21_000)).toEqual({ kind: 'stop' });
    expect(idleWork(record({ idleStopAfterMs: 'never' }), false, false, settings, 1e12)).toEqual({ kind: 'none' });
  });

  it('leaves evacuating and terminal groups to the controller', () => {
    const ev: Evacuation = { kind: 'planned', source: 'spot_preemption', sourceHostId: 'host-a', startedAtMs: 0, deadlineMs: 1, attempts: 0, triedHostIds: [] };
    expect(idleWork(record({ evacuation: ev }), false, false, settings, 1e12)).toEqual({ kind: 'none' });
    expect(idleWork(record({ state: 'LOST' }), false, false, settings, 1e12)).toEqual({ kind: 'none' });
  });

  it('finishes a stop a crash left STOPPING only after grace + margin; checkpoints its own clean stops not yet covered, other stops after a while', () => {
    const stopping = record({ state: 'STOPPING', updatedAtMs: 10_000 });
    expect(idleWork(stopping, false, false, settings, 20_000)).toEqual({ kind: 'wait', atMs: 35_000 });
    expect(idleWork(stopping, false, false, settings, 35_000)).toEqual({ kind: 'finish_stop' });
    const stopped = record({ state: 'STOPPED', clean: true });
    expect(idleWork(stopped, false, true, settings, 2_000)).toEqual({ kind: 'checkpoint' });
    expect(idleWork(stopped, true, true, settings, 2_000)).toEqual({ kind: 'none' });
    // Someone else's clean stop (StopGroup, a completion with idle 0) takes its own checkpoint first.
    expect(idleWork(stopped, false, false, settings, 2_000)).toEqual({ kind: 'wait', atMs: 31_000 });
    expect(idleWork(stopped, false, false, settings, 31_000)).toEqual({ kind: 'checkpoint' });
    expect(idleWork(record({ state: 'STOPPED', clean: false }), false, true, settings, 2_000)).toEqual({ kind: 'none' });
  });
});

describe('spot evacuation rules', () => {
  it('saves the least recently active first (ties by id)', () => {
    const order = spotSaveOrder([{ groupId: 'b', lastActivityAtMs: 5 }, { groupId: 'c', lastActivityAtMs: 1 }, { groupId: 'a', lastActivityAtMs: 5 }]);
    expect(order.map((g) => g.groupId)).toEqual(['c', 'a', 'b']);
  });

  it('waits for a turn in flight at most a third of the notice under a spot notice, turnWaitMs otherwise', () => {
    const cfg = { turnWaitMs: 60_000, spotNoticeMs: 30_000 };
    const ev = (source: Evacuation['source'], kind: Evacuation['kind'] = 'planned'): Evacuation => ({ kind, source, sourceHostId: 'h', startedAtMs: 0, deadlineMs: 1, attempts: 0, triedHostIds: [] });
    expect(turnWaitFor(ev('spot_preemption'), cfg)).toBe(10_000);
    expect(turnWaitFor(ev('operator_drain'), cfg)).toBe(60_000);
    expect(turnWaitFor(undefined, cfg)).toBe(60_000);
  });
});

describe('sandboxctl PROTECTED', () => {
  const g = (over: Partial<Group>): Group => Group.fromPartial({ groupId: 'g', state: GroupState.RUNNING, activityVersion: 3, lastActivityAtUnixMs: 10, createdAtUnixMs: 1, ...over });
  it('a running group is unprotected; a clean stop with a checkpoint, a migration and terminal groups are not', () => {
    expect(unprotected(g({}))).toBe(true);
    expect(unprotected(g({ state: GroupState.STOPPED, stopOutcome: StopOutcome.CLEAN, latestCheckpointId: 'c-1' }))).toBe(false);
    expect(unprotected(g({ state: GroupState.STOPPED, stopOutcome: StopOutcome.CLEAN, latestCheckpointId: '' }))).toBe(true);
    expect(unprotected(g({ state: GroupState.STOPPED, stopOutcome: StopOutcome.UNCLEAN, latestCheckpointId: 'c-1' }))).toBe(true);
    expect(unprotected(g({ state: GroupState.MIGRATING }))).toBe(false);
    expect(unprotected(g({ state: GroupState.LOST }))).toBe(false);
  });
});

describe('checkpoint retries of a clean stop', () => {
  it('back off from 30 s, doubling, to at most 15 minutes, however many failures', () => {
    expect([1, 2, 3, 4, 5].map(checkpointRetryDelayMs)).toEqual([30_000, 60_000, 120_000, 240_000, 480_000]);
    expect(checkpointRetryDelayMs(6)).toBe(900_000);
    expect(checkpointRetryDelayMs(1_000_000)).toBe(900_000);
    expect(checkpointRetryDelayMs(0)).toBe(30_000);
  });
});
