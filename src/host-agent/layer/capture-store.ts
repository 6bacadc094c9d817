// Capture an upper dir into the chunk store, reading only what changed since the last capture of the
// same upper dir on this host (issue #17, R-G3). Steps:
//  1. walk.ts lists every entry with its lstat, in the archive's order;
//  2. each entry is compared with the previous capture's index (capture-index.ts): an entry whose
//     stat is unchanged (inode, mode, owner, links, size, mtime and ctime in ns) and that was
//     reusable (nothing uncertain about it, see IndexEntry.reusable) keeps its old record unread;
//     every other entry goes to GNU tar (capture.ts), in order;
//  3. layer-assembler.ts chunks the new layer: old records are copied (old chunks reused while the
//     chunker is aligned with them, old bytes fed where it is not), re-read entries are predicted
//     at their old place (an append or an in-place edit reuses the old chunks its bytes still hash
//     to) and fresh elsewhere. The layer is exactly what a full capture would give;
//  4. new chunks go to the publish worker (hash, dedup, publish); every reused chunk is checked to
//     still be in the store (garbage collection may have taken it): if one is gone the capture is
//     redone in full. The returned index is for the next capture, to be saved once the manifest is.
// A full capture is the same code with nothing to reuse: no index, another container or upper dir,
// another chunk format, version-1 manifests (their digest hashes every byte), or every
// `fullCaptureEvery`-th capture, which re-reads everything in case a stat lied.
import { createHash } from 'node:crypto';
import { open } from 'node:fs/promises';
import { MAX_CHUNK_BYTES, chunkListDigest, type ChunkRef, type LayerRef, type ManifestSchemaVersion } from '../../core/checkpoint-manifest.ts';
import { DEFAULT_LAYER_LIMITS, LayerValidator, normalizeEntryPath, type LayerLimits } from '../../core/layer-rules.ts';
import { ChunkStoreError, DEFAULT_WRITE_IN_FLIGHT, type ChunkStore, type WriterStats } from '../../store/chunk-store.ts';
import { WorkerChunkWriter } from '../../store/chunk-publish-worker.ts';
import type { WorkerConnection } from '../../store/nats-auth.ts';
import { OverlayToOci, headerOnly, runTar, smallTarRun, tarOutputBound, type CaptureEvent, type CapturedEntry, type TarRun } from './capture.ts';
import { CAPTURE_INDEX_VERSION, type CaptureIndex, type IndexEntry } from './capture-index.ts';
import { LayerTransferError } from './errors.ts';
import { DEFAULT_CHUNKER_OPTIONS, FastCdcChunker, type ChunkerOptions } from './fastcdc.ts';
import { LayerAssembler, oldLayerOf, type Emitted } from './layer-assembler.ts';
import { END_OF_ARCHIVE, TarParser, dataPadding, type TarHeader, type TarSink } from './tar-format.ts';
import { S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, keyText, tarName, walkUpperDir, type EntryStat, type WalkEntry } from './walk.ts';

/**
 * An entry changed this recently before the walk is not trusted next time even if its stat is
 * unchanged: a write in the same timestamp tick (or second, on coarse file systems) as the stat we
 * keep would leave that stat unchanged.
 */
export const RACY_MARGIN_NS = 2_000_000_000n;
/** Re-read files this large are read directly (tar gives their header only). */
const DIRECT_READ_MIN_BYTES = 4 * 1024 * 1024;
const DIRECT_READ_BLOCK = 4 * 1024 * 1024;
/** Header-only tar runs at once, and the most large files read directly (more go through one tar). */
const HEADER_RUNS = 2;
const DIRECT_READ_MAX_FILES = 2;
/**
 * Other re-read entries this small (data bytes in all) share one tar run with a single large file's
 * header: tar lists them first and is stopped at that header (a process fewer: each one is a fork of
 * this large process; after an append the session file and the layer root, whose overlay xattrs make
 * it re-read every time, took two).
 */
const SHARED_RUN_MAX_BYTES = 1024 * 1024;
/** Old chunks fetched ahead (those at the edges of unchanged runs), at most. */
const PREFETCH_OLD_CHUNKS = 8;
/** Default: every 10th capture of an upper dir reads everything. */
export const DEFAULT_FULL_CAPTURE_EVERY = 10;

