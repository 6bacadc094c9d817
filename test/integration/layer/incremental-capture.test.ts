// Incremental capture equals full capture (issue #17), on real upper dirs (tmp dirs built as root:
// whiteout char devices, opaque and user xattrs, hard links, symlinks, owners, modes), GNU tar and a
// real nats-server. A property: from a random tree, capture in full; apply random changes
// (rewrites, same-second rewrites whose mtime is put back, appends, in-place patches, truncations,
// deletions, renames, whiteouts, opaque dirs, xattrs, chmod/chown, new hard links and symlinks);
// capture incrementally from the first capture's index and in full: the two layers must be the same
// chunks (so the same bytes), and the incremental one restores to the tree on disk, byte for byte.
// The incremental captures' tar runs come from the small helper process (small-process.ts).
// Twice per run, so an index made by an incremental capture is used too.
// Then the cases a property cannot reach: entries written within the racy margin are re-read, a
// stat that lies is corrected by the periodic full read, a reused chunk that garbage collection
// removed makes the capture full, and an index of another upper dir or container is not used.
// Test seams, named: `nowMs` moves the capture's clock 10 s ahead so files written a moment ago are
// past the racy margin (as for a checkpoint taken a little after the last write); the nats-server
// fsyncs on an interval (durability is not what this tests, and runs stay fast).
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { appendFileSync, chmodSync, existsSync, lchownSync, linkSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, renameSync, rmSync, statSync, symlinkSync, truncateSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatsConnection } from '@nats-io/transport-node';
import type { ChunkerOptions } from '../../../src/host-agent/layer/fastcdc.ts';
import { INLINE_PASSES } from '../../../src/host-agent/layer/restore.ts';
import { fetchLayer, storeLayer, type StoreLayerOptions, type StoredLayer } from '../../../src/host-agent/layer/layer-transfer.ts';
import { smallTarRunsUsedCount } from '../../../src/host-agent/layer/capture.ts';
import { ChunkStore } from '../../../src/store/chunk-store.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

/** Small chunks, so files of a few KiB span several chunks and chunks span several entries. */
const CHUNKER: ChunkerOptions = { minSize: 256, avgSize: 1024, maxSize: 4096 };
const LATER = (): number => Date.now() + 10_000;

let nats: TestNats;
let nc: NatsConnection;
let store: ChunkStore;
let work: string;
let seq = 0;

beforeAll(async () => {
  nats = await startTestNats({ fsync: { intervalMs: 60_000 } });
  nc = await nats.connect('incremental-test');
  store = await ChunkStore.open(nc);
  work = mkdtempSync(join(tmpdir(), 'sf-incr-'));
});

afterAll(async () => {
  await nats?.cleanup();
  if (work) rmSync(work, { recursive: true, force: true });
});

interface Node {
  type: string;
  mode: number;
  uid: number;
  gid: number;
  content?: string;
  mtimeNs?: string;
  target?: string;
  rdev?: number;
  inodeGroup?: string;
}

/** Everything a restore must reproduce, per path: type, mode, owner, content, file mtime (ns), link target, hard-link group. */
function snapshot(root: string): Record<string, Node> {
  const out: Record<string, Node> = {};
  const byInode = new Map<bigint, string>();
  const walk = (rel: string): void => {
    const st = lstatSync(join(root, rel), { bigint: true });
    const type = st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : st.isCharacterDevice() ? 'char' : st.isFile() ? 'file' : 'other';
    const node: Node = type === 'char' ? { type, mode: 0, uid: 0, gid: 0, rdev: Number(st.rdev) } : { type, mode: Number(st.mode) & 0o7777, uid: Number(st.uid), gid: Number(st.gid) };
    if (type === 'file') {
      node.content = createHash('sha256').update(readFileSync(join(root, rel))).digest('hex');
      node.mtimeNs = String(st.mtimeNs);
      const first = byInode.get(st.ino) ?? rel;
      byInode.set(st.ino, first);
      node.inodeGroup = first;
    }
    if (type === 'symlink') node.target = readlinkSync(join(root, rel));
    out[rel || '.'] = node;
    if (type === 'dir') for (const name of readdirSync(join(root, rel)).sort()) walk(rel ? `${rel}/${name}` : name);
  };
  walk('');
  return out;
}

