// The per-host chunk cache (host-agent/layer/chunk-cache.ts) on a real temp dir: every read verified,
// write-once names, a hard size bound with least-recently-used eviction that never touches pinned
// chunks, and an index rebuilt from the directory by a new process.
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { ChunkRef } from '../../../src/core/checkpoint-manifest.ts';
import { ChunkCache } from '../../../src/host-agent/layer/chunk-cache.ts';

const root = mkdtempSync(join(tmpdir(), 'sf-chunk-cache-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
const freshDir = (): string => join(root, `c${n++}`);

function chunk(size = 1000): { ref: ChunkRef; data: Buffer } {
  const data = randomBytes(size);
  return { ref: { digest: `sha256:${createHash('sha256').update(data).digest('hex')}`, size }, data };
}
const fileOf = (dir: string, ref: ChunkRef): string => join(dir, 'sha256', ref.digest.slice(7, 9), ref.digest.slice(7));

describe('ChunkCache', () => {
  it('returns what was put, and only what verifies', async () => {
    const dir = freshDir();
    const cache = await ChunkCache.open({ dir, maxBytes: 1 << 20 });
    const a = chunk();
    expect(cache.has(a.ref.digest)).toBe(false);
    expect(await cache.get(a.ref)).toBeUndefined();
    expect(await cache.put(a.ref, a.data)).toBe(true);
    expect(cache.has(a.ref.digest)).toBe(true);
    expect(await cache.get(a.ref)).toEqual(a.data);

    // Damaged on disk: never returned, deleted, counted; the next put stores it again.
    writeFileSync(fileOf(dir, a.ref), Buffer.alloc(1000));
    expect(await cache.get(a.ref)).toBeUndefined();
    expect(cache.stats.corrupt).toBe(1);
    expect(existsSync(fileOf(dir, a.ref))).toBe(false);
    expect(await cache.put(a.ref, a.data)).toBe(true);
    expect(await cache.get(a.ref)).toEqual(a.data);
    // A wrong size claim is never stored.
    const b = chunk();
    expect(await cache.put({ ...b.ref, size: 999 }, b.data)).toBe(false);
  });

  it('never replaces a file under a name (write-once): a planted file stays and fails verification', async () => {
    const dir = freshDir();
    const cache = await ChunkCache.open({ dir, maxBytes: 1 << 20 });
    const a = chunk();
    mkdirSync(join(dir, 'sha256', a.ref.digest.slice(7, 9)), { recursive: true });
    writeFileSync(fileOf(dir, a.ref), 'planted');
    expect(await cache.put(a.ref, a.data)).toBe(true); // link(2) found the name taken: kept as is
    expect(await cache.get(a.ref)).toBeUndefined(); // and it does not verify
    expect(cache.stats.corrupt).toBe(1);
    expect(readdirSync(join(dir, 'tmp'))).toEqual([]); // no temporary file left behind
  });

  it('stays within maxBytes, evicting the least recently used unpinned chunks', async () => {
    const dir = freshDir();
    const cache = await ChunkCache.open({ dir, maxBytes: 3000 });
    const [a, b, c, d] = [chunk(), chunk(), chunk(), chunk()];
    for (const x of [a!, b!, c!]) expect(await cache.put(x.ref, x.data)).toBe(true);
    expect(await cache.get(a!.ref)).toBeDefined(); // a is now more recent than b
    expect(await cache.put(d!.ref, d!.data)).toBe(true);
    expect(cache.stats.bytes).toBeLessThanOrEqual(3000);
    expect(cache.has(b!.ref.digest)).toBe(false);
    expect(existsSync(fileOf(dir, b!.ref))).toBe(false);
    expect(cache.has(a!.ref.digest)).toBe(true);
    expect(cache.has(d!.ref.digest)).toBe(true);
    // Larger than the whole cache: not stored.
    const big = chunk(4000);
    expect(await cache.put(big.ref, big.data)).toBe(false);
  });

  it('never evicts pinned chunks; a chunk that does not fit beside them is not cached', async () => {
    const dir = freshDir();
    const cache = await ChunkCache.open({ dir, maxBytes: 2000 });
    const [a, b, c] = [chunk(), chunk(), chunk()];
    const release = cache.pin([a!.ref, b!.ref]);
    expect(await cache.put(a!.ref, a!.data)).toBe(true);
    expect(await cache.put(b!.ref, b!.data)).toBe(true);
    expect(await cache.put(c!.ref, c!.data)).toBe(false);
    expect(cache.stats.skipped).toBe(1);
    expect(cache.has(a!.ref.digest) && cache.has(b!.ref.digest)).toBe(true);
    release();
    release(); // idempotent
    expect(await cache.put(c!.ref, c!.data)).toBe(true);
    expect(cache.stats.bytes).toBeLessThanOrEqual(2000);
  });

  it('is one instance per directory, and a new process rebuilds its index from the directory', async () => {
    const dir = freshDir();
    const cache = await ChunkCache.open({ dir, maxBytes: 10_000 });
    expect(await ChunkCache.open({ dir, maxBytes: 10_000 })).toBe(cache);
    await expect(ChunkCache.open({ dir, maxBytes: 5000 })).rejects.toThrow(RangeError);
    const a = chunk();
    await cache.put(a.ref, a.data);
    writeFileSync(join(dir, 'tmp', 'half-written'), 'x');
    writeFileSync(join(dir, 'sha256', a.ref.digest.slice(7, 9), 'not-a-digest'), 'x');
    // Another path to the same directory stands in for another process (the instance is per path).
    const alias = join(root, `alias${n++}`);
    symlinkSync(dir, alias);
    const reopened = await ChunkCache.open({ dir: alias, maxBytes: 10_000 });
    expect(reopened).not.toBe(cache);
    expect(reopened.has(a.ref.digest)).toBe(true);
    expect(reopened.stats.bytes).toBe(1000);
    expect(await reopened.get(a.ref)).toEqual(a.data);
    expect(readdirSync(join(dir, 'tmp'))).toEqual([]);
    expect(readdirSync(join(dir, 'sha256', a.ref.digest.slice(7, 9)))).toEqual([a.ref.digest.slice(7)]);
  });

  it('rebuilding a directory over the bound evicts down to it', async () => {
    const dir = freshDir();
    const big = await ChunkCache.open({ dir, maxBytes: 10_000 });
    for (let i = 0; i < 5; i++) {
      const x = chunk();
      await big.put(x.ref, x.data);
    }
    const alias = join(root, `alias${n++}`);
    symlinkSync(dir, alias);
    const small = await ChunkCache.open({ dir: alias, maxBytes: 2500 });
    expect(small.stats.bytes).toBeLessThanOrEqual(2500);
    expect(small.stats.chunks).toBe(2);
  });
});
