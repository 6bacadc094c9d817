// The metric catalogue (R-I3) as alerts need it (R-I4): every LOST reason the code can emit exists
// at 0 from the start (increase() cannot see a series that first appears at 1), derived from the
// reason types so the list cannot drift; and a deposed leader drops what only the leader keeps.
import { describe, expect, it } from 'vitest';
import { LOSS_REASONS, LOST_SESSION_REASONS, MEMBER_LOSS_REASONS } from '../../../src/core/loss.ts';
import { LossReasonSchema } from '../../../src/control-plane/records.ts';
import { FleetMetrics } from '../../../src/observability/metrics.ts';

async function series(m: FleetMetrics, name: string): Promise<{ labels: Partial<Record<string, string | number>>; value: number }[]> {
  return (await m.registry.getSingleMetric(name)?.get())?.values ?? [];
}

describe('LOST sessions counter', () => {
  it('pre-creates every group and member loss reason at 0, each once', async () => {
    const values = await series(new FleetMetrics(), 'sandboxfleet_lost_sessions_total');
    const reasons = values.map((v) => String(v.labels.reason));
    // Member-level reasons the runner backend counts when one member is found LOST at its next begin.
    for (const r of ['turn_unconfirmed', 'writable_layer_missing', 'locator_missing', 'container_missing', 'session_files_missing']) expect(reasons).toContain(r);
    expect(new Set(reasons)).toEqual(new Set([...LOSS_REASONS, ...MEMBER_LOSS_REASONS]));
    expect(reasons).toHaveLength(new Set(reasons).size);
    expect(reasons).toEqual([...LOST_SESSION_REASONS]);
    for (const v of values) expect(v.value).toBe(0);
  });

  it('group loss reasons are exactly the ones group records can store', () => {
    expect(new Set(LossReasonSchema.options)).toEqual(new Set(LOSS_REASONS));
  });

  it('only counts a known reason (checked by the compiler)', () => {
    const m = new FleetMetrics();
    // @ts-expect-error: a reason outside LOST_SESSION_REASONS would be a series that was never pre-created.
    m.lostSessions.inc({ reason: 'not_a_reason' }, 0);
    m.lostSessions.inc({ reason: 'turn_unconfirmed' });
    m.lostSessions.inc({ reason: 'restore_failed' }, 2);
  });
});

describe('leader-only gauges', () => {
  it('a deposed leader drops host and group counts and checkpoint exposure (heartbeat ages come from every replica\'s read model at scrape)', async () => {
    const m = new FleetMetrics();
    m.hosts.set({ state: 'DEAD' }, 1);
    m.groups.set({ state: 'STOPPED' }, 3);
    m.checkpointAge.set(70_000);
    m.groupsWithoutCheckpoint.set(2);
    m.checkpointMaxAge.set(86_400);
    m.leadershipLost();
    expect(await series(m, 'sandboxfleet_hosts')).toEqual([]);
    expect(await series(m, 'sandboxfleet_groups')).toEqual([]);
    expect((await series(m, 'sandboxfleet_checkpoint_oldest_age_seconds')).map((v) => v.value)).toEqual([0]);
    expect((await series(m, 'sandboxfleet_stopped_groups_without_checkpoint')).map((v) => v.value)).toEqual([0]);
    // Configuration, not leader state: stays.
    expect((await series(m, 'sandboxfleet_checkpoint_max_age_seconds')).map((v) => v.value)).toEqual([86_400]);
  });

  it('heartbeat ages are read from their source at each scrape: a host the source no longer names has no series', async () => {
    const m = new FleetMetrics();
    let ages = [{ hostId: 'host-a', ageSeconds: 1 }, { hostId: 'host-b', ageSeconds: 2 }];
    m.setHeartbeatAgeSource(() => ages);
    expect((await series(m, 'sandboxfleet_host_heartbeat_age_seconds')).map((v) => [v.labels.host, v.value])).toEqual([['host-a', 1], ['host-b', 2]]);
    ages = [{ hostId: 'host-b', ageSeconds: 7 }];
    expect((await series(m, 'sandboxfleet_host_heartbeat_age_seconds')).map((v) => [v.labels.host, v.value])).toEqual([['host-b', 7]]);
  });
});