export interface StoreLayerOptions {
  readonly limits?: LayerLimits;
  readonly chunker?: ChunkerOptions;
  /** Chunk publishes outstanding at once. */
  readonly maxInFlight?: number;
  readonly tarPath?: string;
  /** Hash and publish chunks on a worker thread with its own NATS connection (what the agent does). */
  readonly publishWorker?: WorkerConnection;
  /** 2 (default): chunk-list layer digest, chunks may be reused; 1: whole-tar digest, everything read. */
  readonly schemaVersion?: ManifestSchemaVersion;
  /** The index of this upper dir's previous capture (capture-index.ts); none: a full capture. */
  readonly previous?: CaptureIndex | undefined;
  /** Read everything when the previous index is this many captures past a full read (1: always). */
  readonly fullCaptureEvery?: number;
  /** The container whose upper dir this is (kept in the index: another container reuses nothing). */
  readonly containerId?: string;
  /** Wall clock in ms (the racy margin is measured from it); default Date.now. */
  readonly nowMs?: () => number;
  /** Re-read files at least this large are read directly, tar giving only their header (default 4 MiB; tests use less). */
  readonly directReadMinBytes?: number;
}

/**
 * Why a capture read what it read, as a bounded code (a metric label): `incremental`, or why the
 * capture was full.
 */
export type CaptureWhy = 'incremental' | 'version_1' | 'no_index' | 'other_format' | 'other_upper_dir' | 'other_container' | 'periodic' | 'reuse_failed';

export interface CaptureReport {
  readonly mode: 'full' | 'incremental';
  /** Why a capture was full (or `incremental`), in words, and as a code. */
  readonly reason: string;
  readonly why: CaptureWhy;
  readonly walkedEntries: number;
  /** Entries read again (by tar, or directly: `directEntries`, large re-read files), and records copied unread. */
  readonly readEntries: number;
  readonly directEntries: number;
  readonly reusedEntries: number;
  /** Layer bytes in reused chunks not read at all, reused after hashing, and old bytes fetched to re-align the chunker. */
  readonly reusedBytes: number;
  readonly verifiedBytes: number;
  readonly oldBytesRead: number;
}

export interface StoredLayer {
  readonly layer: LayerRef;
  readonly entries: number;
  /** Totals, and what was actually uploaded (the rest was reused or deduplicated against the store). */
  readonly stats: WriterStats;
  readonly capture: CaptureReport;
  /** The index for this upper dir's next capture: save it only once a manifest names this layer. */
  readonly index: CaptureIndex;
}

/** Thrown inside a capture when reuse turned out impossible (an old chunk gone): redo it in full. */
class ReuseUnavailable extends Error {}

function formatOf(chunker: ChunkerOptions): string {
  // Bump `tar` when encodeHeader or OverlayToOci change the bytes of an entry.
  return `fastcdc-${chunker.minSize}-${chunker.avgSize}-${chunker.maxSize};tar-1`;
}

function sameStat(a: EntryStat, b: EntryStat): boolean {
  return a.ino === b.ino && a.mode === b.mode && a.nlink === b.nlink && a.uid === b.uid && a.gid === b.gid && a.size === b.size && a.mtimeNs === b.mtimeNs && a.ctimeNs === b.ctimeNs;
}

interface Plan {
  readonly mode: 'full' | 'incremental';
  readonly reason: string;
  readonly why: CaptureWhy;
  readonly previous: CaptureIndex | undefined;
  /** The previous record of each walked entry that is copied unread (undefined: read it). */
  readonly reuse: (IndexEntry | undefined)[];
}

function plan(upperDir: string, walk: readonly WalkEntry[], options: StoreLayerOptions, format: string): Plan {
  const previous = options.previous;
  const full = (why: CaptureWhy, reason: string): Plan => ({ mode: 'full', reason, why, previous: undefined, reuse: walk.map(() => undefined) });
  if ((options.schemaVersion ?? 2) === 1) return full('version_1', 'version-1 manifest (its digest hashes every byte)');
  if (previous === undefined) return full('no_index', 'no index of a previous capture');
  const root = walk[0]!.stat;
  if (previous.version !== CAPTURE_INDEX_VERSION || previous.format !== format) return full('other_format', 'index of another chunk format');
  if (previous.upperDir !== upperDir || previous.rootDev !== root.dev || previous.rootIno !== root.ino) return full('other_upper_dir', 'index of another upper dir');
  if (options.containerId !== undefined && previous.containerId !== options.containerId) return full('other_container', 'index of another container');
  if (previous.capturesSinceFull + 1 >= (options.fullCaptureEvery ?? DEFAULT_FULL_CAPTURE_EVERY)) return full('periodic', 'periodic full read');
  const byKey = new Map(previous.entries.map((e) => [e.key, e]));
  const reuse = walk.map((w) => {
    const old = byKey.get(w.key);
    return old !== undefined && old.reusable && w.stat.dev === root.dev && sameStat(old.stat, w.stat) ? old : undefined;
  });
  return { mode: 'incremental', reason: 'incremental', why: 'incremental', previous, reuse };
}

