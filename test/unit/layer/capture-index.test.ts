// The per-host capture index (host-agent/layer/capture-index.ts, issue #17): it round-trips, and
// anything damaged, foreign or inconsistent reads as "no index" (a full capture), never as a
// different index.
import { mkdtemp, readFile, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { CaptureIndexStore, parseCaptureIndex, serializeCaptureIndex, type CaptureIndex } from '../../../src/host-agent/layer/capture-index.ts';

const D = (c: string): string => `sha256:${c.repeat(64)}`;
const stat = { dev: 2049n, ino: 77n, mode: 0o100644, nlink: 1, uid: 1000, gid: 1000, size: 10, mtimeNs: 1_700_000_000_123_456_789n, ctimeNs: 1_700_000_001_000_000_001n };

function sample(): CaptureIndex {
  return {
    version: 1,
    format: 'fastcdc-1-2-3;tar-1',
    containerId: 'c1',
    upperDir: '/var/lib/docker/overlay2/x/diff',
    rootDev: 2049n,
    rootIno: 2n,
    capturesSinceFull: 3,
    layer: { digest: D('a'), size: 3072, chunks: [{ digest: D('b'), size: 1024 }, { digest: D('c'), size: 2048 }] },
    entries: [
      { key: '.', stat: { ...stat, ino: 2n, mode: 0o40755 }, start: 0, dataStart: 512, end: 512, reusable: true },
      { key: 'f\u00ff', stat, start: 512, dataStart: 1024, end: 1536, reusable: false },
      { key: 'l', stat: { ...stat, ino: 78n, mode: 0o120777 }, start: 1536, dataStart: 2048, end: 2048, reusable: true, linkName: '../x' },
    ],
  };
}

let dir: string | undefined;
afterEach(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
  dir = undefined;
});

describe('capture index', () => {
  it('round-trips, nanosecond times and raw names included', () => {
    const text = serializeCaptureIndex(sample());
    expect(parseCaptureIndex(text)).toEqual(sample());
  });

  it('a damaged, truncated or inconsistent index reads as none', () => {
    const text = serializeCaptureIndex(sample());
    expect(parseCaptureIndex(text.slice(0, -5))).toBeUndefined();
    expect(parseCaptureIndex(text.replace('"c1"', '"c2"'))).toBeUndefined(); // checksum
    expect(parseCaptureIndex('')).toBeUndefined();
    const resealed = (mutate: (i: CaptureIndex) => CaptureIndex): CaptureIndex | undefined => parseCaptureIndex(serializeCaptureIndex(mutate(sample())));
    expect(resealed((i) => ({ ...i, layer: { ...i.layer, size: 3073 } }))).toBeUndefined(); // chunks do not add up
    expect(resealed((i) => ({ ...i, entries: [i.entries[1]!, i.entries[0]!] }))).toBeUndefined(); // records out of order
    expect(resealed((i) => ({ ...i, entries: [{ ...i.entries[0]!, end: 4000 }] }))).toBeUndefined(); // outside the layer
    expect(resealed((i) => ({ ...i, version: 2 as 1 }))).toBeUndefined();
  });

  it('is kept per group member, used only for the container it was taken of, replaced atomically, pruned when stale', async () => {
    dir = await mkdtemp(join(tmpdir(), 'sf-index-'));
    const store = new CaptureIndexStore(dir, 10 * 24 * 3_600_000);
    expect(await store.load('g1', 'm1', 'c1')).toBeUndefined();
    await store.save('g1', 'm1', sample(), 0);
    expect(await store.load('g1', 'm1', 'c1')).toEqual(sample());
    expect(await store.load('g1', 'm1', 'c2')).toBeUndefined();
    expect(await store.load('g1', 'm2', 'c1')).toBeUndefined();
    await writeFile(join(dir, 'g1', 'm1.idx'), (await readFile(join(dir, 'g1', 'm1.idx'), 'utf8')).replace('"c1"', '"c9"'));
    expect(await store.load('g1', 'm1', 'c9')).toBeUndefined(); // tampered: checksum
    await expect(store.load('../x', 'm1', 'c1')).rejects.toThrow(RangeError);
    // An index untouched for longer than the age limit goes at the next save (at most hourly).
    await store.save('g2', 'm1', sample(), 0);
    await utimes(join(dir, 'g2', 'm1.idx'), new Date(0), new Date(0));
    await store.save('g1', 'm1', sample(), Date.now());
    expect(await store.load('g2', 'm1', 'c1')).toBeUndefined();
    expect(await store.load('g1', 'm1', 'c1')).toEqual(sample());
    await store.drop('g1', 'm1');
    expect(await store.load('g1', 'm1', 'c1')).toBeUndefined();
  });
});
