// Moves one writable layer between an overlay upper dir and the chunk store (R-G3, R-G5):
// capture → content-defined chunks → pipelined, deduplicated uploads; and ordered, verified chunk
// fetches → restore. The manifest (written last, by the caller) carries the returned LayerRef.
import { MAX_CHUNK_BYTES, type ChunkRef, type LayerRef } from '../../core/checkpoint-manifest.ts';
import { type LayerLimits } from '../../core/layer-rules.ts';
import { DEFAULT_READ_IN_FLIGHT, DEFAULT_WRITE_IN_FLIGHT, type ChunkStore, type WriterStats } from '../../store/chunk-store.ts';
import { fetchChunksInWorker } from '../../store/chunk-fetch-worker.ts';
import { WorkerChunkWriter } from '../../store/chunk-publish-worker.ts';
import type { WorkerConnection } from '../../store/nats-auth.ts';
import { captureLayer } from './capture.ts';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker, type ChunkerOptions } from './fastcdc.ts';
import { LayerTransferError } from './errors.ts';
import { restoreLayer, type RestoredLayer } from './restore.ts';
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
}

/**
 * Fetch, verify and extract a stored layer into `targetDir` (absent or empty). Every chunk digest
 * and the whole-layer digest are verified while streaming (R-R2). `targetDir`
 * may be a promise (e.g. of the upper dir of a container being created): chunk fetches start at
 * once and overlap with it; nothing is written before it resolves.
 */
export async function fetchLayer(layer: LayerRef, store: ChunkStore, targetDir: string | Promise<string>, options: FetchLayerOptions = {}): Promise<RestoredLayer> {
  const offThread = options.offThreadHash ?? false;
  const inFlight = options.maxInFlight ?? DEFAULT_READ_IN_FLIGHT;
  const chunks = options.fetchWorker
    ? fetchChunksInWorker(layer.chunks, { servers: options.fetchWorker.servers, auth: options.fetchWorker.auth, stream: store.chunkStream, maxInFlight: inFlight })
    : store.read(layer.chunks, inFlight, offThread ? { digest: digestOff, shared: true } : {});
  // Start the generator now: its first next() issues the first window of direct gets.
  const first = chunks.next();
  first.catch(() => undefined); // surfaced by the loop below, or moot if the target fails
  let target: string;
  try {
    target = await targetDir;
  } catch (err) {
    await chunks.return(undefined).catch(() => undefined);
    throw err;
  }
  const source = (async function* (): AsyncGenerator<Buffer> {
    for (let r = await first; r.done !== true; r = await chunks.next()) yield r.value;
  })();
  const layerHash = offThread ? new OffThreadStreamHash() : null;
  try {
    return await restoreLayer(source, layer, target, {
      ...(layerHash ? { layerHash } : {}),
      ...(options.limits ? { limits: options.limits } : {}),
      ...(options.tarPath ? { tarPath: options.tarPath } : {}),
    });
  } finally {
    layerHash?.abort(); // no-op once digested; frees the worker's state after an early failure
    await chunks.return(undefined).catch(() => undefined);
  }
}