/** Where new chunks go and reused ones are checked: a publish worker, or this thread. */
interface ChunkSink {
  put(data: Buffer): Promise<void>;
  exists(digest: string): number;
  /** A stored chunk's bytes, verified. */
  get(ref: ChunkRef): Promise<Buffer>;
  flush(): Promise<{ refs: ChunkRef[]; stats: WriterStats; missing: readonly number[]; layerDigest: string | null }>;
  abort(): Promise<void>;
}

function inlineSink(store: ChunkStore, maxInFlight: number, hashLayer: boolean): ChunkSink {
  const writer = store.writer(maxInFlight);
  const refs: Promise<ChunkRef>[] = [];
  const checks: Promise<boolean>[] = [];
  const hash = hashLayer ? createHash('sha256') : null;
  return {
    async put(data) {
      hash?.update(data);
      const ref = writer.put(data);
      ref.catch(() => undefined); // awaited in flush()
      refs.push(ref);
      await ref;
    },
    get: (ref) => store.get(ref),
    exists(digest) {
      const p = store.has(digest);
      p.catch(() => undefined);
      checks.push(p);
      return checks.length - 1;
    },
    async flush() {
      const all = await Promise.all(refs);
      const stats = await writer.flush();
      const present = await Promise.all(checks);
      return { refs: all, stats, missing: present.flatMap((ok, i) => (ok ? [] : [i])), layerDigest: hash === null ? null : `sha256:${hash.digest('hex')}` };
    },
    async abort() {
      await Promise.allSettled([...refs, ...checks]);
    },
  };
}

/**
 * Capture `upperDir` (incrementally against `options.previous` when it applies) and store its new
 * chunks; returns the LayerRef for the manifest and the index for the next capture.
 */
export async function storeLayer(upperDir: string, store: ChunkStore, options: StoreLayerOptions = {}): Promise<StoredLayer> {
  const chunker = options.chunker ?? DEFAULT_CHUNKER_OPTIONS;
  if (chunker.maxSize > MAX_CHUNK_BYTES) throw new RangeError(`chunks above ${MAX_CHUNK_BYTES} bytes do not fit a NATS message`);
  const limits = options.limits ?? DEFAULT_LAYER_LIMITS;
  const nowNs = BigInt(Math.floor((options.nowMs ?? Date.now)())) * 1_000_000n;
  const walk = await walkUpperDir(upperDir, limits.maxEntries);
  const format = formatOf(chunker);
  const first = plan(upperDir, walk, options, format);
  try {
    return await capture(upperDir, store, walk, first, options, { chunker, limits, nowNs, format });
  } catch (err) {
    if (!(err instanceof ReuseUnavailable)) throw err;
    const full: Plan = { mode: 'full', reason: `reuse failed: ${err.message}`, why: 'reuse_failed', previous: undefined, reuse: walk.map(() => undefined) };
    return capture(upperDir, store, walk, full, options, { chunker, limits, nowNs, format });
  }
}

interface Settings {
  readonly chunker: ChunkerOptions;
  readonly limits: LayerLimits;
  readonly nowNs: bigint;
  readonly format: string;
}

/** An entry of the new layer as the next capture may reuse it. */
function indexEntryOf(w: WalkEntry, start: number, dataStart: number, end: number, reusable: boolean, linkName: string | undefined): IndexEntry {
  return { key: w.key, stat: w.stat, start, dataStart, end, reusable, ...(linkName !== undefined ? { linkName } : {}) };
}

