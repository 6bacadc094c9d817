// Content-defined chunking of a layer stream that is partly the previous checkpoint's layer (issue
// #17): an incremental capture knows which byte ranges of the new stream are copies of ranges of the
// old one (records of unchanged files) and which are probably copies (a re-read file's bytes at
// their old place: an append, an in-place edit), and reuses old chunks for them instead of
// chunking, hashing and uploading those bytes again.
// Why this is exact: FastCDC decides a cut from the bytes since the previous cut only (the gear hash
// is reset at every cut). So when the chunker has just cut (nothing pending) at the start of an old
// chunk, and the next bytes of the new stream are that old chunk's bytes, chunking them would cut at
// exactly the old chunk's end again: the old chunk can be emitted as it is. Everywhere else bytes
// are fed to the chunker. The result is, chunk for chunk, what chunking the whole new stream from
// its first byte gives (test/unit/layer/layer-assembler.test.ts checks exactly that), so a layer
// captured incrementally is the layer a full capture of the same tree gives, byte for byte.
// What is trusted: `copy` ranges are the old bytes by the caller's word (a file whose stat is
// unchanged); `predicted` bytes are the actual new bytes, and an old chunk is reused for them only
// after they hashed to its digest. Old bytes needed to feed the chunker (until it cuts on an old
// chunk boundary again) come from `readOld`, which must return verified chunks (the store does).
import { createHash } from 'node:crypto';
import type { ChunkRef } from '../../core/checkpoint-manifest.ts';
import type { FastCdcChunker } from './fastcdc.ts';

/** The previous layer's chunks with their start offsets (offsets[n] is the layer size). */
export interface OldLayer {
  readonly chunks: readonly ChunkRef[];
  readonly offsets: readonly number[];
}

export function oldLayerOf(chunks: readonly ChunkRef[]): OldLayer {
  const offsets = [0];
  for (const c of chunks) offsets.push(offsets[offsets.length - 1]! + c.size);
  return { chunks, offsets };
}

/** What the assembler produced, in stream order: a new chunk, or old chunk `index` reused. */
export type Emitted = { readonly kind: 'new'; readonly data: Buffer } | { readonly kind: 'old'; readonly index: number; readonly verified: boolean };

export interface AssemblerStats {
  /** Bytes emitted as reused old chunks without being read (copy ranges). */
  reusedBytes: number;
  /** Bytes emitted as reused old chunks after hashing them (predicted ranges). */
  verifiedBytes: number;
  /** Bytes of old chunks read to feed the chunker. */
  oldBytesRead: number;
  /** Predicted old chunks whose bytes differed (fed to the chunker instead). */
  mispredicted: number;
}

/** A predicted old chunk being collected: its index and the bytes seen so far. */
interface Candidate {
  readonly index: number;
  readonly size: number;
  filled: number;
  /** Old offset the next byte must come from to continue it. */
  nextOld: number;
}

export class LayerAssembler {
  readonly stats: AssemblerStats = { reusedBytes: 0, verifiedBytes: 0, oldBytesRead: 0, mispredicted: 0 };
  private pos = 0;
  private candidate: Candidate | null = null;
  private readonly buf: Buffer;
  private readonly recent = new Map<number, Buffer>();

  constructor(
    private readonly chunker: FastCdcChunker,
    private readonly old: OldLayer | undefined,
    private readonly readOld: (index: number) => Promise<Buffer>,
    private readonly emit: (e: Emitted) => Promise<void> | void,
    maxChunkBytes: number,
  ) {
    this.buf = Buffer.allocUnsafe(maxChunkBytes);
  }

  /** Bytes of the new stream so far. */
  get position(): number {
    return this.pos + (this.candidate?.filled ?? 0);
  }

  /** Bytes that exist only in the new stream. */
  async fresh(bytes: Buffer): Promise<void> {
    await this.abandon();
    await this.feed(bytes);
  }

  /** The next bytes of the new stream are the old stream's [from, to) (trusted, not read). */
  async copy(from: number, to: number): Promise<void> {
    await this.abandon();
    const old = this.old;
    if (old === undefined || from < 0 || to > old.offsets[old.offsets.length - 1]! || from > to) throw new RangeError(`copy [${from}, ${to}) outside the old layer`);
    let o = from;
    while (o < to) {
      if (this.chunker.pending === 0) {
        let k = this.startIndex(o);
        // Reuse whole old chunks whose end was a content-defined cut (not the stream's end).
        while (k >= 0 && k < old.chunks.length - 1 && old.offsets[k + 1]! <= to) {
          const size = old.chunks[k]!.size;
          await this.emit({ kind: 'old', index: k, verified: false });
          this.pos += size;
          this.stats.reusedBytes += size;
          o += size;
          k += 1;
        }
        if (o >= to) break;
      }
      // Feed old bytes up to the next old chunk boundary: if the chunker cuts exactly there, the
      // loop above takes over again.
      const k = this.containingIndex(o);
      const end = Math.min(to, old.offsets[k + 1]!);
      const data = await this.oldChunk(k);
      await this.feed(data.subarray(o - old.offsets[k]!, end - old.offsets[k]!));
      this.stats.oldBytesRead += end - o;
      o = end;
    }
  }

