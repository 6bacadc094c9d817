// Moves one writable layer between an overlay upper dir and the chunk store (R-G3, R-G5):
// capture (capture-store.ts: only what changed is read) → content-defined chunks → pipelined,
// deduplicated uploads; and ordered, verified chunk fetches → restore in two passes (restore.ts):
// verifyLayer validates everything, keeping chunks in memory within a budget and writing the rest to
// the host's chunk cache; extractVerifiedLayer extracts from both; release() then caches the kept
// ones too, off the restore's critical path. The manifest (written last, by the caller) carries the
// returned LayerRef.
import { chunkListDigest, type ChunkRef, type LayerDigestKind, type LayerRef } from '../../core/checkpoint-manifest.ts';
import { DEFAULT_LAYER_LIMITS, type LayerLimits } from '../../core/layer-rules.ts';
import { ChunkStoreError, DEFAULT_READ_IN_FLIGHT, type ChunkStore } from '../../store/chunk-store.ts';
import { fetchChunksInWorker } from '../../store/chunk-fetch-worker.ts';
import type { WorkerConnection } from '../../store/nats-auth.ts';
import { claimBuffer, holdsWholeBuffer } from '../../store/sole-buffers.ts';
import { LayerTransferError, restoreFailureOf } from './errors.ts';
import type { ChunkCache } from './chunk-cache.ts';
import { workerPassesLending, type ChunkLender } from './layer-workers.ts';
import { checkDeclaredSize, extractIntoTarget, type EarlyStaging, type ExpectedLayer, type LayerPasses, type RestoredLayer, type ScannedLayer } from './restore.ts';
import { digestOff } from './sha256-pool.ts';

export { storeLayer, type CaptureReport, type StoreLayerOptions, type StoredLayer } from './capture-store.ts';

export interface FetchLayerOptions {
  readonly limits?: LayerLimits;
  /** Chunk fetches outstanding at once. */
  readonly maxInFlight?: number;
  readonly tarPath?: string;
  /** Verify digests on worker threads (default false; see StoreLayerOptions.offThreadHash). */
  readonly offThreadHash?: boolean;
  /**
   * Fetch and verify chunks on a worker thread with its own NATS connection to `servers`, so the
   * fetch overlaps parsing and extraction on this thread (measured: bench/checkpoint).
   */
  readonly fetchWorker?: WorkerConnection;
  /** Fetch workers in parallel, each every n-th chunk (default: chunk-fetch-worker.ts's). */
  readonly fetchWorkers?: number;
  /**
   * The host's chunk cache (chunk-cache.ts): pass 1 reads what it holds and stores what it fetched,
   * pass 2 reads it back. Without one, pass 2 fetches the layer from the store again.
   */
  readonly cache?: ChunkCache | undefined;
  /** Where the two passes run; default a layer worker thread (layer-workers.ts). */
  readonly passes?: LayerPasses;
  /**
   * What `layer.digest` covers: the chunk list (default; manifests of schema version 2, what
   * storeLayer writes) or the whole tar (version 1). Take it from the manifest: layerDigestKind.
   */
  readonly digestOf?: LayerDigestKind;
  /**
   * Memory pass 1 may keep chunks in for pass 2 (shared by all layers of one restore): a kept chunk
   * is extracted from the very bytes pass 1 verified, not read from the cache and hashed again.
   */
  readonly retain?: RetainBudget | undefined;
}

/** Bytes of chunks a restore may hold in memory between its two passes. */
export class RetainBudget {
  private used = 0;
  constructor(readonly maxBytes: number) {}

  take(bytes: number): boolean {
    if (this.used + bytes > this.maxBytes) return false;
    this.used += bytes;
    return true;
  }

  give(bytes: number): void {
    this.used -= bytes;
  }

  get usedBytes(): number {
    return this.used;
  }
}

/** The layer as pass 1 must find it; a version-2 digest is checked against the chunk list first. */
function expectedOf(layer: LayerRef, options: FetchLayerOptions): ExpectedLayer {
  const digestOf = options.digestOf ?? 'chunk-list';
  if (digestOf === 'chunk-list' && chunkListDigest(layer.chunks) !== layer.digest) {
    throw new LayerTransferError('layer_digest_mismatch', `the chunk list hashes to ${chunkListDigest(layer.chunks)}, expected ${layer.digest}`);
  }
  return { digest: layer.digest, size: layer.size, digestOf };
}