/** Whether a re-read entry's record may be copied next time, should its stat stay the same. */
function reusableNext(w: WalkEntry, e: CapturedEntry, rootDev: bigint, nowNs: bigint): boolean {
  const s = w.stat;
  const recent = s.mtimeNs + RACY_MARGIN_NS >= nowNs || s.ctimeNs + RACY_MARGIN_NS >= nowNs;
  if (recent || e.xattrs || e.converted || s.dev !== rootDev) return false;
  const type = s.mode & S_IFMT;
  if (e.type === 'file') return type === S_IFREG && s.nlink === 1 && e.size === s.size;
  if (e.type === 'directory') return type === S_IFDIR;
  if (e.type === 'symlink') return type === S_IFLNK;
  return false;
}

async function capture(upperDir: string, store: ChunkStore, walk: readonly WalkEntry[], p: Plan, options: StoreLayerOptions, s: Settings): Promise<StoredLayer> {
  const version = options.schemaVersion ?? 2;
  const maxInFlight = options.maxInFlight ?? DEFAULT_WRITE_IN_FLIGHT;
  // Chunks cut from shared memory reach the publish worker without a copy; a slab is reused once
  // every chunk cut from it was published (fresh memory costs page faults and zeroing, measured).
  const slabs = options.publishWorker ? new SlabPool(SLAB_POOL) : undefined;
  // The worker learns the chunk stream from its first publish's answer; an incremental capture
  // names it at once (its checks of reused chunks may come before any publish).
  const sink: ChunkSink = options.publishWorker
    ? new WorkerChunkWriter({
        servers: options.publishWorker.servers,
        auth: options.publishWorker.auth,
        maxInFlight,
        hashLayer: version === 1,
        ...(p.mode === 'incremental' ? { stream: store.chunkStream } : {}),
        published: (data) => slabs?.done(data),
      })
    : inlineSink(store, maxInFlight, version === 1);
  const old = p.previous === undefined ? undefined : oldLayerOf(p.previous.layer.chunks);
  /** The new layer's chunks in order: a new one (by its put order) or an old one (by index). */
  const items: ({ readonly fresh: number } | { readonly old: number })[] = [];
  /** Old chunk index → the index of its existence check (each checked once). */
  const checkOf = new Map<number, number>();
  const check = (k: number): void => {
    if (!checkOf.has(k)) checkOf.set(k, sink.exists(p.previous!.layer.chunks[k]!.digest));
  };
  /** Old chunks reused in the new layer (only their absence from the store matters). */
  const reused = new Set<number>();
  let putCount = 0;
  const emit = async (e: Emitted): Promise<void> => {
    if (e.kind === 'new') {
      items.push({ fresh: putCount++ });
      slabs?.cut(e.data);
      await sink.put(e.data);
      return;
    }
    items.push({ old: e.index });
    reused.add(e.index);
    check(e.index);
  };
  const fetchOld = async (k: number): Promise<Buffer> => {
    try {
      return await sink.get(p.previous!.layer.chunks[k]!);
    } catch (err) {
      if (err instanceof ChunkStoreError && (err.reason === 'chunk_missing' || err.reason === 'chunk_digest_mismatch')) throw new ReuseUnavailable(`old chunk ${k}: ${err.message}`);
      throw err;
    }
  };
  // Latency, not CPU, is what an incremental capture waits for (store round trips behind tar's
  // reading): the old chunks inside unchanged runs are checked now, and the old bytes the chunker
  // will need at the edges of those runs are fetched now, while tar reads what changed.
  const prefetched = new Map<number, Promise<Buffer>>();
  if (old !== undefined) {
    for (const run of reusedRuns(p)) {
      const first = containing(old.offsets, run.start);
      const last = containing(old.offsets, run.end - 1);
      for (let k = first; k <= last; k++) if (old.offsets[k]! >= run.start && old.offsets[k + 1]! <= run.end) check(k);
      for (const k of [first, last]) {
        if (prefetched.size < PREFETCH_OLD_CHUNKS && !prefetched.has(k)) {
          const data = fetchOld(k);
          data.catch(() => undefined); // awaited by readOld, if needed at all
          prefetched.set(k, data);
        }
      }
    }
  }
  const readOld = (k: number): Promise<Buffer> => {
    const early = prefetched.get(k);
    prefetched.delete(k);
    return early ?? fetchOld(k);
  };
  const chunker = new FastCdcChunker(s.chunker, slabs?.allocate ?? Buffer.allocUnsafe);
  const assembler = new LayerAssembler(chunker, old, readOld, emit, s.chunker.maxSize);
  const validator = new LayerValidator(s.limits);
  const oci = new OverlayToOci(validator);
  const rootDev = walk[0]!.stat.dev;
  const entries: IndexEntry[] = [];
  const priorOf = p.previous === undefined ? new Map<string, IndexEntry>() : new Map(p.previous.entries.map((e) => [e.key, e]));
  // Large files re-read against an old record are read here, directly and in large blocks; tar
  // gives only their header (a run stopped once it is out). Through tar's pipe every byte costs a
  // copy and 64 KiB hand-offs between two processes; the whole file is still read and each old
  // chunk reused only after its bytes hashed to it.
  const direct = new Set<number>();
  if (p.mode === 'incremental') {
    walk.forEach((w, i) => {
      const prior = priorOf.get(w.key);
      const min = options.directReadMinBytes ?? DIRECT_READ_MIN_BYTES;
      if (p.reuse[i] === undefined && (w.stat.mode & S_IFMT) === S_IFREG && w.stat.nlink === 1 && w.stat.size >= min && prior !== undefined && priorDataSize(prior) > 0) direct.add(i);
    });
    // Each costs a tar process of its own (a fork of this large process, the dearer part when many
    // files changed: ten changed 10 MiB files took ~1.5x as long this way as through one tar, measured).
    if (direct.size > DIRECT_READ_MAX_FILES) direct.clear();
  }
  const toRead = walk.filter((_, i) => p.reuse[i] === undefined && !direct.has(i));
  const smallRest = toRead.reduce((n, w) => n + ((w.stat.mode & S_IFMT) === S_IFREG ? w.stat.size : 0), 0) <= SHARED_RUN_MAX_BYTES;
  /** The large file whose header comes last in the one tar run (see SHARED_RUN_MAX_BYTES), if any. */
  const shared = direct.size === 1 && toRead.length > 0 && smallRest ? [...direct][0]! : undefined;
  // The shared run's last entry (the large file) is converted apart, with a validator of its own:
  // readDirect admits it where it lies in the layer.
  const lastOci = new OverlayToOci(new LayerValidator(s.limits));
  const parser = new TarParser(shared === undefined ? oci : new SplitSink(oci, toRead.length, lastOci), s.limits.maxPaxHeaderBytes);
  // The other header runs start now, while the rest is read.
  const headers = new Map<number, Promise<{ entry: CapturedEntry; bytes: Buffer }>>();
  const order = [...direct].filter((i) => i !== shared);
  for (let k = 0; k < order.length; k++) {
    const i = order[k]!;
    const before = k >= HEADER_RUNS ? headers.get(order[k - HEADER_RUNS]!)!.then(() => undefined, () => undefined) : Promise.resolve();
    const h = before.then(() => headerOnly(upperDir, tarName(walk[i]!.key), s.limits, options.tarPath));
    h.catch(() => undefined); // awaited in order below
    headers.set(i, h);
  }
  const names = toRead.map((w) => tarName(w.key));
  if (shared !== undefined) names.push(tarName(walk[shared]!.key));
  // An incremental run is usually small: from the small helper process when it fits (no fork of this
  // process; see small-process.ts), stopped at the large file's header when there is one.
  const small = (): Promise<TarRun | undefined> => {
    if (p.mode !== 'incremental') return Promise.resolve(undefined);
    const sizes = toRead.map((w) => ((w.stat.mode & S_IFMT) === S_IFREG ? w.stat.size : 0));
    if (shared !== undefined) sizes.push(0); // its header only: the helper stops tar within its allowance
    // A speed-up only: whatever goes wrong here, tar is run directly.
    return smallTarRun(upperDir, names, tarOutputBound(sizes), s.limits, options.tarPath, shared !== undefined ? names.length : undefined).catch(() => undefined);
  };
  const tar = toRead.length > 0 ? ((await small()) ?? runTar(upperDir, names, options.tarPath)) : undefined;
  let wi = 0;
  let reusedEntries = 0;

  /** The re-read entry being written: where its record started and how its bytes map to the old record. */
  let current: { w: WalkEntry; entry: CapturedEntry; start: number; dataStart: number; dataDone: number; head: number; prior: IndexEntry | undefined } | undefined;

  /** A re-read entry's header: at the old record's place when it has the old header's length. */
  const beginRecord = async (w: WalkEntry, entry: CapturedEntry, head: Buffer): Promise<void> => {
    if (normalizeEntryPath(keyText(w.key), s.limits) !== entry.source) throw new LayerTransferError('capture_failed', `tar archived ${entry.source}, expected ${keyText(w.key)}`);
    const prior = priorOf.get(w.key);
    current = { w, entry, start: assembler.position, dataStart: 0, dataDone: 0, head: head.length, prior };
    if (prior !== undefined && prior.dataStart - prior.start === head.length) await assembler.predicted(head, prior.start, sameSize(prior, entry) ? prior.end : prior.dataStart + Math.min(priorDataSize(prior), entry.size));
    else await assembler.fresh(head);
    current.dataStart = assembler.position;
  };

  /** File data at its old place (an append or an in-place edit keeps most of it there). */
  const recordData = async (bytes: Buffer): Promise<void> => {
    const c = current!;
    const prior = c.prior;
    const oldSize = prior === undefined ? 0 : priorDataSize(prior);
    const sameHead = prior !== undefined && prior.dataStart - prior.start === c.head;
    const spanEnd = prior === undefined ? 0 : sameSize(prior, c.entry) && sameHead ? prior.end : prior.dataStart + Math.min(oldSize, c.entry.size);
    let i = 0;
    if (prior !== undefined && c.dataDone < oldSize) {
      const n = Math.min(bytes.length, oldSize - c.dataDone);
      await assembler.predicted(bytes.subarray(0, n), prior.dataStart + c.dataDone, spanEnd);
      i = n;
    }
    if (i < bytes.length) await assembler.fresh(bytes.subarray(i));
    c.dataDone += bytes.length;
  };

  /** Padding (and an opaque dir's marker entry): at its old place when the size is unchanged. */
  const endRecord = async (tail: Buffer): Promise<void> => {
    const c = current!;
    const prior = c.prior;
    if (prior !== undefined && sameSize(prior, c.entry) && prior.dataStart - prior.start === c.head) await assembler.predicted(tail, prior.dataStart + c.entry.size, prior.end);
    else await assembler.fresh(tail);
    const linkName = c.entry.type === 'symlink' ? c.entry.linkName : undefined;
    entries.push(indexEntryOf(c.w, c.start, c.dataStart, assembler.position, reusableNext(c.w, c.entry, rootDev, s.nowNs), linkName));
    current = undefined;
    wi += 1;
  };

  /** A large re-read file: its header from tar, its data read here. */
  const readDirect = async (w: WalkEntry, index: number): Promise<void> => {
    const { entry, bytes } = await headers.get(index)!;
    if (entry.type !== 'file' || entry.size !== w.stat.size) throw new LayerTransferError('capture_failed', `${keyText(w.key)} changed during the capture`);
    validator.admit({ name: entry.name, type: 'file', size: entry.size, xattrNames: entry.xattrNames });
    await beginRecord(w, entry, bytes);
    const fh = await open(Buffer.concat([Buffer.from(upperDir), Buffer.from('/'), Buffer.from(w.key, 'latin1')]), 'r');
    try {
      // Two blocks: the next one is read while this one is hashed and chunked.
      const blocks = [Buffer.allocUnsafe(Math.min(DIRECT_READ_BLOCK, entry.size)), Buffer.allocUnsafe(Math.min(DIRECT_READ_BLOCK, entry.size))];
      const readAt = (at: number, k: number) => fh.read(blocks[k % 2]!, 0, Math.min(DIRECT_READ_BLOCK, entry.size - at), at);
      let next = entry.size > 0 ? readAt(0, 0) : undefined;
      for (let at = 0, k = 0; next !== undefined; k++) {
        const { bytesRead } = await next;
        if (bytesRead === 0) throw new LayerTransferError('capture_failed', `${keyText(w.key)} shrank during the capture`);
        const block = blocks[k % 2]!.subarray(0, bytesRead);
        at += bytesRead;
        next = at < entry.size ? readAt(at, k + 1) : undefined;
        next?.catch(() => undefined); // awaited next round
        await recordData(block);
      }
    } finally {
      await fh.close();
    }
    await endRecord(dataPadding(entry.size));
  };

  /** The entries from walk[wi] on that tar does not read: unchanged records (copied in runs of adjacent ones), and large files read here. */
  const advance = async (): Promise<void> => {
    for (;;) {
      if (wi < walk.length && direct.has(wi)) {
        await readDirect(walk[wi]!, wi);
        continue;
      }
      if (wi >= walk.length || p.reuse[wi] === undefined) return;
      const first = p.reuse[wi]!;
      const base = assembler.position;
      let end = first.start;
      while (wi < walk.length && p.reuse[wi] !== undefined && p.reuse[wi]!.start === end) {
        const o = p.reuse[wi]!;
        const w = walk[wi]!;
        // Admitted again: the new layer as a whole must pass the same rules as any other.
        const type = (w.stat.mode & S_IFMT) === S_IFDIR ? 'directory' : (w.stat.mode & S_IFMT) === S_IFLNK ? 'symlink' : 'file';
        const name = normalizeEntryPath(keyText(w.key), s.limits);
        validator.admit({ name, type, size: type === 'file' ? w.stat.size : 0, ...(o.linkName !== undefined ? { linkName: o.linkName } : {}) });
        entries.push(indexEntryOf(w, base + (o.start - first.start), base + (o.dataStart - first.start), base + (o.end - first.start), true, o.linkName));
        end = o.end;
        wi += 1;
        reusedEntries += 1;
      }
      await assembler.copy(first.start, end);
    }
  };

  const onEvent = async (e: CaptureEvent): Promise<void> => {
    if (e.kind === 'head') {
      await advance();
      const w = walk[wi];
      if (w === undefined) throw new LayerTransferError('capture_failed', `tar archived ${e.entry.source}, expected nothing more`);
      await beginRecord(w, e.entry, e.bytes);
    } else if (e.kind === 'data') await recordData(e.bytes);
    else await endRecord(e.bytes);
  };

  try {
    if (tar !== undefined && shared !== undefined) {
      // The small entries' events are kept until the large file's header is out, then tar is
      // stopped (its data is read directly) and they are processed in order.
      const kept: CaptureEvent[] = [];
      let keptBytes = 0;
      let head: CaptureEvent | undefined;
      for await (const piece of tar.stdout) {
        parser.push(piece);
        for (const e of oci.events) keptBytes += e.bytes.length;
        kept.push(...oci.events);
        oci.events.length = 0;
        if (keptBytes > 2 * SHARED_RUN_MAX_BYTES + 1024 * 1024) throw new LayerTransferError('capture_failed', `${upperDir} changed during the capture (re-read entries grew)`);
        head = lastOci.events.find((e) => e.kind === 'head');
        if (head !== undefined) break;
      }
      tar.kill();
      if (head === undefined || head.kind !== 'head') {
        await tar.done; // tar's own failure says more, if it failed
        throw new LayerTransferError('capture_failed', `tar gave no header for ${keyText(walk[shared]!.key)}`);
      }
      headers.set(shared, Promise.resolve({ entry: head.entry, bytes: head.bytes }));
      for (const e of kept) await onEvent(e);
    } else if (tar !== undefined) {
      for await (const piece of tar.stdout) {
        parser.push(piece);
        for (const e of oci.events) await onEvent(e);
        oci.events.length = 0;
      }
      await tar.done;
      parser.end();
    }
    await advance();
    if (wi !== walk.length) throw new LayerTransferError('capture_failed', `tar archived ${wi} of ${walk.length} entries`);
    await assembler.fresh(END_OF_ARCHIVE);
    await assembler.finish();
  } catch (err) {
    tar?.kill();
    await sink.abort();
    throw err;
  }
  const flushed = await sink.flush();
  const gone = [...checkOf].filter(([k, c]) => reused.has(k) && flushed.missing.includes(c));
  if (gone.length > 0) throw new ReuseUnavailable(`${gone.length} reused chunk(s) are no longer in the store`);
  const chunks = items.map((it) => ('fresh' in it ? flushed.refs[it.fresh]! : p.previous!.layer.chunks[it.old]!));
  const size = chunks.reduce((n, c) => n + c.size, 0);
  if (size !== assembler.position) throw new LayerTransferError('capture_failed', `chunked ${size} bytes of a ${assembler.position}-byte layer`);
  const digest = version === 1 ? flushed.layerDigest : chunkListDigest(chunks);
  if (digest === null) throw new LayerTransferError('capture_failed', 'layer was not hashed');
  const layer: LayerRef = { digest, size, chunks };
  const root = walk[0]!.stat;
  return {
    layer,
    entries: validator.entryCount,
    stats: { chunks: chunks.length, bytes: size, storedChunks: flushed.stats.storedChunks, storedBytes: flushed.stats.storedBytes },
    capture: {
      mode: p.mode,
      reason: p.reason,
      why: p.why,
      walkedEntries: walk.length,
      readEntries: toRead.length + direct.size,
      directEntries: direct.size,
      reusedEntries,
      reusedBytes: assembler.stats.reusedBytes,
      verifiedBytes: assembler.stats.verifiedBytes,
      oldBytesRead: assembler.stats.oldBytesRead,
    },
    index: {
      version: CAPTURE_INDEX_VERSION,
      format: s.format,
      containerId: options.containerId ?? '',
      upperDir,
      rootDev: root.dev,
      rootIno: root.ino,
      capturesSinceFull: p.mode === 'full' ? 0 : p.previous!.capturesSinceFull + 1,
      layer,
      entries,
    },
  };
}

