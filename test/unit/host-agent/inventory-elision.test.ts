// InventoryElision (which heartbeats carry the container entries): a property over any run of
// beats — epochs, container lists that change or not, failed publishes — checking what a control
// plane relies on when it reuses entries it holds by their digest.
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ContainerInfo, ContainerState, Inventory } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { InventoryElision, containersDigest } from '../../../src/host-agent/inventory-elision.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const container = (i: number, running: boolean): ContainerInfo => ContainerInfo.fromPartial({
  containerId: `c${i}`, groupId: `g${i}`, memberId: 'claude', placementGeneration: 1,
  state: running ? ContainerState.RUNNING : ContainerState.EXITED, writableLayerPresent: true, startedAtUnixMs: 1_700_000_000_000 + i,
});

type Step = { kind: 'beat'; epoch: number; containers: ContainerInfo[] } | { kind: 'publish_failed' };

const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 8, arbitrary: fc.record({ epoch: fc.integer({ min: 1, max: 3 }), running: fc.array(fc.boolean(), { maxLength: 3 }) }).map(({ epoch, running }) => ({ kind: 'beat' as const, epoch, containers: running.map((r, i) => container(i, r)) })) },
  { weight: 1, arbitrary: fc.constant({ kind: 'publish_failed' as const }) },
);

describe('InventoryElision', () => {
  it('leaves out only entries identical to the last ones it sent in this epoch, never more than fullEvery - 1 beats in a row', () => {
    fc.assert(fc.property(fc.array(step, { maxLength: 60 }), fc.integer({ min: 1, max: 6 }), (steps, fullEvery) => {
      const elision = new InventoryElision(fullEvery);
      let lastSent: { epoch: number; digest: Buffer } | undefined;
      let omittedInARow = 0;
      let failedBefore = false;
      for (const s of steps) {
        if (s.kind === 'publish_failed') {
          elision.forget();
          failedBefore = true;
          continue;
        }
        const inventory = Inventory.fromPartial({ containers: s.containers, takenAtUnixMs: 5 });
        const out = elision.next(s.epoch, inventory);
        const digest = containersDigest(s.containers);
        // The digest always names the entries as they are now, whether they are sent or not.
        expect(out.containersDigest.equals(digest)).toBe(true);
        if (out.containersOmitted) {
          expect(out.inventory.containers).toEqual([]);
          expect(out.inventory.takenAtUnixMs).toBe(5);
          expect(lastSent?.epoch).toBe(s.epoch);
          expect(lastSent?.digest.equals(digest)).toBe(true);
          expect(failedBefore).toBe(false);
          omittedInARow += 1;
          expect(omittedInARow).toBeLessThan(fullEvery);
        } else {
          expect(out.inventory.containers).toEqual(s.containers);
          lastSent = { epoch: s.epoch, digest };
          omittedInARow = 0;
        }
        failedBefore = false;
      }
    }), { numRuns: PROPERTY_RUNS });
  });

  it('leaves out unchanged entries between full beats (the usual case)', () => {
    const elision = new InventoryElision(3);
    const inventory = Inventory.fromPartial({ containers: [container(1, true), container(2, false)] });
    const omitted = Array.from({ length: 7 }, () => elision.next(1, inventory).containersOmitted);
    expect(omitted).toEqual([false, true, true, false, true, true, false]);
  });

  it('names the entries by the SHA-256 of their encoding, as the control plane computes it from the beat', () => {
    const containers = [container(1, true)];
    const entries = Inventory.encode({ containers, takenAtUnixMs: 0, turnProcesses: [] }).finish();
    // Field 1, length-delimited: the entries and nothing else.
    expect(entries[0]).toBe((1 << 3) | 2);
    expect(containersDigest(containers).toString('hex')).toBe(createHash('sha256').update(entries).digest('hex'));
    expect(containersDigest([]).toString('hex')).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
  });
});