/** A layer pass 1 accepted: its chunks stay pinned in the cache until release(). */
export interface VerifiedLayer {
  readonly layer: LayerRef;
  readonly scanned: ScannedLayer;
  /** Pass 1's bytes read from the host's chunk cache and fetched from the store. */
  readonly cachedBytes: number;
  readonly fetchedBytes: number;
  /** Bytes pass 1 kept in memory for pass 2 (within FetchLayerOptions.retain), and the chunks by index. */
  readonly retainedBytes: number;
  readonly retained: KeptChunks;
  /**
   * After pass 2, or when it will not run: write the kept chunks pass 1 fetched to the host's cache
   * (deferred: see layerChunks; not with `cache: false`), then free them and the cache pins.
   * Resolves when that is done; never rejects (the cache is an optimisation). Callers that answer
   * first need not wait. The kept chunks are no longer used for an extraction after this call.
   */
  release(how?: { readonly cache?: boolean }): Promise<void>;
  /** Bytes release() would write to the cache (kept chunks pass 1 fetched). */
  readonly uncachedBytes: number;
}

interface ChunkCounts {
  cachedBytes: number;
  fetchedBytes: number;
  /** Chunks this pass added to the cache. */
  readonly stored: ChunkRef[];
}

/**
 * Chunks pass 1 keeps for pass 2, by index: buffers of their own, moved to the layer worker in pass
 * 2 (their last use), except those still `uncached` (fetched, their cache write deferred to
 * release()), which the layer worker hands back. A chunk lent to the layer worker is `out` until it
 * is back (passesOf); one the worker did not hand back (its pass failed) is simply not kept.
 */
export interface KeptChunks {
  readonly chunks: (Buffer | undefined)[];
  readonly uncached: Set<number>;
  readonly out: Set<number>;
  bytes: number;
}

/**
 * The passes a pass over `kept`'s layer runs on: the caller's (`lent` false: every kept chunk the
 * pass gets is a copy), or by default layer worker passes that borrow the kept chunks that are
 * `out` and hand them back into `kept` (no copies).
 */
function passesOf(options: FetchLayerOptions, kept: KeptChunks): { passes: LayerPasses; lent: boolean } {
  if (options.passes !== undefined) return { passes: options.passes, lent: false };
  const lender: ChunkLender = {
    wants: (index) => kept.out.has(index),
    back: (index, data) => {
      if (!kept.out.delete(index)) return;
      claimBuffer(data); // moved back: this thread's alone again
      kept.chunks[index] = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    },
  };
  return { passes: workerPassesLending(lender), lent: true };
}

/** A buffer this code alone holds (store reads may be views into the NATS client's receive buffer); `copy`: always a new one. */
function own(data: Buffer, copy = false): Buffer {
  if (!copy && holdsWholeBuffer(data)) return data;
  const out = Buffer.allocUnsafeSlow(data.length); // its own ArrayBuffer (never the shared pool)
  data.copy(out);
  return out;
}

/** Cached chunks read ahead of the consumer (file reads overlap the digest checks). */
const CACHE_READ_AHEAD = 4;
/** Cache writes outstanding at once in pass 1 (they overlap the fetch and the scan). */
const CACHE_PUTS_IN_FLIGHT = 8;
/** Deferred cache writes of kept chunks outstanding at once (release()): background work. */
const DEFERRED_PUTS_IN_FLIGHT = 2;

/**
 * The layer's chunks in order, each verified by its digest: from the cache when it holds them
 * (verified on read), the rest fetched from the store (pipelined, on the fetch worker when one is
 * configured). With `fill`, fetched chunks pass 1 does not keep in memory are also written to the
 * cache: a chunk is yielded once its write is done (several writes in flight ahead of the consumer),
 * so the consumer may transfer it to another thread without a copy; kept ones are written by
 * release(). Every yielded buffer is the consumer's, except with `lent`: a consumer that hands
 * chunks back (passesOf) is lent the ones kept in `keep` (pass 1) or still to be cached (pass 2)
 * instead of given a copy of each (two copies of the layer in all, measured: bench/checkpoint).
 */