/** Sends the first `count` tar entries to `first`, the rest to `rest`. */
class SplitSink implements TarSink {
  private seen = 0;
  private current: TarSink;

  constructor(
    private readonly first: TarSink,
    private readonly count: number,
    private readonly rest: TarSink,
  ) {
    this.current = first;
  }

  entry(h: TarHeader): void {
    this.current = this.seen++ < this.count ? this.first : this.rest;
    this.current.entry(h);
  }

  data(slice: Buffer): void {
    this.current.data(slice);
  }

  entryEnd(): void {
    this.current.entryEnd();
  }
}

/** Shared-memory slabs kept for reuse per capture: the publish worker's window (32 chunks) and the chunker's own. */
const SLAB_POOL = 6;

/**
 * Shared-memory slabs for the chunker, each reused once the chunker has moved on from it and every
 * chunk cut from it was published (the worker reads chunks in place until then).
 */
class SlabPool {
  private readonly free: SharedArrayBuffer[] = [];
  private readonly uses = new Map<ArrayBufferLike, { chunks: number; retired: boolean }>();
  private current: SharedArrayBuffer | undefined;

  constructor(private readonly keep: number) {}

  readonly allocate = (size: number): Buffer => {
    const reuse = this.free.length > 0 && this.free[this.free.length - 1]!.byteLength === size;
    const slab = reuse ? this.free.pop()! : new SharedArrayBuffer(size);
    this.uses.set(slab, { chunks: 0, retired: false });
    // Only now is the previous slab retired: the chunker still copies its tail into the new one.
    const previous = this.current;
    this.current = slab;
    if (previous !== undefined) {
      const u = this.uses.get(previous)!;
      u.retired = true;
      if (u.chunks === 0) this.recycle(previous);
    }
    return Buffer.from(slab);
  };

