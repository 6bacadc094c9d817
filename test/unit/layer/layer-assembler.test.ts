// The incremental chunker (host-agent/layer/layer-assembler.ts, issue #17): whatever mix of copied,
// predicted and fresh bytes makes up a new stream, the chunks it emits (new ones, and old ones it
// reused) are exactly the chunks FastCDC gives for the whole new stream: same boundaries, same
// bytes. Mispredicted bytes are never reused; copies reuse old chunks without reading them.
import { createHash, randomBytes } from 'node:crypto';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { ChunkRef } from '../../../src/core/checkpoint-manifest.ts';
import { LayerAssembler, oldLayerOf, type Emitted } from '../../../src/host-agent/layer/layer-assembler.ts';
import { FastCdcChunker, type ChunkerOptions } from '../../../src/host-agent/layer/fastcdc.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const OPTS: ChunkerOptions = { minSize: 64, avgSize: 256, maxSize: 1024 };
const sha = (b: Uint8Array): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;

function chunkAll(stream: Buffer): Buffer[] {
  const c = new FastCdcChunker(OPTS);
  const out = c.push(stream).map((b) => Buffer.from(b));
  const last = c.finish();
  if (last) out.push(Buffer.from(last));
  return out;
}

/** One piece of the new stream, as the capture would describe it. */
type Piece = { kind: 'copy'; from: number; to: number } | { kind: 'fresh'; bytes: Buffer } | { kind: 'predicted'; bytes: Buffer; oldOffset: number; spanEnd: number };

async function assemble(oldStream: Buffer, pieces: Piece[]): Promise<{ chunks: Buffer[]; emitted: Emitted[]; reads: number; assembler: LayerAssembler }> {
  const oldChunks = chunkAll(oldStream);
  const refs: ChunkRef[] = oldChunks.map((b) => ({ digest: sha(b), size: b.length }));
  const old = oldLayerOf(refs);
  const emitted: Emitted[] = [];
  const chunks: Buffer[] = [];
  let reads = 0;
  const assembler = new LayerAssembler(
    new FastCdcChunker(OPTS),
    old,
    async (k) => {
      reads += 1;
      return oldChunks[k]!;
    },
    (e) => {
      emitted.push(e);
      chunks.push(e.kind === 'new' ? Buffer.from(e.data) : oldChunks[e.index]!);
    },
    OPTS.maxSize,
  );
  for (const p of pieces) {
    if (p.kind === 'copy') await assembler.copy(p.from, p.to);
    else if (p.kind === 'fresh') await assembler.fresh(p.bytes);
    else await assembler.predicted(p.bytes, p.oldOffset, p.spanEnd);
  }
  await assembler.finish();
  return { chunks, emitted, reads, assembler };
}

const materialize = (oldStream: Buffer, pieces: Piece[]): Buffer => Buffer.concat(pieces.map((p) => (p.kind === 'copy' ? oldStream.subarray(p.from, p.to) : p.bytes)));

/** Bytes that repeat often enough for the gear hash to find cut points in them, like text does. */
const textish = (n: number, seed: number): Buffer => {
  const words = ['alpha ', 'beta ', 'gamma\n', '{"role":"user"}', 'delta ', '0123456789'];
  let s = '';
  let x = seed;
  while (s.length < n) {
    x = (x * 1103515245 + 12345) & 0x7fffffff;
    s += words[x % words.length]!;
  }
  return Buffer.from(s.slice(0, n));
};

