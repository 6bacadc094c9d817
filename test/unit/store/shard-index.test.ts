// The shard of a key must never change for a given count: data written under one build is read by
// the next. Golden values pin the function (FNV-1a 32-bit; "a" and "foobar" are the published
// test vectors 0xe40c292c and 0xbf9cf968), properties pin its contract.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { MAX_SHARDS, shardIndex } from '../../../src/store/sharded-kv-repository.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';


describe('shardIndex', () => {
  it('is FNV-1a 32-bit mod count (golden values)', () => {
    expect(shardIndex('a', 2 ** 32)).toBe(0xe40c292c);
    expect(shardIndex('foobar', 2 ** 32)).toBe(0xbf9cf968);
    expect(shardIndex('', 2 ** 32)).toBe(0x811c9dc5);
    expect(['g-0123456789abcdef01234567', 'a', 'foobar'].map((k) => shardIndex(k, 8))).toEqual([1, 4, 0]);
  });

  it('always names a shard in range, and the same one every time', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 256 }), fc.integer({ min: 1, max: MAX_SHARDS }), (key, count) => {
        const i = shardIndex(key, count);
        expect(Number.isInteger(i) && i >= 0 && i < count).toBe(true);
        expect(shardIndex(key, count)).toBe(i);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('spreads group ids evenly over 8 shards', () => {
    const counts = new Array<number>(8).fill(0);
    for (let i = 0; i < 8000; i++) counts[shardIndex(`g-${i.toString(16).padStart(24, '0')}`, 8)]! += 1;
    for (const c of counts) expect(c).toBeGreaterThan(800);
  });
});
