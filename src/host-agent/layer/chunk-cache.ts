// Per-host content-addressed cache of checkpoint chunks on local disk (issue #11 item 3, #17).
// Restore reads a layer twice (validate every header, THEN extract): the first pass stores each
// chunk it fetched here, the second reads them back instead of fetching again, and a group returning
// to a host it left fetches only the chunks the cache lacks.
// Never trusted: a file is named by the sha256 of the chunk it should hold and every read checks
// size and digest; one that does not verify (torn write after a crash, disk error, tampering) is
// deleted and counted as a miss, so the caller fetches the chunk from the store again.
// Write-once: a chunk is written to a temporary file and linked to its name with link(2), which
// never replaces an existing file; no fsync (a torn file only fails verification).
// Bounded: at most `maxBytes` of chunk files; least recently used chunks are evicted first, never
// those pinned by a restore in progress; a chunk that does not fit is not cached (the second pass
// then fetches it). One process owns a directory: the index of sizes and uses is kept in memory
// (rebuilt from the directory at first use), and open() returns one shared instance per directory.
import { createHash, randomBytes } from 'node:crypto';
import { link, mkdir, open, readdir, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { ChunkRef } from '../../core/checkpoint-manifest.ts';

export interface ChunkCacheOptions {
  /** Directory of the cache (created if absent). */
  readonly dir: string;
  /** Bytes of chunk files kept at most; 0 disables the cache. */
  readonly maxBytes: number;
}

export interface ChunkCacheStats {
  bytes: number;
  chunks: number;
  hits: number;
  misses: number;
  /** Files that did not verify on read (deleted). */
  corrupt: number;
  evicted: number;
  /** Chunks not stored because the pinned chunks already fill the cache, or the write failed. */
  skipped: number;
}

interface Entry {
  readonly size: number;
  lastUsed: number;
  /** False while its file is being written: reads miss it and eviction leaves it alone. */
  ready: boolean;
}

const HEX64 = /^[0-9a-f]{64}$/;
/** After an eviction the cache is this full at most, so one put does not evict one chunk at a time. */
const EVICT_TO = 0.9;

const instances = new Map<string, Promise<ChunkCache>>();

/** `file` read into a buffer of its own when it holds exactly `size` bytes; undefined otherwise. */
async function readExactly(file: string, size: number): Promise<Buffer | undefined> {
  const fh = await open(file, 'r');
  try {
    if ((await fh.stat()).size !== size) return undefined;
    const data = Buffer.allocUnsafeSlow(size);
    let at = 0;
    while (at < size) {
      const { bytesRead } = await fh.read(data, at, size - at, at);
      if (bytesRead === 0) return undefined;
      at += bytesRead;
    }
    return data;
  } finally {
    await fh.close();
  }
}

export class ChunkCache {
  readonly stats: ChunkCacheStats = { bytes: 0, chunks: 0, hits: 0, misses: 0, corrupt: 0, evicted: 0, skipped: 0 };
  private readonly entries = new Map<string, Entry>();
  private readonly pins = new Map<string, number>();
  private clock = 0;

  private constructor(
    readonly dir: string,
    readonly maxBytes: number,
  ) {}

  /** The cache of `dir` (one instance per directory in this process); its index is built once. */
  static open(options: ChunkCacheOptions): Promise<ChunkCache> {
    if (!Number.isSafeInteger(options.maxBytes) || options.maxBytes < 0) throw new RangeError(`cache maxBytes must be a non-negative integer, got ${options.maxBytes}`);
    let cache = instances.get(options.dir);
    if (cache === undefined) {
      cache = ChunkCache.load(options.dir, options.maxBytes);
      instances.set(options.dir, cache);
      cache.catch(() => instances.delete(options.dir));
    }
    return cache.then((c) => {
      if (c.maxBytes !== options.maxBytes) throw new RangeError(`chunk cache ${options.dir} is already open with maxBytes ${c.maxBytes}`);
      return c;
    });
  }

  private static async load(dir: string, maxBytes: number): Promise<ChunkCache> {
    const cache = new ChunkCache(dir, maxBytes);
    await rm(join(dir, 'tmp'), { recursive: true, force: true }); // writes a crash left half done
    await mkdir(join(dir, 'tmp'), { recursive: true, mode: 0o700 });
    await mkdir(join(dir, 'sha256'), { recursive: true, mode: 0o700 });
    // Rebuild the index, oldest use first (mtime: when it was written; reads do not touch it).
    const found: { digest: string; size: number; mtimeMs: number }[] = [];
    for (const prefix of await readdir(join(dir, 'sha256'))) {
      for (const name of await readdir(join(dir, 'sha256', prefix)).catch(() => [] as string[])) {
        const file = join(dir, 'sha256', prefix, name);
        if (!HEX64.test(name) || !name.startsWith(prefix)) {
          await rm(file, { force: true, recursive: true });
          continue;
        }
        const st = await stat(file).catch(() => undefined);
        if (st?.isFile()) found.push({ digest: `sha256:${name}`, size: st.size, mtimeMs: st.mtimeMs });
      }
    }
    found.sort((a, b) => a.mtimeMs - b.mtimeMs);
    for (const f of found) cache.add(f.digest, f.size, true);
    await cache.evictOver(maxBytes);
    return cache;
  }

  get enabled(): boolean {
    return this.maxBytes > 0;
  }

  private fileOf(digest: string): string {
    const hex = digest.slice('sha256:'.length);
    if (!digest.startsWith('sha256:') || !HEX64.test(hex)) throw new RangeError(`not a sha256 digest: ${digest}`);
    return join(this.dir, 'sha256', hex.slice(0, 2), hex);
  }

  private add(digest: string, size: number, ready: boolean): void {
    this.entries.set(digest, { size, lastUsed: ++this.clock, ready });
    this.stats.bytes += size;
    this.stats.chunks += 1;
  }

  private drop(digest: string): void {
    const e = this.entries.get(digest);
    if (e === undefined) return;
    this.entries.delete(digest);
    this.stats.bytes -= e.size;
    this.stats.chunks -= 1;
  }

  /** Whether the index lists the chunk as written (a later get() may still miss: it verifies). */
  has(digest: string): boolean {
    return this.entries.get(digest)?.ready === true;
  }

  /**
   * Keep these chunks from eviction until the returned release is called (a restore between its
   * validation pass and its extraction pass).
   */
  pin(refs: readonly ChunkRef[]): () => void {
    const digests = [...new Set(refs.map((r) => r.digest))];
    for (const d of digests) this.pins.set(d, (this.pins.get(d) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      for (const d of digests) {
        const n = (this.pins.get(d) ?? 1) - 1;
        if (n <= 0) this.pins.delete(d);
        else this.pins.set(d, n);
      }
    };
  }

  /** The chunk's bytes if cached AND they verify (size and sha256); otherwise undefined. A buffer of its own (transferable). */
  async get(ref: ChunkRef): Promise<Buffer | undefined> {
    const entry = this.entries.get(ref.digest);
    if (entry === undefined || !entry.ready) {
      this.stats.misses += 1;
      return undefined;
    }
    const file = this.fileOf(ref.digest);
    let data: Buffer | undefined;
    try {
      data = await readExactly(file, ref.size);
    } catch {
      this.drop(ref.digest); // gone from disk (removed by hand): forget it
      this.stats.misses += 1;
      return undefined;
    }
    if (data === undefined || `sha256:${createHash('sha256').update(data).digest('hex')}` !== ref.digest) {
      this.drop(ref.digest);
      this.stats.corrupt += 1;
      this.stats.misses += 1;
      await unlink(file).catch(() => undefined);
      return undefined;
    }
    entry.lastUsed = ++this.clock;
    this.stats.hits += 1;
    return data;
  }

  /**
   * Store a chunk the caller has verified against `ref` (it came from the store, which verifies
   * every chunk). Returns false when it is not cached (no room beside pinned chunks, or a write
   * error such as a full disk: the cache is an optimisation, never a reason to fail a restore).
   */
  async put(ref: ChunkRef, data: Uint8Array): Promise<boolean> {
    if (!this.enabled || data.length !== ref.size) return false;
    const existing = this.entries.get(ref.digest);
    if (existing !== undefined) {
      existing.lastUsed = ++this.clock;
      return true;
    }
    if (ref.size > this.maxBytes || !(await this.makeRoom(ref.size))) {
      this.stats.skipped += 1;
      return false;
    }
    const file = this.fileOf(ref.digest);
    const tmp = join(this.dir, 'tmp', `${ref.digest.slice(7, 23)}-${randomBytes(6).toString('hex')}`);
    // Reserve the room now: concurrent puts must not overshoot the bound while this one writes.
    this.add(ref.digest, ref.size, false);
    try {
      await writeFile(tmp, data, { mode: 0o600 });
      await mkdir(join(this.dir, 'sha256', ref.digest.slice(7, 9)), { recursive: true, mode: 0o700 });
      try {
        await link(tmp, file); // never replaces: write-once
      } catch (err) {
        // Already there (an earlier process wrote it): keep that one; reads verify it anyway.
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      const entry = this.entries.get(ref.digest);
      if (entry !== undefined) entry.ready = true;
      return true;
    } catch {
      this.drop(ref.digest);
      this.stats.skipped += 1;
      return false;
    } finally {
      await unlink(tmp).catch(() => undefined);
    }
  }

  /**
   * Remove these chunks unless a restore still pins them (those of a refused layer: a hostile
   * checkpoint must not be able to push everything useful out of the cache).
   */
  async discard(refs: readonly ChunkRef[]): Promise<void> {
    for (const digest of new Set(refs.map((r) => r.digest))) {
      if (this.pins.has(digest) || this.entries.get(digest)?.ready !== true) continue;
      this.drop(digest);
      await unlink(this.fileOf(digest)).catch(() => undefined);
    }
  }

  /** Evict unpinned chunks, least recently used first, until `size` more bytes fit. */
  private async makeRoom(size: number): Promise<boolean> {
    if (this.stats.bytes + size <= this.maxBytes) return true;
    await this.evictOver(Math.floor(this.maxBytes * EVICT_TO) - size);
    return this.stats.bytes + size <= this.maxBytes;
  }

  private async evictOver(target: number): Promise<void> {
    if (this.stats.bytes <= target) return;
    const victims = [...this.entries].filter(([d, e]) => e.ready && !this.pins.has(d)).sort((a, b) => a[1].lastUsed - b[1].lastUsed);
    for (const [digest] of victims) {
      if (this.stats.bytes <= target) break;
      this.drop(digest);
      this.stats.evicted += 1;
      await unlink(this.fileOf(digest)).catch(() => undefined);
    }
  }
}