async function* layerChunks(layer: LayerRef, store: ChunkStore, options: FetchLayerOptions, fill: boolean, counts: ChunkCounts, retained?: KeptChunks, keep?: KeptChunks, lent = false): AsyncGenerator<Buffer> {
  const cache = options.cache?.enabled === true ? options.cache : undefined;
  // A kept chunk is moved to the layer worker in pass 2 (its last use): one that is already moved
  // (a second extraction of the same verified layer) reads as not kept. Decided once, at the start:
  // what this pass fetches depends on it.
  const keptAtStart = layer.chunks.map((ref, i) => {
    const data = retained?.chunks[i];
    return data !== undefined && data.length === ref.size ? data : undefined;
  });
  const kept = (i: number): Buffer | undefined => keptAtStart[i];
  const cached = layer.chunks.map((c, i) => kept(i) === undefined && cache?.has(c.digest) === true);
  const missing = layer.chunks.filter((_, i) => kept(i) === undefined && !cached[i]);
  const inFlight = options.maxInFlight ?? DEFAULT_READ_IN_FLIGHT;
  const fetched =
    missing.length === 0
      ? undefined
      : options.fetchWorker
        ? fetchChunksInWorker(missing, { servers: options.fetchWorker.servers, auth: options.fetchWorker.auth, stream: store.chunkStream, maxInFlight: inFlight, ...(options.fetchWorkers !== undefined ? { workers: options.fetchWorkers } : {}) })
        : store.read(missing, inFlight, options.offThreadHash === true ? { digest: digestOff, shared: true } : {});
  const reads = new Map<number, Promise<Buffer | undefined>>();
  /** Chunks in order, each with the cache write that still reads it (yielded once that is done). */
  const ready: { data: Buffer; written: Promise<void>; done: boolean }[] = [];
  const writeBack = (ref: ChunkRef, data: Buffer): Promise<void> => {
    if (!fill || cache === undefined) return Promise.resolve();
    return cache.put(ref, data).then((stored) => {
      if (stored) counts.stored.push(ref);
    });
  };
  try {
    for (const [i, ref] of layer.chunks.entries()) {
      for (let j = i; j < Math.min(layer.chunks.length, i + CACHE_READ_AHEAD); j++) {
        if (cached[j] && !reads.has(j)) reads.set(j, cache!.get(layer.chunks[j]!));
      }
      let data: Buffer | undefined = kept(i);
      let fetchedNow = false;
      let deferred = false;
      if (data !== undefined) {
        // Kept by pass 1: the bytes it verified. Still to be cached: lent, or the layer worker gets a copy.
        if (retained!.uncached.has(i)) {
          if (lent) retained!.out.add(i);
          else data = own(data, true);
        }
        keptAtStart[i] = undefined;
      } else if (cached[i]) {
        data = await reads.get(i)!;
        reads.delete(i);
        if (data !== undefined) counts.cachedBytes += data.length;
        else {
          // Evicted or corrupt since the index was read: fetch this one alone (verified by the store).
          data = own(await store.get(ref));
          counts.fetchedBytes += data.length;
          fetchedNow = true;
        }
      } else {
        const next = await fetched!.next();
        if (next.done === true) throw new ChunkStoreError('transfer_failed', `chunk fetch ended before chunk ${i} of ${layer.chunks.length}`);
        data = own(next.value);
        counts.fetchedBytes += data.length;
        fetchedNow = true;
      }
      // Pass 1 keeps what the budget allows and gives the layer worker a copy (the worker takes
      // what it is given: moved buffers free deterministically, shared ones only when every thread
      // has collected them). A kept chunk's cache write waits until release(): pass 2 reads it from
      // memory, and the writes (a file each, and dirty pages that `docker create` then waited on)
      // were 0.3-0.6 s of a 200 MiB restore's 1.9 s (bench/checkpoint).
      if (keep !== undefined && options.retain?.take(data.length) === true) {
        keep.bytes += data.length;
        if (fetchedNow && fill && cache !== undefined) {
          keep.uncached.add(i);
          deferred = true;
        }
        if (lent) keep.out.add(i);
        else {
          keep.chunks[i] = data;
          data = own(data, true);
        }
      }
      const written = fetchedNow && !deferred ? writeBack(ref, data) : Promise.resolve();
      const entry = { data, written, done: false };
      void written.then(() => (entry.done = true), () => undefined);
      ready.push(entry);
      if (!fill) entry.done = true;
      while (ready.length > 0 && (ready[0]!.done || ready.length > CACHE_PUTS_IN_FLIGHT)) {
        const first = ready.shift()!;
        await first.written;
        yield first.data;
      }
    }
    while (ready.length > 0) {
      const first = ready.shift()!;
      await first.written;
      yield first.data;
    }
  } finally {
    await fetched?.return(undefined).catch(() => undefined);
    await Promise.allSettled([...reads.values(), ...ready.map((r) => r.written)]);
  }
}

/**
 * Pass 1 (restore.ts): fetch the layer once (or read it from the cache), verify every chunk, the
 * whole-layer digest and size, and validate every tar header, writing nothing but cache files.
 * Refusals throw LayerRuleError / LayerTransferError / ChunkStoreError (errors.ts restoreFailureOf).
 */
