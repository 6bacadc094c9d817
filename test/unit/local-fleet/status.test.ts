// The local fleet's status page and table (R-I8): what a newcomer watches during a drain. Built
// from real record shapes (core createGroup / newMemberSession); everything from the store is
// escaped, LOST and moving states stand out, the newest event comes first.
import { describe, expect, it } from 'vitest';
import { createGroup, newMemberSession } from '../../../src/core/index.ts';
import type { GroupRecord, HeartbeatRecord, HostRecord } from '../../../src/control-plane/records.ts';
import { renderStatusPage, renderStatusTable, type StatusSnapshot } from '../../../cmd/local-fleet/status.ts';

const NOW = Date.UTC(2026, 10, 30, 12, 0, 0);

function host(hostId: string, state: string, mismatches: string[] = []): HostRecord {
  return { hostId, lifecycle: { state, epoch: 3 }, attestation: { mismatches } } as unknown as HostRecord;
}

function group(groupId: string, hostId: string, state: string, lostReason?: string): GroupRecord {
  const lc = { ...createGroup(hostId, NOW - 60_000), state, ...(lostReason ? { lostReason } : {}) };
  return { groupId, conversationId: `conv <${groupId}>`, lifecycle: lc, members: [{ session: newMemberSession('m1', 'claude_code') }], starts: 1, stops: 0, createdAtMs: NOW, updatedAtMs: NOW } as unknown as GroupRecord;
}

const snapshot: StatusSnapshot = {
  nowMs: NOW,
  hosts: [host('host-a', 'DRAINING'), host('host-b', 'READY'), host('host-c', 'UNATTESTED', ['agent sha <x> not allowed'])],
  heartbeats: [{ hostId: 'host-a', epoch: 3, receivedAtMs: NOW - 1_500 } as unknown as HeartbeatRecord],
  groups: [group('g-2', 'host-b', 'RUNNING'), group('g-1', 'host-a', 'MIGRATING'), group('g-3', 'host-a', 'LOST', 'unclean_stop')],
  events: [
    { seq: 7, event: { id: 'e7', timeMs: NOW - 2_000, actor: 'cp', subjectKind: 'group', subjectId: 'g-3', type: 'group_lost', toState: 'LOST', reason: 'unclean_stop' } },
    { seq: 8, event: { id: 'e8', timeMs: NOW - 1_000, actor: 'cp', subjectKind: 'group', subjectId: 'g-1', type: 'migration_started', toState: 'MIGRATING', reason: '<script>' } },
  ],
};

describe('local fleet status', () => {
  it('renders the terminal table: heartbeat age, live groups per host, attestation', () => {
    const text = renderStatusTable(snapshot);
    expect(text).toContain('host-a      DRAINING     3      1.5s       1');
    expect(text).toContain('host-b      READY        3      -          1');
    expect(text).toContain('agent sha <x> not allowed');
    expect(text).toContain('groups: RUNNING=1 MIGRATING=1 LOST=1');
  });

  it('renders the page: escaped, refreshing, states marked, newest event first', () => {
    const html = renderStatusPage(snapshot, 3);
    expect(html).toContain('<meta http-equiv="refresh" content="3">');
    expect(html).not.toContain('<script>');
    expect(html).toContain('&lt;script&gt;');
    expect(html).toContain('conv &lt;g-1&gt;');
    expect(html).toMatch(/<tr class="bad"><td>g-3<\/td>.*<td>unclean_stop<\/td><\/tr>/);
    expect(html).toMatch(/<tr class="moving"><td>host-a<\/td>/);
    expect(html.indexOf('<td>8</td>')).toBeLessThan(html.indexOf('<td>7</td>'));
    // Groups sorted by id.
    expect(html.indexOf('<td>g-1</td>')).toBeLessThan(html.indexOf('<td>g-2</td>'));
  });

  it('says "none" for empty tables', () => {
    const html = renderStatusPage({ ...snapshot, groups: [], events: [] });
    expect(html.match(/<td colspan="\d">none<\/td>/g)).toHaveLength(2);
  });
});