describe('LayerAssembler', () => {
  it('a new stream made of old ranges, fresh bytes and (right or wrong) predictions is chunked exactly as a whole', async () => {
    type Raw = { kind: 'copy'; a: number; b: number } | { kind: 'fresh'; bytes: Uint8Array } | { kind: 'pred'; at: number; len: number; flips: [number, number][] };
    const rawArb: fc.Arbitrary<Raw> = fc.oneof(
      fc.record({ kind: fc.constant('copy' as const), a: fc.nat(6000), b: fc.nat(6000) }),
      fc.record({ kind: fc.constant('fresh' as const), bytes: fc.uint8Array({ maxLength: 600 }) }),
      // A prediction: the old bytes at some offset, possibly with a few bytes changed.
      fc.record({ kind: fc.constant('pred' as const), at: fc.nat(6000), len: fc.nat(2000), flips: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 255 })), { maxLength: 2 }) }),
    );
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 0, max: 6000 }), fc.integer(), fc.array(rawArb, { maxLength: 12 }), async (oldLen, seed, raw) => {
        const oldStream = textish(oldLen, seed);
        // Clamp the generated pieces to the old stream and materialise the predicted ones.
        const pieces: Piece[] = raw.map((p): Piece => {
          if (p.kind === 'copy') return { kind: 'copy', from: Math.min(p.a, p.b, oldLen), to: Math.min(Math.max(p.a, p.b), oldLen) };
          if (p.kind === 'fresh') return { kind: 'fresh', bytes: Buffer.from(p.bytes) };
          const from = Math.min(p.at, oldLen);
          const to = Math.min(oldLen, from + p.len);
          const bytes = Buffer.from(oldStream.subarray(from, to));
          for (const [at, x] of p.flips) {
            if (bytes.length > 0) bytes[at % bytes.length] = bytes[at % bytes.length]! ^ x;
          }
          return { kind: 'predicted', bytes, oldOffset: from, spanEnd: to };
        });
        const expected = chunkAll(materialize(oldStream, pieces));
        const { chunks, assembler } = await assemble(oldStream, pieces);
        expect(chunks.map((c) => c.length)).toEqual(expected.map((c) => c.length));
        expect(Buffer.concat(chunks).equals(Buffer.concat(expected))).toBe(true);
        expect(assembler.position).toBe(materialize(oldStream, pieces).length);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  it('reuses the old chunks of an unchanged stretch without reading them, and verifies predicted ones', async () => {
    const oldStream = textish(200_000, 7);
    const oldChunks = chunkAll(oldStream);
    expect(oldChunks.length).toBeGreaterThan(100);
    // An append: everything copied, then new bytes.
    const appended = await assemble(oldStream, [{ kind: 'copy', from: 0, to: oldStream.length }, { kind: 'fresh', bytes: randomBytes(3000) }]);
    const reused = appended.emitted.filter((e) => e.kind === 'old');
    expect(reused.length).toBe(oldChunks.length - 1); // all but the old last one (cut by the end, not the content)
    expect(reused.every((e) => e.kind === 'old' && !e.verified)).toBe(true);
    expect(appended.reads).toBe(1); // only the old last chunk, to feed the chunker
    // The same bytes as a prediction: reused after hashing, nothing read from the old layer.
    const predicted = await assemble(oldStream, [{ kind: 'predicted', bytes: oldStream, oldOffset: 0, spanEnd: oldStream.length }]);
    expect(predicted.emitted.filter((e) => e.kind === 'old' && e.verified).length).toBe(oldChunks.length - 1);
    expect(predicted.reads).toBe(0);
    // A changed byte in the middle: that chunk (and what follows until the cuts meet again) is new.
    const edited = Buffer.from(oldStream);
    edited[100_000] = edited[100_000]! ^ 0x55;
    const mis = await assemble(oldStream, [{ kind: 'predicted', bytes: edited, oldOffset: 0, spanEnd: oldStream.length }]);
    expect(mis.assembler.stats.mispredicted).toBeGreaterThanOrEqual(1);
    expect(Buffer.concat(mis.chunks).equals(edited)).toBe(true);
    const newBytes = mis.emitted.filter((e) => e.kind === 'new').reduce((n, e) => n + (e.kind === 'new' ? e.data.length : 0), 0);
    expect(newBytes).toBeLessThan(10 * OPTS.maxSize);
  });
});
