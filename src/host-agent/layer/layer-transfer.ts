// Moves one writable layer between an overlay upper dir and the chunk store (R-G3, R-G5):
// capture → content-defined chunks → pipelined, deduplicated uploads; and ordered, verified chunk
// fetches → restore. The manifest (written last, by the caller) carries the returned LayerRef.
import { MAX_CHUNK_BYTES, type ChunkRef, type LayerRef } from '../../core/checkpoint-manifest.ts';
import { type LayerLimits } from '../../core/layer-rules.ts';
import { type ChunkStore, type WriterStats } from '../../store/chunk-store.ts';
import { captureLayer } from './capture.ts';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker, type ChunkerOptions } from './fastcdc.ts';
import { LayerTransferError } from './errors.ts';
import { restoreLayer, type RestoredLayer } from './restore.ts';

export interface StoreLayerOptions {
  readonly limits?: LayerLimits;
  readonly chunker?: ChunkerOptions;
  /** Chunk publishes outstanding at once. */
  readonly maxInFlight?: number;
  readonly tarPath?: string;
}

export interface StoredLayer {
  readonly layer: LayerRef;
  readonly entries: number;
  /** Totals, and what was actually uploaded (the rest deduplicated against the store). */
  readonly stats: WriterStats;
}

/** Capture `upperDir` and store it as chunks; returns the LayerRef for the manifest. */
export async function storeLayer(upperDir: string, store: ChunkStore, options: StoreLayerOptions = {}): Promise<StoredLayer> {
  const chunkerOptions = options.chunker ?? DEFAULT_CHUNKER_OPTIONS;
  if (chunkerOptions.maxSize > MAX_CHUNK_BYTES) throw new RangeError(`chunks above ${MAX_CHUNK_BYTES} bytes do not fit a NATS message`);
  const chunker = new FastCdcChunker(chunkerOptions);
  const writer = store.writer(options.maxInFlight ?? 8);
  const capture = captureLayer(upperDir, { ...(options.limits ? { limits: options.limits } : {}), ...(options.tarPath ? { tarPath: options.tarPath } : {}) });
  const chunks: ChunkRef[] = [];
  for await (const piece of capture.stream) {
    for (const chunk of chunker.push(piece)) chunks.push(await writer.put(chunk));
  }
  const last = chunker.finish();
  if (last !== null) chunks.push(await writer.put(last));
  const stats = await writer.flush();
  const captured = await capture.done;
  if (stats.bytes !== captured.size) throw new LayerTransferError('capture_failed', `chunked ${stats.bytes} bytes of a ${captured.size}-byte layer`);
  return { layer: { digest: captured.digest, size: captured.size, chunks }, entries: captured.entries, stats };
}

export interface FetchLayerOptions {
  readonly limits?: LayerLimits;
  /** Chunk fetches outstanding at once. */
  readonly maxInFlight?: number;
  readonly tarPath?: string;
}

/** Fetch, verify and extract a stored layer into `targetDir` (absent or empty). */
export async function fetchLayer(layer: LayerRef, store: ChunkStore, targetDir: string, options: FetchLayerOptions = {}): Promise<RestoredLayer> {
  const chunks = store.read(layer.chunks, options.maxInFlight ?? 8);
  return restoreLayer(chunks, layer, targetDir, { ...(options.limits ? { limits: options.limits } : {}), ...(options.tarPath ? { tarPath: options.tarPath } : {}) });
}
