// Moves one writable layer between an overlay upper dir and the chunk store (R-G3, R-G5):
// capture → content-defined chunks → pipelined, deduplicated uploads; and ordered, verified chunk
// fetches → restore in two passes (restore.ts): verifyLayer validates everything and fills the
// host's chunk cache, extractVerifiedLayer extracts from it. The manifest (written last, by the
// caller) carries the returned LayerRef.
import { MAX_CHUNK_BYTES, type ChunkRef, type LayerRef } from '../../core/checkpoint-manifest.ts';
import { DEFAULT_LAYER_LIMITS, type LayerLimits } from '../../core/layer-rules.ts';
import { ChunkStoreError, DEFAULT_READ_IN_FLIGHT, DEFAULT_WRITE_IN_FLIGHT, type ChunkStore, type WriterStats } from '../../store/chunk-store.ts';
import { fetchChunksInWorker } from '../../store/chunk-fetch-worker.ts';
import { WorkerChunkWriter } from '../../store/chunk-publish-worker.ts';
import type { WorkerConnection } from '../../store/nats-auth.ts';
import { captureLayer } from './capture.ts';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker, type ChunkerOptions } from './fastcdc.ts';
import { LayerTransferError, restoreFailureOf } from './errors.ts';
import type { ChunkCache } from './chunk-cache.ts';
import { WORKER_PASSES_TRANSFER } from './layer-workers.ts';
import { checkDeclaredSize, extractIntoTarget, type LayerPasses, type RestoredLayer, type ScannedLayer } from './restore.ts';
import { OffThreadStreamHash, digestOff, sharedBuffer } from './sha256-pool.ts';

export interface StoreLayerOptions {
  readonly limits?: LayerLimits;
  readonly chunker?: ChunkerOptions;
  /** Chunk publishes outstanding at once. */
  readonly maxInFlight?: number;
  readonly tarPath?: string;
  /**
   * Hash on worker threads (sha256-pool.ts). Default false: on the 2-core hosts measured, with
   * other work running, it cost ~10–30% more wall time (shared-memory copies, thread handoffs)
   * than hashing inline; it can only pay on a host with an idle core (bench/checkpoint/phases.ts).
   */
  readonly offThreadHash?: boolean;
  /** Hash and publish chunks on a worker thread with its own NATS connection to `servers` (measured: bench/checkpoint). */
  readonly publishWorker?: WorkerConnection;
}

export interface StoredLayer {
  readonly layer: LayerRef;
  readonly entries: number;
  /** Totals, and what was actually uploaded (the rest deduplicated against the store). */
  readonly stats: WriterStats;
}

/** Chunks hashed ahead of their upload: keeps the chunk worker busy while publishes wait. */
const HASH_AHEAD = 8;

/**
 * Capture `upperDir` and store it as chunks; returns the LayerRef for the manifest. The calling
 * thread parses tar, chunks and publishes; chunk digests and the whole-layer digest are computed
 * inline, or with `offThreadHash` on worker threads over the very same (shared-memory) chunk
 * bytes, in order (sha256-pool.ts).
 */
export async function storeLayer(upperDir: string, store: ChunkStore, options: StoreLayerOptions = {}): Promise<StoredLayer> {
  const chunkerOptions = options.chunker ?? DEFAULT_CHUNKER_OPTIONS;
  if (chunkerOptions.maxSize > MAX_CHUNK_BYTES) throw new RangeError(`chunks above ${MAX_CHUNK_BYTES} bytes do not fit a NATS message`);
  if (options.publishWorker) return storeLayerViaWorker(upperDir, chunkerOptions, options.publishWorker, options);
  const offThread = options.offThreadHash ?? false;
  const chunker = new FastCdcChunker(chunkerOptions, offThread ? sharedBuffer : Buffer.allocUnsafe);
  const writer = store.writer(options.maxInFlight ?? DEFAULT_WRITE_IN_FLIGHT);
  const capture = captureLayer(upperDir, { hashLayer: !offThread, ...(options.limits ? { limits: options.limits } : {}), ...(options.tarPath ? { tarPath: options.tarPath } : {}) });
  const layerHash = offThread ? new OffThreadStreamHash() : null;
  const chunks: ChunkRef[] = [];
  const hashing: { chunk: Buffer; digest: Promise<string> }[] = [];
  const upload = async (): Promise<void> => {
    const next = hashing.shift()!;
    chunks.push(await writer.put(next.chunk, await next.digest));
  };
  const submit = async (chunk: Buffer): Promise<void> => {
    if (layerHash === null) {
      chunks.push(await writer.put(chunk));
      return;
    }
    layerHash.update(chunk);
    const digest = digestOff(chunk);
    digest.catch(() => undefined); // awaited in order by upload(); avoid unhandled rejections on abort
    hashing.push({ chunk, digest });
    while (hashing.length > HASH_AHEAD) await upload();
  };
  let digest: string | null = null;
  try {
    for await (const piece of capture.stream) {
      for (const chunk of chunker.push(piece)) await submit(chunk);
    }
    const last = chunker.finish();
    if (last !== null) await submit(last);
    while (hashing.length > 0) await upload();
    if (layerHash !== null) digest = await layerHash.digest();
  } catch (err) {
    layerHash?.abort();
    throw err;
  }
  const stats = await writer.flush();
  const captured = await capture.done;
  digest ??= captured.digest;
  if (digest === null) throw new LayerTransferError('capture_failed', 'layer was not hashed');
  if (stats.bytes !== captured.size) throw new LayerTransferError('capture_failed', `chunked ${stats.bytes} bytes of a ${captured.size}-byte layer`);
  return { layer: { digest, size: captured.size, chunks }, entries: captured.entries, stats };
}