/** All xattrs (incl. trusted.*) of each tree, paths relative, hex-encoded: one getfattr for both. */
function xattrsOf(a: string, b: string): [string, string] {
  const dump = execFileSync('getfattr', ['--no-dereference', '--dump', '--match=-', '--encoding=hex', '--recursive', '--absolute-names', a, b], { encoding: 'utf8' });
  const of = (root: string): string =>
    dump
      .split('\n\n')
      .filter((block) => block.startsWith(`# file: ${root}/`) || block.startsWith(`# file: ${root}\n`))
      .map((block) => block.replace(`# file: ${root}`, '# file: .'))
      .join('\n\n');
  return [of(a), of(b)];
}

/** Text-like bytes (the gear hash finds cut points in them, as in JSONL), from a seed. */
function bytesOf(size: number, seed: number): Buffer {
  const words = ['{"role":"user"}\n', 'alpha ', 'beta ', 'gamma ', '0123456789', 'the quick brown fox '];
  let s = '';
  let x = seed >>> 0;
  while (s.length < size) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    s += words[x % words.length]!;
  }
  return Buffer.from(s.slice(0, size));
}

// ---- the change model --------------------------------------------------------------------------

const PATHS = ['a', 'b', 'd/a', 'd/b', 'd/e/a', 'd/e/b', 'x/a', 'x/y/a'];
const DIRS = ['d', 'd/e', 'x', 'x/y'];

type Op =
  | { op: 'write'; path: string; size: number; seed: number }
  | { op: 'sameSizeRewrite'; path: string; seed: number }
  | { op: 'append'; path: string; size: number; seed: number }
  | { op: 'patch'; path: string; at: number; size: number; seed: number }
  | { op: 'truncate'; path: string; size: number }
  | { op: 'delete'; path: string }
  | { op: 'rename'; from: string; to: string }
  | { op: 'whiteout'; path: string }
  | { op: 'opaque'; dir: string }
  | { op: 'xattr'; path: string; value: number }
  | { op: 'chmod'; path: string; mode: number }
  | { op: 'chown'; path: string; uid: number }
  | { op: 'hardlink'; from: string; to: string }
  | { op: 'symlink'; path: string; target: string }
  | { op: 'mkdir'; dir: string };

const path = fc.constantFrom(...PATHS);
const anyPath = fc.constantFrom(...PATHS, ...DIRS);
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ op: fc.constant('write' as const), path, size: fc.nat(12_000), seed: fc.nat() }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('sameSizeRewrite' as const), path, seed: fc.nat() }) },
  { weight: 3, arbitrary: fc.record({ op: fc.constant('append' as const), path, size: fc.integer({ min: 1, max: 5000 }), seed: fc.nat() }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('patch' as const), path, at: fc.nat(12_000), size: fc.integer({ min: 1, max: 300 }), seed: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('truncate' as const), path, size: fc.nat(8000) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('delete' as const), path: anyPath }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('rename' as const), from: anyPath, to: anyPath }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('whiteout' as const), path }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('opaque' as const), dir: fc.constantFrom(...DIRS) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('xattr' as const), path: anyPath, value: fc.nat(9) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('chmod' as const), path: anyPath, mode: fc.constantFrom(0o600, 0o644, 0o755, 0o700) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('chown' as const), path: anyPath, uid: fc.constantFrom(0, 1000, 1234) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('hardlink' as const), from: path, to: path }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('symlink' as const), path, target: fc.constantFrom('a', '../a', '/etc/passwd', 'd/e') }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('mkdir' as const), dir: fc.constantFrom(...DIRS) }) },
);

