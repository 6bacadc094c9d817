// Writable-layer checkpoint end to end on a real nats-server (R-G3, R-G4, R-G5, R-R4): fake overlay
// upper dirs built as root (whiteout char devices, opaque xattrs, links, owners, modes, xattrs) →
// capture → chunk store → manifest → restore into another dir → identical trees. Also the
// 200 MiB figures (timings logged), dedup of a second checkpoint, and refusals that must leave
// the target untouched. Needs root, GNU tar, mknod and setfattr/getfattr (Debian `attr`).
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { appendFileSync, chmodSync, chownSync, linkSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { pack } from 'tar-stream';
import { jetstream } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { chunkListDigest, serializeCheckpointManifest, type CheckpointManifest, type LayerRef } from '../../../src/core/checkpoint-manifest.ts';
import { LayerRuleError } from '../../../src/core/layer-rules.ts';
import { LayerTransferError } from '../../../src/host-agent/layer/errors.ts';
import { ChunkCache } from '../../../src/host-agent/layer/chunk-cache.ts';
import { RetainBudget, extractVerifiedLayer, fetchLayer, storeLayer, verifyLayer } from '../../../src/host-agent/layer/layer-transfer.ts';
import { removeStaleStaging, restoreLayer } from '../../../src/host-agent/layer/restore.ts';
import { ChunkStore, ChunkStoreError, sha256Digest } from '../../../src/store/chunk-store.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

const MiB = 1024 * 1024;

let nats: TestNats;
let nc: NatsConnection;
let store: ChunkStore;
let work: string;

beforeAll(async () => {
  // 1 MiB max_payload (the NATS default) on purpose: chunks must fit it.
  nats = await startTestNats({ maxPayloadBytes: MiB });
  nc = await nats.connect('layer-test');
  store = await ChunkStore.open(nc);
  work = mkdtempSync(join(tmpdir(), 'sf-layer-'));
});

afterAll(async () => {
  await nats?.cleanup();
  if (work) rmSync(work, { recursive: true, force: true });
});

/** A fake overlay upper dir with every kind of entry a container layer can hold. */
function buildUpperDir(root: string): void {
  mkdirSync(root);
  mkdirSync(join(root, 'home/agent/.claude/projects'), { recursive: true });
  writeFileSync(join(root, 'home/agent/.claude/projects/session.jsonl'), '{"role":"user","text":"hi"}\n');
  writeFileSync(join(root, 'home/agent/script.sh'), '#!/bin/sh\necho hi\n', { mode: 0o755 });
  writeFileSync(join(root, 'home/agent/secret'), 'k', { mode: 0o600 });
  writeFileSync(join(root, 'home/agent/suid'), 'x', { mode: 0o644 });
  chmodSync(join(root, 'home/agent/suid'), 0o4755);
  chownSync(join(root, 'home/agent'), 1000, 1000);
  chownSync(join(root, 'home/agent/secret'), 1234, 5678);
  writeFileSync(join(root, 'home/agent/big.bin'), randomBytes(3 * MiB));
  linkSync(join(root, 'home/agent/big.bin'), join(root, 'home/agent/big-hardlink.bin'));
  symlinkSync('../agent/script.sh', join(root, 'home/agent/rel-link'));
  symlinkSync('/usr/bin/env', join(root, 'home/agent/abs-link'));
  mkdirSync(join(root, 'var/empty/dir'), { recursive: true });
  chmodSync(join(root, 'var/empty/dir'), 0o1777);
  const longName = `${'very-long-name-'.repeat(12)}.txt`;
  writeFileSync(join(root, 'var', longName), 'long');
  writeFileSync(join(root, 'var/ünïcødé ✓.txt'), 'utf8');
  execFileSync('setfattr', ['-n', 'user.note', '-v', 'hello', join(root, 'home/agent/script.sh')]);
  execFileSync('setfattr', ['-n', 'user.bin', '-v', '0x00ff10', join(root, 'var/empty')]);
  // Overlay whiteouts (deleted base files) and an opaque dir (a base dir replaced wholesale).
  mkdirSync(join(root, 'etc'));
  execFileSync('mknod', [join(root, 'etc/motd'), 'c', '0', '0']);
  execFileSync('mknod', [join(root, 'deleted-top'), 'c', '0', '0']);
  mkdirSync(join(root, 'usr/share/doc'), { recursive: true });
  execFileSync('setfattr', ['-n', 'trusted.overlay.opaque', '-v', 'y', join(root, 'usr/share/doc')]);
  writeFileSync(join(root, 'usr/share/doc/README'), 'replaced');
}

interface Node {
  type: string;
  mode: number;
  uid: number;
  gid: number;
  content?: string;
  target?: string;
  rdev?: number;
  inodeGroup?: string;
}

/** Everything restore must preserve, per path; hard links as "first path sharing my inode". */
function snapshot(root: string): Record<string, Node> {
  const out: Record<string, Node> = {};
  const byInode = new Map<number, string>();
  const walk = (rel: string): void => {
    const st = lstatSync(join(root, rel));
    const type = st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : st.isCharacterDevice() ? 'char' : st.isFile() ? 'file' : 'other';
    // Overlay ignores a whiteout's mode and owner; restore writes them canonically.
    const node: Node = type === 'char' ? { type, mode: 0, uid: 0, gid: 0, rdev: st.rdev } : { type, mode: st.mode & 0o7777, uid: st.uid, gid: st.gid };
    if (type === 'file') {
      node.content = sha256Digest(readFileSync(join(root, rel)));
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

/** All xattrs (incl. trusted.*) of the tree, hex-encoded, paths relative. */
function xattrs(root: string): string {
  return execFileSync('getfattr', ['--no-dereference', '--dump', '--match=-', '--encoding=hex', '--recursive', '.'], { cwd: root, encoding: 'utf8' });
}

/** A layer whose (version-2) digest fits its chunk list: wrong chunks get past the list check to the chunk checks. */
function consistent(layer: LayerRef): LayerRef {
  return { ...layer, digest: chunkListDigest(layer.chunks) };
}

function manifestFor(groupId: string, checkpointId: string, layer: LayerRef): CheckpointManifest {
  return {
    schemaVersion: 2,
    checkpointId,
    groupId,
    placementGeneration: 1,
    source: { hostId: 'host-a', epoch: 1 },
    createdAtMs: 2,
    cleanStop: { stoppedAtMs: 1, lastTurnCompletedAtMs: 1, stateRevision: 1, members: [{ memberId: 'm1', exitCode: 0, exitedWithinGrace: true }] },
    members: [{ memberId: 'm1', cliKind: 'claude-code', savedLocator: 'sess', nativeSessionPaths: ['/home/agent/.claude/projects/session.jsonl'], layer }],
    baseImageDigest: `sha256:${'1'.repeat(64)}`,
    bridgeVersion: '0.1.0',
  };
}

async function collect(source: AsyncIterable<Uint8Array>): Promise<Buffer[]> {
  const parts: Buffer[] = [];
  for await (const b of source) parts.push(Buffer.from(b));
  return parts;
}

async function reasonOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    if (err instanceof LayerRuleError || err instanceof LayerTransferError || err instanceof ChunkStoreError) return err.reason;
    throw err;
  }
  return 'no error';
}

/** Refusals must leave neither the target nor a staging dir behind. */
function expectNothingWritten(parent: string, target: string): void {
  expect(readdirSync(parent).filter((n) => n.startsWith(`.${target}.restore-`) || n === target)).toEqual([]);
}

describe('layer checkpoint through the chunk store', () => {
  it('captures, stores, restores an upper dir into an identical tree', async () => {
    const upper = join(work, 'upper-a');
    buildUpperDir(upper);
    const stored = await storeLayer(upper, store);
    expect(stored.layer.size).toBe(stored.stats.bytes);
    await store.putManifest(manifestFor('g1', 'cp1', stored.layer));
    await expect(store.putManifest(manifestFor('g1', 'cp1', stored.layer))).rejects.toMatchObject({ reason: 'manifest_exists' });
    expect(await store.listCheckpoints('g1')).toEqual(['cp1']);

    const manifest = await store.getManifest('host-a', 'g1', 'cp1');
    // A manifest lives under the host that wrote it: not found under another host's name, and one
    // that names another source than its subject's host is refused as invalid, never used.
    await expect(store.getManifest('host-b', 'g1', 'cp1')).rejects.toMatchObject({ reason: 'manifest_missing' });
    const forged = await jetstream(nc).publish('sf.manifest.host-a.g1.cp-forged', serializeCheckpointManifest({ ...manifestFor('g1', 'cp-forged', stored.layer), source: { hostId: 'host-b', epoch: 1 } }));
    expect(forged.seq).toBeGreaterThan(0);
    await expect(store.getManifest('host-a', 'g1', 'cp-forged')).rejects.toMatchObject({ name: 'ManifestError', reason: 'manifest_invalid' });
    const target = join(work, 'restored-a');
    const restored = await fetchLayer(manifest.members[0]!.layer, store, target);
    expect(restored.entries).toBe(stored.entries);
    expect(snapshot(target)).toEqual(snapshot(upper));
    expect(xattrs(target)).toEqual(xattrs(upper));
    expect(xattrs(target)).toContain('trusted.overlay.opaque=0x79');
    expect(lstatSync(join(target, 'etc/motd')).isCharacterDevice()).toBe(true);

    // Capturing the restored tree gives the same layer bytes: whiteouts and opaque dirs round-trip.
    const again = await storeLayer(target, store);
    expect(again.layer.digest).toBe(stored.layer.digest);
    expect(again.stats.storedBytes).toBe(0);
  });

  it('publishing and fetching on worker threads give the same layer and tree, and refuse corrupt or missing chunks', async () => {
    const fetchWorker = { servers: nats.server.url };
    const upper = join(work, 'upper-fw');
    buildUpperDir(upper);
    const { layer } = await storeLayer(upper, store);
    // Publishing on a worker thread stores the same layer, chunk for chunk.
    const viaWorker = await storeLayer(upper, store, { publishWorker: fetchWorker });
    expect(viaWorker.layer).toEqual(layer);
    expect(viaWorker.stats.storedBytes).toBe(0);
    const target = join(work, 'restored-fw');
    await fetchLayer(layer, store, target, { fetchWorker });
    expect(snapshot(target)).toEqual(snapshot(upper));
    expect(xattrs(target)).toEqual(xattrs(upper));

    const bad = 'restored-fw-bad';
    const swapped = consistent({ ...layer, chunks: [{ digest: layer.chunks[1]!.digest, size: layer.chunks[0]!.size }, ...layer.chunks.slice(1)] });
    expect(await reasonOf(fetchLayer(swapped, store, join(work, bad), { fetchWorker }))).toBe('chunk_digest_mismatch');
    expectNothingWritten(work, bad);
    const missing = consistent({ ...layer, chunks: [...layer.chunks.slice(0, -1), { digest: `sha256:${'1'.repeat(64)}`, size: 10 }] });
    expect(await reasonOf(fetchLayer(missing, store, join(work, bad), { fetchWorker }))).toBe('chunk_missing');
    expectNothingWritten(work, bad);
    // An unreachable server is a failed fetch, not corruption: the control plane retries elsewhere.
    expect(await reasonOf(fetchLayer(layer, store, join(work, bad), { fetchWorker: { servers: 'nats://127.0.0.1:1' } }))).toBe('transfer_failed');
    expectNothingWritten(work, bad);
    expect(await reasonOf(storeLayer(upper, store, { publishWorker: { servers: 'nats://127.0.0.1:1' } }))).toBe('transfer_failed');
  });

  it('a version-1 capture (whole-tar digest) restores with off-thread hashing, refuses the same corruption; the target may be a promise', async () => {
    const upper = join(work, 'upper-w');
    buildUpperDir(upper);
    const v2 = await storeLayer(upper, store);
    const v1 = await storeLayer(upper, store, { schemaVersion: 1, publishWorker: { servers: nats.server.url } });
    // The same bytes and chunks; only what the digest covers differs.
    expect(v1.layer.chunks).toEqual(v2.layer.chunks);
    expect(v1.layer.digest).toBe(sha256Digest(Buffer.concat(await collect(store.read(v1.layer.chunks)))));
    expect(v1.capture.mode).toBe('full');
    expect(v1.stats.storedBytes).toBe(0);
    // A version-1 digest read as a version-2 one (or the reverse) is refused before anything is written.
    expect(await reasonOf(fetchLayer(v1.layer, store, join(work, 'restored-w0')))).toBe('layer_digest_mismatch');
    expect(await reasonOf(fetchLayer(v2.layer, store, join(work, 'restored-w0'), { digestOf: 'tar' }))).toBe('layer_digest_mismatch');
    expectNothingWritten(work, 'restored-w0');

    // Fetches start before the target dir is known (a container being created), then extract.
    const target = join(work, 'restored-w');
    let resolveTarget!: (dir: string) => void;
    const pending = fetchLayer(v1.layer, store, new Promise<string>((r) => (resolveTarget = r)), { offThreadHash: true, digestOf: 'tar' });
    await new Promise((r) => setTimeout(r, 50));
    expect(readdirSync(work).filter((n) => n.includes('restored-w'))).toEqual([]);
    resolveTarget(target);
    await pending;
    expect(snapshot(target)).toEqual(snapshot(upper));
    expect(xattrs(target)).toEqual(xattrs(upper));

    const name = 'restored-w2';
    const wrongDigest: LayerRef = { ...v1.layer, digest: `sha256:${'0'.repeat(64)}` };
    expect(await reasonOf(fetchLayer(wrongDigest, store, join(work, name), { offThreadHash: true, digestOf: 'tar' }))).toBe('layer_digest_mismatch');
    expectNothingWritten(work, name);
    const chunks = v1.layer.chunks;
    if (chunks.length > 1) {
      const swapped: LayerRef = { ...v1.layer, chunks: [{ digest: chunks[1]!.digest, size: chunks[0]!.size }, ...chunks.slice(1)] };
      expect(await reasonOf(fetchLayer(swapped, store, join(work, name), { offThreadHash: true, digestOf: 'tar' }))).toBe('chunk_digest_mismatch');
      expectNothingWritten(work, name);
    }
    // A target that never materialises (container create failed): nothing written, error surfaced.
    await expect(fetchLayer(v2.layer, store, Promise.reject(new Error('create failed')))).rejects.toThrow('create failed');
  });

  it('refuses a missing chunk, a wrong chunk, a wrong layer digest and a truncated blob, writing nothing', async () => {
    const upper = join(work, 'upper-b');
    mkdirSync(upper);
    writeFileSync(join(upper, 'data.bin'), randomBytes(4 * MiB));
    const { layer } = await storeLayer(upper, store);
    expect(layer.chunks.length).toBeGreaterThan(2);
    const target = 'restored-b';

    const wrongDigest: LayerRef = { ...layer, digest: `sha256:${'0'.repeat(64)}` };
    expect(await reasonOf(fetchLayer(wrongDigest, store, join(work, target)))).toBe('layer_digest_mismatch');
    expectNothingWritten(work, target);

    // A list that does not hash to the digest is refused before any fetch; a consistent list of
    // the wrong chunks is refused by the chunk digests; a list cut short, by the tar's end.
    const swappedList: LayerRef = { ...layer, chunks: [{ digest: layer.chunks[1]!.digest, size: layer.chunks[0]!.size }, ...layer.chunks.slice(1)] };
    expect(await reasonOf(fetchLayer(swappedList, store, join(work, target)))).toBe('layer_digest_mismatch');
    expect(await reasonOf(fetchLayer(consistent(swappedList), store, join(work, target)))).toBe('chunk_digest_mismatch');
    expectNothingWritten(work, target);

    const dropped = layer.chunks.slice(0, -1);
    const truncatedRef: LayerRef = { ...layer, size: dropped.reduce((n, c) => n + c.size, 0), chunks: dropped };
    expect(await reasonOf(fetchLayer(truncatedRef, store, join(work, target)))).toBe('layer_digest_mismatch');
    expect(await reasonOf(fetchLayer(consistent(truncatedRef), store, join(work, target)))).toBe('malformed_tar');
    expectNothingWritten(work, target);

    // A blob cut short whose digest matches what arrived (e.g. a bad manifest): the tar is refused.
    const blob = Buffer.concat(await collect(store.read(layer.chunks)));
    const cut = blob.subarray(0, blob.length - 4096);
    expect(await reasonOf(restoreLayer([cut], { digest: sha256Digest(cut), size: cut.length }, join(work, target)))).toBe('malformed_tar');
    expectNothingWritten(work, target);
    expect(await reasonOf(restoreLayer([cut], layer, join(work, target)))).toBe('layer_size_mismatch');

    await store.delete(layer.chunks[2]!.digest);
    expect(await store.has(layer.chunks[2]!.digest)).toBe(false);
    expect(await reasonOf(fetchLayer(layer, store, join(work, target)))).toBe('chunk_missing');
    expectNothingWritten(work, target);
  });

  it('pass 2 extracts the chunks pass 1 kept in memory (within the budget) and reads only the rest', async () => {
    const fetchWorker = { servers: nats.server.url };
    const upper = join(work, 'upper-keep');
    mkdirSync(upper);
    writeFileSync(join(upper, 'data.bin'), randomBytes(3 * MiB));
    const { layer } = await storeLayer(upper, store);
    // Everything kept: the extraction needs nothing from the store any more.
    const budget = new RetainBudget(64 * MiB);
    const all = await verifyLayer(layer, store, { fetchWorker, retain: budget });
    expect(all.retainedBytes).toBe(layer.size);
    expect(budget.usedBytes).toBe(layer.size);
    // Half the budget: the rest is fetched again (from the store here: no cache).
    const half = new RetainBudget(Math.floor(layer.size / 2));
    const part = await verifyLayer(layer, store, { fetchWorker, retain: half });
    expect(part.retainedBytes).toBeGreaterThan(0);
    expect(part.retainedBytes).toBeLessThanOrEqual(layer.size / 2);
    const kept = part.retained.chunks.flatMap((c, i) => (c === undefined ? [] : [i]));
    // Chunks that only memory still holds: gone from the store, the full one extracts anyway.
    const target = join(work, 'restored-keep');
    for (const i of kept) await store.delete(layer.chunks[i]!.digest);
    await extractVerifiedLayer(all, store, target, { fetchWorker });
    await all.release();
    expect(budget.usedBytes).toBe(0);
    expect(readFileSync(join(target, 'data.bin')).equals(readFileSync(join(upper, 'data.bin')))).toBe(true);
    // The partial one needs the store for what it did not keep (still there) and not for the rest.
    const target2 = join(work, 'restored-keep2');
    await extractVerifiedLayer(part, store, target2, { fetchWorker });
    await part.release();
    expect(readFileSync(join(target2, 'data.bin')).equals(readFileSync(join(upper, 'data.bin')))).toBe(true);
    expect(half.usedBytes).toBe(0);
    await storeLayer(upper, store); // put the deleted chunks back for later tests
  });

  it('chunks kept in memory reach the host cache only after the restore (release), and a refused layer\'s never', async () => {
    const fetchWorker = { servers: nats.server.url };
    const upper = join(work, 'upper-deferred');
    mkdirSync(upper);
    writeFileSync(join(upper, 'data.bin'), randomBytes(3 * MiB));
    const { layer } = await storeLayer(upper, store);
    const cache = await ChunkCache.open({ dir: join(work, 'cache-deferred'), maxBytes: 64 * MiB });
    // Half kept: the other half is written to the cache during pass 1 (pass 2 reads it there).
    const budget = new RetainBudget(Math.floor(layer.size / 2));
    const verified = await verifyLayer(layer, store, { fetchWorker, cache, retain: budget });
    const kept = verified.retained.chunks.flatMap((c, i) => (c === undefined ? [] : [layer.chunks[i]!.digest]));
    expect(kept.length).toBeGreaterThan(0);
    expect(kept.length).toBeLessThan(layer.chunks.length);
    expect(kept.every((d) => !cache.has(d))).toBe(true);
    expect(layer.chunks.filter((c) => !kept.includes(c.digest)).every((c) => cache.has(c.digest))).toBe(true);
    const target = join(work, 'restored-deferred');
    await extractVerifiedLayer(verified, store, target, { fetchWorker, cache });
    expect(readFileSync(join(target, 'data.bin')).equals(readFileSync(join(upper, 'data.bin')))).toBe(true);
    expect(kept.every((d) => !cache.has(d))).toBe(true); // not before release()
    await verified.release();
    expect(budget.usedBytes).toBe(0);
    expect(layer.chunks.every((c) => cache.has(c.digest))).toBe(true);
    for (const c of layer.chunks) expect((await cache.get(c))?.length).toBe(c.size);
    // A layer refused by pass 1 (wrong size in its reference): nothing of it is cached, kept or not.
    const other = join(work, 'upper-deferred-refused');
    mkdirSync(other);
    writeFileSync(join(other, 'data.bin'), randomBytes(2 * MiB));
    const refused = (await storeLayer(other, store)).layer;
    const lying: LayerRef = { ...refused, size: refused.size - 1 };
    let taken = 0; // pass 1 did keep chunks before it refused (the size is checked at the last one)
    const budget2 = new (class extends RetainBudget {
      override take(bytes: number): boolean {
        const ok = super.take(bytes);
        if (ok) taken += bytes;
        return ok;
      }
    })(64 * MiB);
    expect(await reasonOf(verifyLayer(lying, store, { fetchWorker, cache, retain: budget2, digestOf: 'tar' }))).toBe('layer_size_mismatch');
    expect(taken).toBeGreaterThan(0);
    expect(budget2.usedBytes).toBe(0);
    expect(refused.chunks.some((c) => cache.has(c.digest))).toBe(false);
    // Without a cache nothing waits for a write: kept chunks are moved to the extraction, not copied.
    const noCache = await verifyLayer(layer, store, { fetchWorker, retain: new RetainBudget(64 * MiB) });
    expect(noCache.uncachedBytes).toBe(0);
    await extractVerifiedLayer(noCache, store, join(work, 'restored-deferred-nocache'), { fetchWorker });
    expect(noCache.retained.chunks.every((c) => c === undefined || c.length === 0)).toBe(true);
    await noCache.release();
    // release() before an extraction: the kept chunks are not used any more; it reads the cache.
    const early = await verifyLayer(layer, store, { fetchWorker, cache, retain: new RetainBudget(64 * MiB) });
    await early.release();
    await extractVerifiedLayer(early, store, join(work, 'restored-deferred-late'), { fetchWorker, cache });
    expect(readFileSync(join(work, 'restored-deferred-late', 'data.bin')).equals(readFileSync(join(upper, 'data.bin')))).toBe(true);
  });

  it('extracts into an early staging dir while the target is made, renames it onto the target; a failed target or extraction leaves nothing', async () => {
    const upper = join(work, 'upper-early');
    mkdirSync(upper);
    writeFileSync(join(upper, 'data.bin'), randomBytes(2 * MiB));
    const { layer } = await storeLayer(upper, store);
    const parent = join(work, 'overlay-root');
    mkdirSync(parent);
    const earlyStaging = { parent, prefix: '.sf-restore-h1-' };
    const later = <T>(ms: number, value: () => T): Promise<T> => new Promise((resolve, reject) => setTimeout(() => {
      try {
        resolve(value());
      } catch (err) {
        reject(err as Error);
      }
    }, ms));
    // The target appears (empty) only after a while, as a container's upper dir does.
    const target = join(parent, 'layer-a', 'diff');
    const verified = await verifyLayer(layer, store, {});
    await extractVerifiedLayer(verified, store, later(300, () => (mkdirSync(target, { recursive: true }), target)), { earlyStaging });
    expect(readFileSync(join(target, 'data.bin')).equals(readFileSync(join(upper, 'data.bin')))).toBe(true);
    expect(readdirSync(parent).sort()).toEqual(['layer-a']);
    // The target could not be made (a failed docker create): its error, nothing left behind.
    await expect(extractVerifiedLayer(verified, store, later(100, () => {
      throw new Error('create failed');
    }), { earlyStaging })).rejects.toThrow('create failed');
    expect(readdirSync(parent).sort()).toEqual(['layer-a']);
    // The target is not empty by the time the extraction is done: refused, staging removed, target unchanged.
    const busy = join(parent, 'layer-b', 'diff');
    mkdirSync(busy, { recursive: true });
    writeFileSync(join(busy, 'someone-else'), 'x');
    expect(await reasonOf(extractVerifiedLayer(verified, store, busy, { earlyStaging }))).toBe('target_not_empty');
    expect(readdirSync(parent).sort()).toEqual(['layer-a', 'layer-b']);
    expect(readdirSync(busy)).toEqual(['someone-else']);
    // A staging parent that turns out to be elsewhere (EXDEV at the rename; in production, project
    // quotas): told once, extracted again next to the target, nothing left in either place.
    const shm = mkdtempSync(join('/dev/shm', 'sf-early-'));
    onTestFinished(() => rmSync(shm, { recursive: true, force: true }));
    let crossDevice = 0;
    const elsewhere = join(parent, 'layer-c', 'diff');
    mkdirSync(elsewhere, { recursive: true });
    await extractVerifiedLayer(verified, store, elsewhere, { earlyStaging: { parent: shm, prefix: '.sf-restore-h1-', crossDevice: () => void (crossDevice += 1) } });
    expect(crossDevice).toBe(1);
    expect(readFileSync(join(elsewhere, 'data.bin')).equals(readFileSync(join(upper, 'data.bin')))).toBe(true);
    expect(readdirSync(shm)).toEqual([]);
    expect(readdirSync(dirname(elsewhere))).toEqual(['diff']);
    await verified.release();
    // Stale staging dirs: only this prefix with a staging suffix is removed.
    for (const n of ['.sf-restore-h1-0123456789ab', '.sf-restore-h2-0123456789ab', '.sf-restore-h1-notastaging', 'unrelated']) mkdirSync(join(parent, n, 'x'), { recursive: true });
    expect(await removeStaleStaging(earlyStaging)).toEqual(['.sf-restore-h1-0123456789ab']);
    expect(readdirSync(parent).sort()).toEqual(['.sf-restore-h1-notastaging', '.sf-restore-h2-0123456789ab', 'layer-a', 'layer-b', 'layer-c', 'unrelated']);
  });

  it('refuses hostile layers before writing, and a non-empty target', async () => {
    const p = pack();
    p.entry({ name: 'ok.txt' }, 'fine');
    p.entry({ name: '../escaped.txt' }, 'boom');
    p.finalize();
    const blob = Buffer.concat(await collect(p as AsyncIterable<Buffer>));
    const ref = { digest: sha256Digest(blob), size: blob.length };
    expect(await reasonOf(restoreLayer([blob], ref, join(work, 'restored-c')))).toBe('path_traversal');
    expectNothingWritten(work, 'restored-c');
    expect(readdirSync(work)).not.toContain('escaped.txt');

    const busy = join(work, 'busy');
    mkdirSync(busy);
    writeFileSync(join(busy, 'x'), 'x');
    const good = pack();
    good.entry({ name: 'a' }, 'a');
    good.finalize();
    const goodBlob = Buffer.concat(await collect(good as AsyncIterable<Buffer>));
    expect(await reasonOf(restoreLayer([goodBlob], { digest: sha256Digest(goodBlob), size: goodBlob.length }, busy))).toBe('target_not_empty');
    // An existing EMPTY target (what `docker create` leaves) is replaced atomically.
    const empty = join(work, 'empty-target');
    mkdirSync(empty);
    await restoreLayer([goodBlob], { digest: sha256Digest(goodBlob), size: goodBlob.length }, empty);
    expect(readFileSync(join(empty, 'a'), 'utf8')).toBe('a');
  });

  it('200 MiB layer: timings, and a second checkpoint after a 1 MiB append stores ≤ 5%', async () => {
    const upper = join(work, 'upper-big');
    mkdirSync(join(upper, 'data'), { recursive: true });
    for (let i = 0; i < 3; i++) writeFileSync(join(upper, 'data', `blob-${i}.bin`), randomBytes(50 * MiB));
    const jsonl = join(upper, 'data', 'session.jsonl');
    const line = (i: number): string => `${JSON.stringify({ seq: i, role: i % 2 ? 'assistant' : 'user', text: `message ${i} ${randomBytes(48).toString('base64')}` })}\n`;
    const lines: string[] = [];
    let bytes = 0;
    for (let i = 0; bytes < 50 * MiB; i++) {
      const l = line(i);
      lines.push(l);
      bytes += l.length;
    }
    writeFileSync(jsonl, lines.join(''));
    // Warm the page cache like a just-stopped container's layer.
    execFileSync('tar', ['-cf', '/dev/null', '-C', upper, '.']);

    let t = performance.now();
    const first = await storeLayer(upper, store, { nowMs: () => Date.now() + 10_000 });
    const captureMs = performance.now() - t;
    await store.putManifest(manifestFor('big', 'cp1', first.layer));

    let appended = 0;
    const more: string[] = [];
    for (let i = lines.length; appended < MiB; i++) {
      const l = line(i);
      more.push(l);
      appended += l.length;
    }
    appendFileSync(jsonl, more.join(''));
    t = performance.now();
    // Incremental: the index of the first capture (its clock moved past the racy margin, as a
    // checkpoint seconds after the writes would see it) lets it read only the session file.
    const second = await storeLayer(upper, store, { previous: first.index, nowMs: () => Date.now() + 10_000 });
    const secondMs = performance.now() - t;
    expect(second.capture.mode).toBe('incremental');
    await store.putManifest(manifestFor('big', 'cp2', second.layer));

    t = performance.now();
    const target = join(work, 'restored-big');
    await fetchLayer(second.layer, store, target);
    const restoreMs = performance.now() - t;

    const mbps = (n: number, ms: number): string => ((n / MiB) / (ms / 1000)).toFixed(0);
    console.log(
      `[layer bench] layer ${(first.layer.size / MiB).toFixed(1)} MiB in ${first.layer.chunks.length} chunks; ` +
        `capture+store ${captureMs.toFixed(0)} ms (${mbps(first.layer.size, captureMs)} MiB/s); ` +
        `second (incremental) checkpoint ${secondMs.toFixed(0)} ms, read ${second.capture.readEntries} of ${second.capture.walkedEntries} entries, stored ${(second.stats.storedBytes / MiB).toFixed(2)} MiB ` +
        `(${((100 * second.stats.storedBytes) / first.stats.storedBytes).toFixed(2)}%); ` +
        `fetch+restore ${restoreMs.toFixed(0)} ms (${mbps(second.layer.size, restoreMs)} MiB/s)`,
    );
    expect(second.stats.storedBytes).toBeLessThanOrEqual(0.05 * first.stats.storedBytes);
    expect(sha256Digest(readFileSync(join(target, 'data', 'session.jsonl')))).toBe(sha256Digest(readFileSync(jsonl)));
    rmSync(upper, { recursive: true, force: true });
    rmSync(target, { recursive: true, force: true });
  });
});
