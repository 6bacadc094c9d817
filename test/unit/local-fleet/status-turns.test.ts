// The status page's "Latest turn ends" (issue 13): the turn evidence stored in the group records,
// newest first across groups, bounded, escaped, refused and unconfirmed turns marked.
import { describe, expect, it } from 'vitest';
import { createGroup, newMemberSession } from '../../../src/core/index.ts';
import type { GroupRecord, TurnEvidenceRecord } from '../../../src/control-plane/records.ts';
import { renderStatusPage, STATUS_TURNS, type StatusSnapshot } from '../../../cmd/local-fleet/status.ts';

const NOW = Date.UTC(2026, 11, 1, 12, 0, 0);

function turn(n: number, over: Partial<TurnEvidenceRecord> = {}): TurnEvidenceRecord {
  return {
    turnId: `t-${String(n).padStart(4, '0')}`, contextState: 'LIVE', generation: 2, beganAtMs: NOW + n * 1_000, durationMs: 500,
    kind: 'result', flags: 'esctl', observedLocator: 'sess-1', outcome: 'completed', ...over,
  };
}

function group(groupId: string, turns: TurnEvidenceRecord[]): GroupRecord {
  return {
    groupId, conversationId: `conv-${groupId}`, lifecycle: { ...createGroup('host-a', NOW), state: 'RUNNING' },
    members: [{ session: newMemberSession('m1', 'claude_code'), turns }], starts: 1, stops: 0, createdAtMs: NOW, updatedAtMs: NOW,
  } as unknown as GroupRecord;
}

const base: StatusSnapshot = { nowMs: NOW, hosts: [], heartbeats: [], groups: [], events: [] };

describe('status page: latest turn ends', () => {
  it('lists the newest turn ends across groups, newest first, with the evidence and the decision', () => {
    const html = renderStatusPage({
      ...base,
      groups: [
        group('g-a', [turn(1), turn(3, { observedLocator: 'sess-<x>', outcome: 'locator_mismatch', refusal: 'locator_mismatch' })]),
        group('g-b', [turn(2, { kind: 'disconnect', flags: 'ctlx', outcome: 'unconfirmed', exitCode: 137 })]),
      ],
    });
    const section = html.slice(html.indexOf('<h2>Latest turn ends</h2>'), html.indexOf('<h2>Latest events</h2>'));
    expect(section.indexOf('t-0003')).toBeLessThan(section.indexOf('t-0002'));
    expect(section.indexOf('t-0002')).toBeLessThan(section.indexOf('t-0001'));
    expect(section).toMatch(/<tr class="bad">.*g-a\/m1.*t-0003.*LIVE \(gen 2\).*result ended ok.*sess-&lt;x&gt;.*refused locator_mismatch/);
    expect(section).toMatch(/<tr class="bad">.*g-b\/m1.*disconnect not ended.*exited 137 \(unconfirmed\).*unconfirmed/);
    expect(section).toMatch(/<tr class="">.*t-0001.*completed<\/td><\/tr>/);
    expect(section).not.toContain('<x>');
  });

  it(`shows at most ${STATUS_TURNS}, and says so when there is none`, () => {
    const many = Array.from({ length: 8 }, (_, i) => i);
    const html = renderStatusPage({ ...base, groups: [0, 1, 2].map((g) => group(`g-${g}`, many.map((i) => turn(g * 10 + i)))) });
    expect(html.match(/<td>t-\d{4}<\/td>/g)).toHaveLength(STATUS_TURNS);
    expect(html).toContain('<td>t-0027</td>');
    expect(html).not.toContain('<td>t-0000</td>');
    expect(renderStatusPage(base)).toContain('No turn end recorded yet.');
  });
});
