// What an agent's "going away" report means (R-H5): lost Docker data is an unplanned loss (DEAD at
// once), spot/preemption a spot_preemption drain, any other notice a reclaim_notice drain; the audit
// reason names the removal source first.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { DOCKER_DATA_LOST_NOTICE, hostEventForNotice, transitionHost } from '../../../src/core/index.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';


describe('hostEventForNotice (R-H5)', () => {
  it('turns a Docker data loss report into DEAD, not a drain', () => {
    const d = hostEventForNotice(DOCKER_DATA_LOST_NOTICE);
    expect(d.event).toEqual({ type: 'declared_dead', source: 'docker_data_lost' });
    expect(d.why).toMatch(/^docker_data_lost: /);
    // From READY straight to DEAD: no planned departure in between.
    const next = transitionHost({ state: 'READY', epoch: 3 }, d.event);
    expect(next).toEqual({ ok: true, value: { state: 'DEAD', epoch: 3, goingAway: 'docker_data_lost' } });
  });

  it('maps spot and preemption to spot_preemption, everything else to reclaim_notice', () => {
    for (const s of ['spot', 'preemption', 'spot_preemption']) {
      expect(hostEventForNotice(s)).toEqual({ event: { type: 'drain_requested', source: 'spot_preemption' }, why: `spot_preemption: reclaim notice "${s}"` });
    }
    expect(hostEventForNotice('maintenance')).toEqual({ event: { type: 'drain_requested', source: 'reclaim_notice' }, why: 'reclaim_notice: reclaim notice "maintenance"' });
    expect(hostEventForNotice('').why).toBe('reclaim_notice: reclaim notice "unspecified"');
  });

  it('only the data-loss source is unplanned, and the reason stays bounded (property)', () => {
    fc.assert(fc.property(fc.string({ maxLength: 300 }), (s) => {
      const { event, why } = hostEventForNotice(s);
      expect(event.type === 'declared_dead').toBe(s === DOCKER_DATA_LOST_NOTICE);
      expect(why.length).toBeLessThanOrEqual(128);
    }), { numRuns: PROPERTY_RUNS });
  });
});
