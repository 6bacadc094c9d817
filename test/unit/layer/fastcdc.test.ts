// Content-defined chunking: bounds, determinism across input splits, and locality of edits
// (the property behind "a second checkpoint after a 1 MiB append stores ≤ 5%", R-G3).
import { createCipheriv, createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker } from '../../../src/host-agent/layer/fastcdc.ts';

function chunk(data: Buffer, step: number): Buffer[] {
  const c = new FastCdcChunker();
  const out: Buffer[] = [];
  for (let i = 0; i < data.length; i += step) out.push(...c.push(data.subarray(i, i + step)).map((b) => Buffer.from(b)));
  const last = c.finish();
  if (last) out.push(Buffer.from(last));
  return out;
}

/**
 * Deterministic pseudo-random bytes (AES-256-CTR keystream of a fixed key): the locality bound
 * below depends on where forced max-size cuts fall, so random data each run made it flaky.
 */
function pseudoRandom(size: number, seed: number): Buffer {
  const iv = Buffer.alloc(16);
  iv.writeUInt32BE(seed);
  return createCipheriv('aes-256-ctr', Buffer.alloc(32, 7), iv).update(Buffer.alloc(size));
}

const digests = (chunks: Buffer[]): string[] => chunks.map((c) => createHash('sha256').update(c).digest('hex'));

describe('FastCdcChunker', () => {
  const data = pseudoRandom(24 * 1024 * 1024, 1);

  it('keeps every chunk within min..max (except the last) and loses no byte', () => {
    const chunks = chunk(data, 64 * 1024);
    expect(Buffer.concat(chunks).equals(data)).toBe(true);
    for (const c of chunks.slice(0, -1)) {
      expect(c.length).toBeGreaterThanOrEqual(DEFAULT_CHUNKER_OPTIONS.minSize);
      expect(c.length).toBeLessThanOrEqual(DEFAULT_CHUNKER_OPTIONS.maxSize);
    }
    const avg = data.length / chunks.length;
    expect(avg).toBeGreaterThan(256 * 1024);
    expect(avg).toBeLessThan(900 * 1024);
  });

  it('hands out chunks the caller may keep: later chunks never overwrite earlier ones (slabs)', () => {
    const c = new FastCdcChunker();
    const kept: Buffer[] = [];
    for (let i = 0; i < data.length; i += 100_000) kept.push(...c.push(data.subarray(i, i + 100_000)));
    const last = c.finish();
    if (last) kept.push(last);
    expect(Buffer.concat(kept).equals(data)).toBe(true);
    expect(digests(kept)).toEqual(digests(chunk(data, 64 * 1024)));
  });

  it('cuts at the same places whatever the input split', () => {
    const a = digests(chunk(data, 64 * 1024));
    expect(digests(chunk(data, 1000))).toEqual(a);
    expect(digests(chunk(data, data.length))).toEqual(a);
  });

  it('confines an insertion to nearby chunks', () => {
    const before = chunk(data, 65536);
    const inserted = Buffer.concat([data.subarray(0, 10_000_000), pseudoRandom(1024 * 1024, 2), data.subarray(10_000_000)]);
    const after = chunk(inserted, 65536);
    const known = new Set(digests(before));
    const newBytes = after.filter((c) => !known.has(digests([c])[0]!)).reduce((n, c) => n + c.length, 0);
    expect(newBytes).toBeLessThan(1024 * 1024 + 3 * DEFAULT_CHUNKER_OPTIONS.maxSize);
  });

  it('cuts where it always did: the cut points are part of the chunk format (dedup with older checkpoints, capture indexes)', () => {
    // 6 MiB of AES-CTR keystream then 2 MiB of repeated JSONL, pushed in 100,000-byte pieces.
    const input = Buffer.concat([pseudoRandom(6 * 1024 * 1024, 9), Buffer.alloc(2 * 1024 * 1024, '{"role":"user","text":"hello"}\n')]);
    expect(chunk(input, 100_000).map((c) => c.length)).toEqual([611802, 764568, 826541, 226384, 603009, 997607, 577442, 621653, 290252, 1024000, 1024000, 821350]);
  });

  it('places each chunk at an address aligned as its stream offset (word-wise copies into shared slabs)', () => {
    const c = new FastCdcChunker(DEFAULT_CHUNKER_OPTIONS, (size) => Buffer.from(new SharedArrayBuffer(size)));
    const chunks: Buffer[] = [];
    for (let i = 0; i < data.length; i += 65536) chunks.push(...c.push(data.subarray(i, i + 65536)));
    chunks.push(c.finish()!);
    let offset = 0;
    for (const ch of chunks) {
      expect((((ch.byteOffset - offset) % 8) + 8) % 8).toBe(0);
      offset += ch.length;
    }
    expect(offset).toBe(data.length);
  });

  it('refuses inconsistent sizes', () => {
    expect(() => new FastCdcChunker({ minSize: 10, avgSize: 5, maxSize: 20 })).toThrow(RangeError);
  });
});