export async function verifyLayer(layer: LayerRef, store: ChunkStore, options: FetchLayerOptions = {}): Promise<VerifiedLayer> {
  const limits = options.limits ?? DEFAULT_LAYER_LIMITS;
  checkDeclaredSize(layer, limits);
  const expected = expectedOf(layer, options);
  const unpin = options.cache?.pin(layer.chunks) ?? ((): void => undefined);
  const counts: ChunkCounts = { cachedBytes: 0, fetchedBytes: 0, stored: [] };
  const keep: KeptChunks = { chunks: [], uncached: new Set(), out: new Set(), bytes: 0 };
  let released: Promise<void> | undefined;
  const release = (how: { cache?: boolean } = {}): Promise<void> => {
    if (released !== undefined) return released;
    // The chunks still to be cached leave `keep` now: a later extraction reads the cache or the store.
    const pending = how.cache === false ? [] : [...keep.uncached].map((i) => ({ ref: layer.chunks[i]!, data: keep.chunks[i] }));
    keep.chunks.length = 0;
    keep.uncached.clear();
    keep.out.clear();
    return (released = fillCache(pending, options.cache).finally(() => {
      unpin();
      options.retain?.give(keep.bytes);
    }));
  };
  try {
    const { passes, lent } = passesOf(options, keep);
    const scanned = await passes.scan(layerChunks(layer, store, options, true, counts, undefined, keep, lent), { expected, limits });
    const uncachedBytes = [...keep.uncached].reduce((sum, i) => sum + layer.chunks[i]!.size, 0);
    return { layer, scanned, cachedBytes: counts.cachedBytes, fetchedBytes: counts.fetchedBytes, retainedBytes: keep.bytes, retained: keep, uncachedBytes, release };
  } catch (err) {
    // Nothing of a layer that failed pass 1 is cached later.
    keep.uncached.clear();
    await release();
    // A refused layer's chunks are of no use to anyone: they leave the cache again.
    if (restoreFailureOf(err).layerRefusal) await options.cache?.discard(counts.stored);
    throw err;
  }
}

/** The deferred cache writes of kept chunks (a few at a time, in the background); never rejects. */
async function fillCache(pending: { readonly ref: ChunkRef; readonly data: Buffer | undefined }[], cache: ChunkCache | undefined): Promise<void> {
  if (cache?.enabled !== true || pending.length === 0) return;
  await Promise.all(
    Array.from({ length: Math.min(DEFERRED_PUTS_IN_FLIGHT, pending.length) }, async () => {
      for (let next = pending.shift(); next !== undefined; next = pending.shift()) {
        // Not back from a lent extraction (moved, then its pass failed): not cached, not an error.
        if (next.data !== undefined && next.data.length === next.ref.size) await cache.put(next.ref, next.data).catch(() => false);
      }
    }),
  );
}

/**
 * Pass 2: extract a verified layer into `targetDir` (absent or empty), from memory, the cache or the
 * store. With `earlyStaging`, `targetDir` may be a promise: extraction runs while it is made.
 */
export async function extractVerifiedLayer(verified: VerifiedLayer, store: ChunkStore, targetDir: string | Promise<string>, options: FetchLayerOptions & { readonly earlyStaging?: EarlyStaging | undefined } = {}): Promise<RestoredLayer> {
  const counts: ChunkCounts = { cachedBytes: 0, fetchedBytes: 0, stored: [] };
  const { passes, lent } = passesOf(options, verified.retained);
  return extractIntoTarget(() => layerChunks(verified.layer, store, options, false, counts, verified.retained, undefined, lent), verified.scanned, expectedOf(verified.layer, options), targetDir, {
    passes,
    ...(options.limits ? { limits: options.limits } : {}),
    ...(options.tarPath ? { tarPath: options.tarPath } : {}),
    earlyStaging: options.earlyStaging,
  });
}

/**
 * Fetch, verify and extract a stored layer into `targetDir` (absent or empty): pass 1 verifies every
 * chunk digest, the whole-layer digest and every header before anything is written (R-R2, R-R4);
 * pass 2 extracts. `targetDir` may be a promise (e.g. of the upper dir of a container being
 * created): it is awaited only after pass 1 accepted the layer.
 */
export async function fetchLayer(layer: LayerRef, store: ChunkStore, targetDir: string | Promise<string>, options: FetchLayerOptions = {}): Promise<RestoredLayer> {
  if (targetDir instanceof Promise) targetDir.catch(() => undefined); // awaited below, after pass 1
  const verified = await verifyLayer(layer, store, options);
  try {
    return await extractVerifiedLayer(verified, store, await targetDir, options);
  } finally {
    void verified.release();
  }
}