/**
 * storeLayer with the per-chunk sha256, dedup and publishes on a worker thread (its own NATS
 * connection); this thread keeps tar parsing, chunking and the whole-layer digest.
 */
async function storeLayerViaWorker(upperDir: string, chunkerOptions: ChunkerOptions, connection: WorkerConnection, options: StoreLayerOptions): Promise<StoredLayer> {
  const chunker = new FastCdcChunker(chunkerOptions);
  const writer = new WorkerChunkWriter({ servers: connection.servers, auth: connection.auth, maxInFlight: options.maxInFlight ?? DEFAULT_WRITE_IN_FLIGHT });
  const capture = captureLayer(upperDir, { hashLayer: true, ...(options.limits ? { limits: options.limits } : {}), ...(options.tarPath ? { tarPath: options.tarPath } : {}) });
  try {
    for await (const piece of capture.stream) {
      for (const chunk of chunker.push(piece)) await writer.put(chunk);
    }
    const last = chunker.finish();
    if (last !== null) await writer.put(last);
  } catch (err) {
    await writer.abort();
    throw err;
  }
  capture.done.catch(() => undefined); // awaited below; a failed upload must not leave it unobserved
  const { refs, stats } = await writer.flush();
  const captured = await capture.done;
  if (captured.digest === null) throw new LayerTransferError('capture_failed', 'layer was not hashed');
  if (stats.bytes !== captured.size) throw new LayerTransferError('capture_failed', `chunked ${stats.bytes} bytes of a ${captured.size}-byte layer`);
  return { layer: { digest: captured.digest, size: captured.size, chunks: refs }, entries: captured.entries, stats };
}

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
  /**
   * The host's chunk cache (chunk-cache.ts): pass 1 reads what it holds and stores what it fetched,
   * pass 2 reads it back. Without one, pass 2 fetches the layer from the store again.
   */
  readonly cache?: ChunkCache | undefined;
  /** Where the two passes run; default a layer worker thread (layer-workers.ts). */
  readonly passes?: LayerPasses;
}

/** A layer pass 1 accepted: its chunks stay pinned in the cache until release(). */
export interface VerifiedLayer {
  readonly layer: LayerRef;
  readonly scanned: ScannedLayer;
  /** Pass 1's bytes read from the host's chunk cache and fetched from the store. */
  readonly cachedBytes: number;
  readonly fetchedBytes: number;
  release(): void;
}

interface ChunkCounts {
  cachedBytes: number;
  fetchedBytes: number;
  /** Chunks this pass added to the cache. */
  readonly stored: ChunkRef[];
}

/** A buffer this code alone holds (store reads may be views into the NATS client's receive buffer). */
function own(data: Buffer, copy = false): Buffer {
  if (!copy && !(data.buffer instanceof SharedArrayBuffer) && data.byteOffset === 0 && data.byteLength === data.buffer.byteLength) return data;
  const out = Buffer.allocUnsafeSlow(data.length); // its own ArrayBuffer (never the shared pool)
  data.copy(out);
  return out;
}

/** Cached chunks read ahead of the consumer (file reads overlap the digest checks). */
const CACHE_READ_AHEAD = 4;
/** Cache writes outstanding at once in pass 1 (they overlap the fetch and the scan). */
const CACHE_PUTS_IN_FLIGHT = 8;