  /** A chunk was cut from its slab and goes to the worker. */
  cut(chunk: Buffer): void {
    const u = this.uses.get(chunk.buffer);
    if (u !== undefined) u.chunks += 1;
  }

  /** The worker is done with a chunk. */
  done(chunk: Buffer): void {
    const u = this.uses.get(chunk.buffer);
    if (u === undefined) return;
    u.chunks -= 1;
    if (u.chunks === 0 && u.retired) this.recycle(chunk.buffer as SharedArrayBuffer);
  }

  private recycle(slab: SharedArrayBuffer): void {
    this.uses.delete(slab);
    if (this.free.length < this.keep) this.free.push(slab);
  }
}

/** The old layer's byte ranges the plan copies, as contiguous runs of adjacent old records. */
function reusedRuns(p: Plan): { start: number; end: number }[] {
  const runs: { start: number; end: number }[] = [];
  for (const o of p.reuse) {
    if (o === undefined) continue;
    const last = runs[runs.length - 1];
    if (last !== undefined && last.end === o.start) last.end = o.end;
    else runs.push({ start: o.start, end: o.end });
  }
  return runs.filter((r) => r.end > r.start);
}

/** Index of the chunk holding offset `o` (offsets as in layer-assembler.ts OldLayer). */
function containing(offsets: readonly number[], o: number): number {
  let lo = 0;
  let hi = offsets.length - 2;
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1;
    if (offsets[mid]! <= o) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** Data bytes in an old record: a regular file's size (a directory's st_size is no data), within the record. */
function priorDataSize(prior: IndexEntry): number {
  return (prior.stat.mode & S_IFMT) === S_IFREG ? Math.min(prior.stat.size, prior.end - prior.dataStart) : 0;
}

/** The old record holds as much data as the new entry (none, for anything but files). */
function sameSize(prior: IndexEntry, entry: CapturedEntry): boolean {
  return priorDataSize(prior) === entry.size;
}