const isFile = (p: string): boolean => existsSync(p) && lstatSync(p).isFile();
const isDir = (p: string): boolean => existsSync(p) && lstatSync(p).isDirectory();
const exists = (p: string): boolean => {
  try {
    lstatSync(p);
    return true;
  } catch {
    return false;
  }
};

/** Apply one change where it makes sense; skip it otherwise (the tree stays a valid upper dir). */
function apply(root: string, o: Op): void {
  const at = (p: string): string => join(root, p);
  /** Make p's parent directories where nothing is; false when something else is in the way. */
  const parentOk = (p: string): boolean => {
    const parts = p.split('/').slice(0, -1);
    for (let i = 1; i <= parts.length; i++) {
      const dir = at(parts.slice(0, i).join('/'));
      if (!exists(dir)) mkdirSync(dir);
      else if (!isDir(dir)) return false;
    }
    return true;
  };
  switch (o.op) {
    case 'write':
      if (parentOk(o.path) && (!exists(at(o.path)) || isFile(at(o.path)))) writeFileSync(at(o.path), bytesOf(o.size, o.seed));
      return;
    case 'sameSizeRewrite': {
      // Same size, new bytes, mtime put back: only ctime (and the bytes) say it changed.
      if (!isFile(at(o.path))) return;
      const st = statSync(at(o.path));
      writeFileSync(at(o.path), bytesOf(st.size, o.seed ^ 0x5bd1e995));
      utimesSync(at(o.path), st.atime, st.mtime);
      return;
    }
    case 'append':
      if (isFile(at(o.path))) appendFileSync(at(o.path), bytesOf(o.size, o.seed));
      return;
    case 'patch': {
      if (!isFile(at(o.path))) return;
      const data = readFileSync(at(o.path));
      const from = Math.min(o.at, data.length);
      writeFileSync(at(o.path), Buffer.concat([data.subarray(0, from), bytesOf(o.size, o.seed), data.subarray(Math.min(data.length, from + o.size))]));
      return;
    }
    case 'truncate':
      if (isFile(at(o.path))) truncateSync(at(o.path), o.size);
      return;
    case 'delete':
      if (exists(at(o.path))) rmSync(at(o.path), { recursive: true, force: true });
      return;
    case 'rename':
      // A symlink pointing up (`../a`) must not move to the top, where it would leave the layer.
      if (exists(at(o.from)) && lstatSync(at(o.from)).isSymbolicLink() && readlinkSync(at(o.from)).startsWith('../') && !o.to.includes('/')) return;
      if (exists(at(o.from)) && !exists(at(o.to)) && !o.to.startsWith(`${o.from}/`) && parentOk(o.to)) renameSync(at(o.from), at(o.to));
      return;
    case 'whiteout':
      if (!exists(at(o.path)) && parentOk(o.path)) execFileSync('mknod', [at(o.path), 'c', '0', '0']);
      return;
    case 'opaque':
      if (isDir(at(o.dir))) execFileSync('setfattr', ['-n', 'trusted.overlay.opaque', '-v', 'y', at(o.dir)]);
      return;
    case 'xattr':
      if (isFile(at(o.path)) || isDir(at(o.path))) execFileSync('setfattr', ['-h', '-n', 'user.note', '-v', `v${o.value}`, at(o.path)]);
      return;
    case 'chmod':
      if (isFile(at(o.path)) || isDir(at(o.path))) chmodSync(at(o.path), o.mode);
      return;
    case 'chown':
      if (exists(at(o.path))) lchownSync(at(o.path), o.uid, o.uid);
      return;
    case 'hardlink':
      if (isFile(at(o.from)) && !exists(at(o.to)) && parentOk(o.to)) linkSync(at(o.from), at(o.to));
      return;
    case 'symlink':
      // A relative target must stay inside the layer (capture refuses one that leaves it).
      if (o.target.startsWith('../') && !o.path.includes('/')) return;
      if (!exists(at(o.path)) && parentOk(o.path)) symlinkSync(o.target, at(o.path));
      return;
    case 'mkdir':
      if (!exists(at(o.dir)) && parentOk(o.dir)) mkdirSync(at(o.dir));
      return;
  }
}

