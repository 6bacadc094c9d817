// heartbeat-bytes.ts reads a heartbeat without decoding all of it; the control plane trusts what it
// answers only because it agrees with a full decode. Properties over any heartbeat (and over any
// bytes at all): omitsContainers answers what the full decode says of containers_omitted, and
// splitInventory's parts decode to what the whole message decodes to.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ContainerInfo, ContainerState, Heartbeat, Inventory } from '../../../src/gen/sandboxfleet/v1/agent.ts';
import { omitsContainers, splitInventory } from '../../../src/wire/heartbeat-bytes.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const containerInfo: fc.Arbitrary<ContainerInfo> = fc.record({
  containerId: fc.string({ maxLength: 12 }), groupId: fc.string({ maxLength: 12 }), placementGeneration: fc.nat(1_000),
  running: fc.boolean(), startedAtUnixMs: fc.nat(),
}).map(({ running, ...c }) => ContainerInfo.fromPartial({ ...c, memberId: 'claude', state: running ? ContainerState.RUNNING : ContainerState.EXITED, writableLayerPresent: true }));

const heartbeat: fc.Arbitrary<Heartbeat> = fc.record({
  hostId: fc.string({ maxLength: 20 }), hostEpoch: fc.nat(), sequence: fc.nat(), sentAtUnixMs: fc.nat(),
  inventory: fc.option(fc.record({ containers: fc.array(containerInfo, { maxLength: 4 }), takenAtUnixMs: fc.nat() }), { nil: undefined }),
  capacity: fc.option(fc.record({ usedMembers: fc.nat(100), maxMembers: fc.nat(100) }), { nil: undefined }),
  dockerDataLost: fc.boolean(),
  containersDigest: fc.uint8Array({ maxLength: 32 }).map((b) => Buffer.from(b)),
  containersOmitted: fc.boolean(),
}).map((h) => Heartbeat.fromPartial(h));

const encode = (hb: Heartbeat): Uint8Array => Heartbeat.encode(hb).finish();
const concat = (...parts: Uint8Array[]): Uint8Array => Uint8Array.from(parts.flatMap((p) => [...p]));
const decodes = (data: Uint8Array): Heartbeat | undefined => {
  try {
    return Heartbeat.decode(data);
  } catch {
    return undefined;
  }
};

describe('omitsContainers', () => {
  it('equals the full decode on any heartbeat, and on two concatenated (the last field wins)', () => {
    fc.assert(fc.property(heartbeat, heartbeat, (a, b) => {
      expect(omitsContainers(encode(a))).toBe(a.containersOmitted);
      const merged = concat(encode(a), encode(b));
      expect(omitsContainers(merged)).toBe(Heartbeat.decode(merged).containersOmitted);
    }), { numRuns: PROPERTY_RUNS });
  });

  it('never throws on damaged bytes (truncated, a byte changed, random): the caller confirms a yes with the full decode', () => {
    // ts-proto's decoder reads some malformed nested messages differently from a flat scan (a tag 0
    // inside one ends it early), so on damaged bytes the two may disagree; decodeHeartbeat takes a
    // yes only when the full decode says containers_omitted too.
    const damaged = fc.oneof(
      heartbeat.chain((hb) => { const e = encode(hb); return fc.nat(e.length).map((n) => e.subarray(0, n)); }),
      heartbeat.chain((hb) => { const e = encode(hb); return fc.tuple(fc.nat(Math.max(0, e.length - 1)), fc.nat(255)).map(([i, v]) => { const c = Uint8Array.from(e); if (c.length > 0) c[i] = v; return c; }); }),
      fc.uint8Array({ maxLength: 64 }),
    );
    let agreed = 0;
    fc.assert(fc.property(damaged, (bytes) => {
      const says = omitsContainers(bytes);
      if (says === (decodes(bytes)?.containersOmitted ?? false)) agreed += 1;
    }), { numRuns: PROPERTY_RUNS });
    // Still, it is the same reading nearly always (a scan that said anything would not be this close).
    expect(agreed / PROPERTY_RUNS).toBeGreaterThan(0.9);
  });
});

describe('splitInventory', () => {
  it('has parts that decode to the whole message: the rest, the inventory without its entries, the entries', () => {
    fc.assert(fc.property(heartbeat, (hb) => {
      const data = encode(hb);
      const split = splitInventory(data);
      if (hb.inventory === undefined) return void expect(split).toBeUndefined();
      expect(split).toBeDefined();
      const rebuilt = Heartbeat.decode(split!.rest);
      rebuilt.inventory = { ...Inventory.decode(split!.inventoryRest), containers: Inventory.decode(split!.containers).containers };
      expect(rebuilt).toEqual(Heartbeat.decode(data));
    }), { numRuns: PROPERTY_RUNS });
  });
});