/**
 * The layer's chunks in order, each verified by its digest: from the cache when it holds them
 * (verified on read), the rest fetched from the store (pipelined, on the fetch worker when one is
 * configured). With `fill`, fetched chunks are also written to the cache (several writes in flight,
 * each reading its own buffer: what is yielded is a copy). Every yielded buffer is the consumer's to
 * transfer to another thread.
 */
async function* layerChunks(layer: LayerRef, store: ChunkStore, options: FetchLayerOptions, fill: boolean, counts: ChunkCounts): AsyncGenerator<Buffer> {
  const cache = options.cache?.enabled === true ? options.cache : undefined;
  const cached = layer.chunks.map((c) => cache?.has(c.digest) === true);
  const missing = layer.chunks.filter((_, i) => !cached[i]);
  const inFlight = options.maxInFlight ?? DEFAULT_READ_IN_FLIGHT;
  const fetched =
    missing.length === 0
      ? undefined
      : options.fetchWorker
        ? fetchChunksInWorker(missing, { servers: options.fetchWorker.servers, auth: options.fetchWorker.auth, stream: store.chunkStream, maxInFlight: inFlight })
        : store.read(missing, inFlight, options.offThreadHash === true ? { digest: digestOff, shared: true } : {});
  const reads = new Map<number, Promise<Buffer | undefined>>();
  const puts = new Set<Promise<void>>();
  /** Start writing `data` to the cache; returns what to yield (a copy when the write still reads it). */
  const put = async (ref: ChunkRef, data: Buffer): Promise<Buffer> => {
    if (!fill || cache === undefined) return data;
    while (puts.size >= CACHE_PUTS_IN_FLIGHT) await Promise.race(puts);
    const p: Promise<void> = cache.put(ref, data).then((stored) => {
      if (stored) counts.stored.push(ref);
    });
    const tracked = p.finally(() => puts.delete(tracked));
    puts.add(tracked);
    return own(data, true);
  };
  try {
    for (const [i, ref] of layer.chunks.entries()) {
      for (let j = i; j < Math.min(layer.chunks.length, i + CACHE_READ_AHEAD); j++) {
        if (cached[j] && !reads.has(j)) reads.set(j, cache!.get(layer.chunks[j]!));
      }
      let data: Buffer | undefined;
      if (cached[i]) {
        data = await reads.get(i)!;
        reads.delete(i);
        if (data !== undefined) counts.cachedBytes += data.length;
        else {
          // Evicted or corrupt since the index was read: fetch this one alone (verified by the store).
          data = own(await store.get(ref));
          counts.fetchedBytes += data.length;
          data = await put(ref, data);
        }
      } else {
        const next = await fetched!.next();
        if (next.done === true) throw new ChunkStoreError('transfer_failed', `chunk fetch ended before chunk ${i} of ${layer.chunks.length}`);
        data = own(next.value);
        counts.fetchedBytes += data.length;
        data = await put(ref, data);
      }
      yield data;
    }
  } finally {
    await fetched?.return(undefined).catch(() => undefined);
    await Promise.allSettled([...reads.values(), ...puts]);
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
  const release = options.cache?.pin(layer.chunks) ?? ((): void => undefined);
  const counts: ChunkCounts = { cachedBytes: 0, fetchedBytes: 0, stored: [] };
  try {
    const scanned = await (options.passes ?? WORKER_PASSES_TRANSFER).scan(layerChunks(layer, store, options, true, counts), { expected: layer, limits });
    return { layer, scanned, cachedBytes: counts.cachedBytes, fetchedBytes: counts.fetchedBytes, release };
  } catch (err) {
    release();
    // A refused layer's chunks are of no use to anyone: they leave the cache again.
    if (restoreFailureOf(err).layerRefusal) await options.cache?.discard(counts.stored);
    throw err;
  }
}

/** Pass 2: extract a verified layer into `targetDir` (absent or empty), from the cache or the store. */
export async function extractVerifiedLayer(verified: VerifiedLayer, store: ChunkStore, targetDir: string, options: FetchLayerOptions = {}): Promise<RestoredLayer> {
  const counts: ChunkCounts = { cachedBytes: 0, fetchedBytes: 0, stored: [] };
  return extractIntoTarget(() => layerChunks(verified.layer, store, options, false, counts), verified.scanned, verified.layer, targetDir, {
    passes: options.passes ?? WORKER_PASSES_TRANSFER,
    ...(options.limits ? { limits: options.limits } : {}),
    ...(options.tarPath ? { tarPath: options.tarPath } : {}),
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
    verified.release();
  }
}