/** Files of 4 KiB and more that changed are read directly (tar gives only their header), as large ones are in the agent. */
async function capture(upper: string, options: StoreLayerOptions = {}): Promise<StoredLayer> {
  return storeLayer(upper, store, { chunker: CHUNKER, nowMs: LATER, directReadMinBytes: 4096, ...options });
}

/** Restore `layer` into a fresh dir and expect exactly the tree of `upper` (cheaply: on this thread). */
async function expectRestoresTo(stored: StoredLayer, upper: string): Promise<void> {
  const target = join(work, `restored-${seq++}`);
  await fetchLayer(stored.layer, store, target, { passes: INLINE_PASSES });
  expect(snapshot(target)).toEqual(snapshot(upper));
  const [restored, original] = xattrsOf(target, upper);
  expect(restored).toEqual(original);
  rmSync(target, { recursive: true, force: true });
}

describe('incremental capture (reads only what changed)', () => {
  it('gives the layer a full capture gives, and it restores to the tree on disk (property)', async () => {
    let incrementalRuns = 0;
    const helperRuns = smallTarRunsUsedCount();
    await fc.assert(
      fc.asyncProperty(fc.array(opArb, { minLength: 1, maxLength: 14 }), fc.array(opArb, { maxLength: 8 }), fc.array(opArb, { maxLength: 8 }), async (initial, changes1, changes2) => {
        const upper = join(work, `upper-${seq++}`);
        mkdirSync(upper);
        try {
          for (const o of initial) apply(upper, o);
          const c0 = await capture(upper);
          expect(c0.capture.mode).toBe('full');
          let previous = c0;
          for (const changes of [changes1, changes2]) {
            for (const o of changes) apply(upper, o);
            const incremental = await capture(upper, { previous: previous.index });
            const full = await capture(upper);
            expect(incremental.capture.mode).toBe('incremental');
            expect(full.capture.mode).toBe('full');
            // The same chunks: the same layer bytes as a full capture.
            expect(incremental.layer).toEqual(full.layer);
            expect(incremental.entries).toBe(full.entries);
            if (incremental.capture.reusedEntries > 0) incrementalRuns += 1;
            previous = incremental;
          }
          // And those bytes restore to the tree on disk (the first round's layer equals a full
          // capture of its tree; restoring the last one covers the restore side).
          await expectRestoresTo(previous, upper);
        } finally {
          rmSync(upper, { recursive: true, force: true });
        }
      }),
      { numRuns: PROPERTY_RUNS },
    );
    // The property must have exercised reuse, not only re-reads, and the re-reads' tar runs from the
    // small helper process (small-process.ts), the path incremental captures take.
    expect(incrementalRuns).toBeGreaterThan(PROPERTY_RUNS);
    expect(smallTarRunsUsedCount() - helperRuns).toBeGreaterThan(PROPERTY_RUNS);
  }, 1_800_000);

  it('re-reads entries written within the racy margin of the capture that indexed them', async () => {
    const upper = join(work, 'upper-racy');
    mkdirSync(join(upper, 'd'), { recursive: true });
    writeFileSync(join(upper, 'd/f'), bytesOf(9000, 1));
    // Captured "now": everything was written within the margin, so nothing may be trusted next time.
    const c0 = await capture(upper, { nowMs: Date.now });
    expect(c0.index.entries.every((e) => !e.reusable)).toBe(true);
    // The same bytes again, size and mtime put back: a stat-only capture could not tell.
    const st = statSync(join(upper, 'd/f'));
    writeFileSync(join(upper, 'd/f'), bytesOf(9000, 2));
    utimesSync(join(upper, 'd/f'), st.atime, st.mtime);
    const c1 = await capture(upper, { previous: c0.index });
    expect(c1.capture.readEntries).toBe(c1.capture.walkedEntries);
    expect(c1.layer).toEqual((await capture(upper)).layer);
    // Written long before the capture (10 s on its clock): reusable next time.
    expect(c1.index.entries.every((e) => e.reusable)).toBe(true);
  });

  it('a stat that lies is corrected by the periodic full read', async () => {
    const upper = join(work, 'upper-liar');
    mkdirSync(upper);
    writeFileSync(join(upper, 'f'), bytesOf(20_000, 3));
    writeFileSync(join(upper, 'g'), bytesOf(5000, 4));
    const c0 = await capture(upper, { fullCaptureEvery: 3 });
    // Change f, then make the index claim f's new stat (what a lying stat would look like).
    writeFileSync(join(upper, 'f'), bytesOf(20_000, 5));
    const fStat = lstatSync(join(upper, 'f'), { bigint: true });
    const lie = {
      ...c0.index,
      entries: c0.index.entries.map((e) => (e.key === 'f' ? { ...e, stat: { ...e.stat, ino: fStat.ino, mtimeNs: fStat.mtimeNs, ctimeNs: fStat.ctimeNs } } : e)),
    };
    const c1 = await capture(upper, { previous: lie, fullCaptureEvery: 3 });
    expect(c1.capture.mode).toBe('incremental');
    expect(c1.capture.readEntries).toBe(0); // believed the lie: f's old record was copied
    const c2 = await capture(upper, { previous: c1.index, fullCaptureEvery: 3 });
    expect(c2.capture.mode).toBe('incremental');
    const c3 = await capture(upper, { previous: c2.index, fullCaptureEvery: 3 });
    expect(c3.capture).toMatchObject({ mode: 'full', reason: 'periodic full read', why: 'periodic' });
    await expectRestoresTo(c3, upper);
    expect(c3.index.capturesSinceFull).toBe(0);
  });

  it('a reused chunk that is no longer stored makes the capture full, and the layer is still right', async () => {
    const upper = join(work, 'upper-gc');
    mkdirSync(upper);
    writeFileSync(join(upper, 'big'), bytesOf(40_000, 6));
    writeFileSync(join(upper, 'small'), bytesOf(100, 7));
    const c0 = await capture(upper);
    appendFileSync(join(upper, 'small'), 'more');
    // Garbage collection took a chunk of the old layer (its checkpoint was deleted).
    await store.delete(c0.layer.chunks[2]!.digest);
    const c1 = await capture(upper, { previous: c0.index, publishWorker: { servers: nats.server.url } });
    expect(c1.capture.mode).toBe('full');
    expect(c1.capture.reason).toMatch(/^reuse failed/);
    expect(c1.capture.why).toBe('reuse_failed');
    expect(await store.has(c0.layer.chunks[2]!.digest)).toBe(true); // stored again by the full read
    await expectRestoresTo(c1, upper);
  });

  it('uses no index of another upper dir, container or chunk format', async () => {
    const upper = join(work, 'upper-foreign');
    mkdirSync(upper);
    writeFileSync(join(upper, 'f'), bytesOf(3000, 8));
    const c0 = await capture(upper, { containerId: 'c1' });
    expect((await capture(upper, { previous: c0.index, containerId: 'c1' })).capture).toMatchObject({ mode: 'incremental', why: 'incremental' });
    expect((await capture(upper, { previous: c0.index, containerId: 'c2' })).capture).toMatchObject({ reason: 'index of another container', why: 'other_container' });
    expect((await capture(upper, { previous: { ...c0.index, upperDir: '/elsewhere' }, containerId: 'c1' })).capture).toMatchObject({ reason: 'index of another upper dir', why: 'other_upper_dir' });
    expect((await capture(upper, { previous: c0.index, containerId: 'c1', chunker: { minSize: 128, avgSize: 512, maxSize: 2048 } })).capture).toMatchObject({ reason: 'index of another chunk format', why: 'other_format' });
    expect((await capture(upper, { previous: c0.index, containerId: 'c1', schemaVersion: 1 })).capture).toMatchObject({ mode: 'full', why: 'version_1' });
  });
});