  /**
   * The next bytes of the new stream, which probably equal the old stream's bytes from `oldOffset`
   * on (an old chunk is reused only if they hash to its digest). `spanEnd`: the old offset where
   * the prediction ends; no reused chunk reaches past it.
   */
  async predicted(bytes: Buffer, oldOffset: number, spanEnd: number): Promise<void> {
    const old = this.old;
    if (old === undefined) return this.fresh(bytes);
    if (this.candidate !== null && this.candidate.nextOld !== oldOffset) await this.abandon();
    let i = 0;
    while (i < bytes.length) {
      const o = oldOffset + i;
      const c = this.candidate;
      if (c !== null) {
        const take = Math.min(c.size - c.filled, bytes.length - i);
        bytes.copy(this.buf, c.filled, i, i + take);
        c.filled += take;
        c.nextOld += take;
        i += take;
        if (c.filled === c.size) {
          this.candidate = null;
          await this.settle(c.index, this.buf.subarray(0, c.size));
        }
        continue;
      }
      if (this.chunker.pending === 0) {
        const k = this.startIndex(o);
        if (k >= 0 && k < old.chunks.length - 1 && old.offsets[k + 1]! <= spanEnd) {
          const size = old.chunks[k]!.size;
          if (bytes.length - i >= size) {
            // The whole old chunk's worth is here: hash it in place.
            await this.settle(k, bytes.subarray(i, i + size));
            i += size;
          } else this.candidate = { index: k, size, filled: 0, nextOld: o };
          continue;
        }
      }
      // Not aligned: feed up to the next old boundary (or the end of what is known of the old layer).
      let end = bytes.length;
      if (o < old.offsets[old.offsets.length - 1]!) end = Math.min(end, old.offsets[this.containingIndex(o) + 1]! - oldOffset);
      await this.feed(bytes.subarray(i, end));
      i = end;
    }
  }

  /** The end of the stream: the last chunk. */
  async finish(): Promise<void> {
    await this.abandon();
    const last = this.chunker.finish();
    if (last !== null) await this.emit({ kind: 'new', data: last });
  }

  /** Predicted bytes of a whole old chunk `index`: that chunk if they hash to it, fed to the chunker if not. */
  private async settle(index: number, data: Buffer): Promise<void> {
    const ref = this.old!.chunks[index]!;
    if (`sha256:${createHash('sha256').update(data).digest('hex')}` === ref.digest) {
      await this.emit({ kind: 'old', index, verified: true });
      this.pos += data.length;
      this.stats.verifiedBytes += data.length;
    } else {
      this.stats.mispredicted += 1;
      await this.feed(data);
    }
  }

  /** A candidate that cannot complete: its bytes are stream bytes like any others. */
  private async abandon(): Promise<void> {
    const c = this.candidate;
    if (c === null) return;
    this.candidate = null;
    await this.feed(this.buf.subarray(0, c.filled));
  }

  private async feed(bytes: Buffer): Promise<void> {
    if (bytes.length === 0) return;
    this.pos += bytes.length;
    for (const chunk of this.chunker.push(bytes)) await this.emit({ kind: 'new', data: chunk });
  }

  /** Index of the old chunk starting exactly at `o`, or -1. */
  private startIndex(o: number): number {
    const offsets = this.old!.offsets;
    let lo = 0;
    let hi = offsets.length - 2;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      const v = offsets[mid]!;
      if (v === o) return mid;
      if (v < o) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  /** Index of the old chunk holding old offset `o` (0 <= o < size). */
  private containingIndex(o: number): number {
    const offsets = this.old!.offsets;
    let lo = 0;
    let hi = offsets.length - 2;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      if (offsets[mid]! <= o) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  private async oldChunk(k: number): Promise<Buffer> {
    let data = this.recent.get(k);
    if (data === undefined) {
      data = await this.readOld(k);
      if (data.length !== this.old!.chunks[k]!.size) throw new RangeError(`old chunk ${k} has ${data.length} bytes, expected ${this.old!.chunks[k]!.size}`);
      if (this.recent.size >= 4) this.recent.delete(this.recent.keys().next().value!);
      this.recent.set(k, data);
    }
    return data;
  }
}
