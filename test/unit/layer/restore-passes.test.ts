// The two restore passes (host-agent/layer/restore.ts) on hostile layers: every refusal comes from
// the validation pass, carries the data reason the agent answers (wire/agent-protocol.ts
// LayerDataReason, via layer/errors.ts restoreFailureOf) that the control plane reads as "the
// checkpoint's fault", is the same on the layer worker thread and inline, and happens before the
// extraction pass could write anything. Host-level failures map to host-level reasons.
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { pack, type Header } from 'tar-stream';
import { layerLimits, type LayerLimits, type LayerRefusalReason } from '../../../src/core/layer-rules.ts';
import { DockerRuntimeError } from '../../../src/docker/errors.ts';
import { LayerTransferError, layerDataReasonOf, restoreFailureOf } from '../../../src/host-agent/layer/errors.ts';
import { WORKER_PASSES, workerPassesLending } from '../../../src/host-agent/layer/layer-workers.ts';
import { INLINE_PASSES, extractLayer, restoreLayer, type ExpectedLayer, type LayerPasses } from '../../../src/host-agent/layer/restore.ts';
import { ChunkStoreError } from '../../../src/store/chunk-store.ts';
import { AGENT_REFUSAL_REASONS, LAYER_DATA_REASONS, restoreFaultScope } from '../../../src/wire/agent-protocol.ts';

const work = mkdtempSync(join(tmpdir(), 'sf-restore-passes-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

type Entry = Partial<Header> & Pick<Header, 'name'> & { data?: string };

/** An archive from tar-stream (an independent writer, so hostile input is not shaped by ours). */
async function tarOf(entries: Entry[]): Promise<Buffer> {
  const p = pack();
  const parts: Buffer[] = [];
  const done = (async () => {
    for await (const b of p as AsyncIterable<Uint8Array>) parts.push(Buffer.from(b));
  })();
  for (const { data, ...h } of entries) await new Promise<void>((res, rej) => p.entry(h, data ?? '', (err) => (err ? rej(err) : res())));
  p.finalize();
  await done;
  return Buffer.concat(parts);
}

const expectedOf = (blob: Buffer): ExpectedLayer => ({ digest: `sha256:${createHash('sha256').update(blob).digest('hex')}`, size: blob.length });

/** The wire reason a restore of `blob` is refused with, on `passes`; 'accepted' if it is not. */
async function refusalOf(passes: LayerPasses, blob: Buffer, limits: LayerLimits = layerLimits(), expected = expectedOf(blob)): Promise<string> {
  try {
    await passes.scan([blob], { expected, limits });
    return 'accepted';
  } catch (err) {
    const f = restoreFailureOf(err);
    expect(f.layerRefusal).toBe(true);
    expect(restoreFaultScope(f.reason)).toBe('checkpoint'); // the control plane will not retry it elsewhere
    return f.reason;
  }
}

const many = (n: number): Entry[] => Array.from({ length: n }, (_, i) => ({ name: `f${i}` }));

const CASES: { what: string; entries: Entry[]; limits?: LayerLimits; reason: string }[] = [
  { what: 'one entry over maxEntries', entries: many(11), limits: layerLimits({ maxEntries: 10 }), reason: 'layer_entry_limit' },
  { what: 'file data over maxLayerBytes', entries: [{ name: 'a', data: 'x'.repeat(600) }, { name: 'b', data: 'x'.repeat(600) }], limits: layerLimits({ maxLayerBytes: 1000 }), reason: 'layer_size_limit' },
  { what: 'names over maxNameBytesTotal', entries: many(40), limits: layerLimits({ maxNameBytesTotal: 64 }), reason: 'layer_name_limit' },
  { what: 'a `..` name', entries: [{ name: 'ok' }, { name: 'a/../../x' }], reason: 'layer_path_invalid' },
  { what: 'an absolute name', entries: [{ name: '/etc/passwd' }], reason: 'layer_path_invalid' },
  { what: 'the same path twice', entries: [{ name: 'a' }, { name: 'a' }], reason: 'layer_path_invalid' },
  { what: 'a symlink out of the root', entries: [{ name: 'l', type: 'symlink', linkname: '../../../etc' }], reason: 'layer_link_escape' },
  { what: 'a path through a symlink', entries: [{ name: 'l', type: 'symlink', linkname: 'd' }, { name: 'l/x' }], reason: 'layer_link_escape' },
  { what: 'a hard link to nothing earlier', entries: [{ name: 'h', type: 'link', linkname: 'missing' }], reason: 'layer_link_escape' },
  { what: 'a fifo', entries: [{ name: 'p', type: 'fifo' }], reason: 'layer_device_node' },
  { what: 'a block device', entries: [{ name: 'b', type: 'block-device', devmajor: 8, devminor: 0 }], reason: 'layer_device_node' },
  { what: 'an overlay xattr', entries: [{ name: 'd', type: 'directory', pax: { 'SCHILY.xattr.trusted.overlay.redirect': '/x' } }], reason: 'layer_xattr_refused' },
];

describe('validation pass refusals carry their wire reason, on the worker and inline alike', () => {
  for (const c of CASES) {
    it(`${c.what} → ${c.reason}`, async () => {
      const blob = await tarOf(c.entries);
      expect(await refusalOf(WORKER_PASSES, blob, c.limits)).toBe(c.reason);
      expect(await refusalOf(INLINE_PASSES, blob, c.limits)).toBe(c.reason);
    });
  }

  it('corrupt bytes, wrong digest, wrong size and a declared size beyond the limits', async () => {
    const blob = await tarOf([{ name: 'a', data: 'hello' }]);
    const garbage = Buffer.from(blob);
    garbage.write('XXXX', 0);
    for (const passes of [WORKER_PASSES, INLINE_PASSES]) {
      expect(await refusalOf(passes, garbage)).toBe('layer_header_invalid');
      expect(await refusalOf(passes, blob, layerLimits(), { ...expectedOf(blob), digest: `sha256:${'0'.repeat(64)}` })).toBe('layer_digest_mismatch');
      expect(await refusalOf(passes, blob, layerLimits(), { ...expectedOf(blob), size: blob.length + 1 })).toBe('layer_size_mismatch');
      // Declared far beyond what 100 bytes of data can take: refused before a byte is read.
      expect(await refusalOf(passes, blob, layerLimits({ maxLayerBytes: 100 }), { ...expectedOf(blob), size: 2 * 1024 * 1024 })).toBe('layer_size_limit');
    }
    expect(await refusalOf(WORKER_PASSES, blob)).toBe('accepted');
  });

  it('every tar rule maps to a data reason of the protocol', () => {
    const rules: LayerRefusalReason[] = ['path_traversal', 'absolute_path', 'link_escape', 'device_node', 'too_many_entries', 'layer_too_large', 'name_too_long', 'names_too_large', 'pax_header_too_large', 'too_many_xattrs', 'forbidden_xattr', 'invalid_name', 'invalid_whiteout', 'duplicate_entry', 'parent_not_directory', 'unsupported_entry_type', 'malformed_tar'];
    for (const r of rules) expect(LAYER_DATA_REASONS).toContain(layerDataReasonOf(r));
  });
});

describe('nothing is written before the whole layer passed', () => {
  it('a layer refused at its LAST entry never reaches the extraction pass, and no staging dir is made (spy passes at the LayerPasses seam)', async () => {
    const blob = await tarOf([...many(500), { name: '../escaped' }]);
    let extracted = 0;
    const spy: LayerPasses = { scan: WORKER_PASSES.scan, extract: (chunks, job) => ((extracted += 1), WORKER_PASSES.extract(chunks, job)) };
    const parent = join(work, 'refused');
    mkdirSync(parent);
    await expect(restoreLayer([blob], expectedOf(blob), join(parent, 'target'), { passes: spy })).rejects.toMatchObject({ reason: 'path_traversal' });
    expect(extracted).toBe(0);
    expect(readdirSync(parent)).toEqual([]);
    expect(existsSync(join(work, 'escaped'))).toBe(false);

    const good = await tarOf(many(500));
    const restored = await restoreLayer([good], expectedOf(good), join(parent, 'target'), { passes: spy });
    expect(restored.entries).toBe(500);
    expect(extracted).toBe(1);
    expect(readdirSync(parent)).toEqual(['target']);
    expect(readdirSync(join(parent, 'target'))).toHaveLength(500);
  });

  it('lent chunks come back from the layer worker, each once, by position, with their bytes: after the scan parsed them and after tar\'s pipe took them; a refused pass keeps what it had not finished', async () => {
    const blob = await tarOf([...many(50), { name: 'big', data: 'z'.repeat(300_000) }, ...many(5).map((e) => ({ name: `late-${e.name}` }))]);
    // Each piece in an ArrayBuffer of its own, as fetched chunks are (so it can be moved).
    const split = (): Uint8Array[] => Array.from({ length: Math.ceil(blob.length / 65_536) }, (_, i) => new Uint8Array(blob.subarray(i * 65_536, (i + 1) * 65_536)));
    for (const kind of ['scan', 'extract'] as const) {
      const back = new Map<number, Buffer>();
      const passes = workerPassesLending({
        wants: () => true,
        back: (index, data) => {
          expect(back.has(index)).toBe(false);
          back.set(index, Buffer.from(data));
        },
      });
      const chunks = split();
      const sent = chunks.map((c) => Buffer.from(c)); // what was lent (the originals are moved away)
      if (kind === 'scan') await passes.scan(chunks, { expected: expectedOf(blob), limits: layerLimits() });
      else {
        const staging = mkdtempSync(join(work, 'lent-'));
        await passes.extract(chunks, { expected: expectedOf(blob), limits: layerLimits(), staging, tarPath: 'tar' });
        expect(readdirSync(staging)).toHaveLength(56);
      }
      expect(chunks.every((c) => c.length === 0)).toBe(true); // moved to the worker, not copied
      expect([...back.keys()].sort((x, y) => x - y)).toEqual(sent.map((_, i) => i));
      for (const [i, data] of back) expect(data.equals(sent[i]!)).toBe(true);
      expect(Buffer.concat(sent).equals(blob)).toBe(true);
    }
    // Refused at the last entry: every chunk before the refused one came back, the rest need not.
    const hostile = await tarOf([...many(50), { name: 'big', data: 'z'.repeat(300_000) }, { name: '../escaped' }]);
    const back: number[] = [];
    const parts = Array.from({ length: Math.ceil(hostile.length / 65_536) }, (_, i) => new Uint8Array(hostile.subarray(i * 65_536, (i + 1) * 65_536)));
    await expect(workerPassesLending({ wants: () => true, back: (i) => void back.push(i) }).scan(parts, { expected: expectedOf(hostile), limits: layerLimits() })).rejects.toMatchObject({ reason: 'path_traversal' });
    expect(back).toEqual(Array.from({ length: parts.length - 1 }, (_, i) => i));
    // Only the chunks the lender wants come back (the others are the worker's to drop).
    const even: number[] = [];
    await workerPassesLending({ wants: (i) => i % 2 === 0, back: (i) => void even.push(i) }).scan(split(), { expected: expectedOf(blob), limits: layerLimits() });
    expect(even).toEqual(split().flatMap((_, i) => (i % 2 === 0 ? [i] : [])));
  });

  it('a full disk during extraction is the host-level disk_full (a GNU tar stand-in that fails like one, at the tarPath seam)', async () => {
    const fakeTar = join(work, 'tar-disk-full');
    writeFileSync(fakeTar, "#!/bin/sh\ncat >/dev/null\necho 'tar: data/x: Cannot write: No space left on device' >&2\nexit 2\n");
    chmodSync(fakeTar, 0o755);
    const blob = await tarOf([{ name: 'x', data: 'y' }]);
    const staging = mkdtempSync(join(work, 'staging-'));
    const err = await extractLayer([blob], { expected: expectedOf(blob), limits: layerLimits(), staging, tarPath: fakeTar }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LayerTransferError);
    expect(restoreFailureOf(err)).toMatchObject({ layerRefusal: false, reason: 'disk_full' });
  });

  it('host-level failures keep host-level reasons, which the control plane retries elsewhere', () => {
    const host = (err: unknown, reason: string): void => {
      expect(restoreFailureOf(err)).toMatchObject({ layerRefusal: false, reason });
      expect(restoreFaultScope(reason)).toBe('host');
      if (!reason.startsWith('docker_')) expect(AGENT_REFUSAL_REASONS).toContain(reason);
    };
    host(new ChunkStoreError('transfer_failed', 'timeout'), 'transfer_failed');
    host(new DockerRuntimeError('engine_unavailable', 'down'), 'docker_engine_unavailable');
    host(Object.assign(new Error('write'), { code: 'ENOSPC' }), 'disk_full');
    host(new LayerTransferError('extract_failed', 'tar exited 2'), 'extract_failed');
    host(new LayerTransferError('worker_failed', 'oom'), 'restore_failed');
    host(new LayerTransferError('target_not_empty', 'x'), 'restore_target_in_use');
    host(new Error('boom'), 'restore_failed');
    for (const [err, reason] of [[new ChunkStoreError('chunk_missing', 'gone'), 'chunk_missing'], [new ChunkStoreError('chunk_digest_mismatch', 'bad'), 'chunk_digest_mismatch']] as const) {
      expect(restoreFailureOf(err)).toMatchObject({ layerRefusal: true, reason });
      expect(restoreFaultScope(reason)).toBe('checkpoint');
    }
  });
});

describe('the layer worker pool', () => {
  it('a job that comes just as the idle worker\'s time runs out gets a live worker, not the one being stopped (seam: fake timers fire the idle timeout at will)', async () => {
    const blob = await tarOf([{ name: 'a', data: 'x' }]);
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      expect(await refusalOf(WORKER_PASSES, blob)).toBe('accepted'); // its worker goes idle in the pool
      vi.advanceTimersByTime(30_000); // its idle time ran out: it is told to stop, and exits a moment later
      // Before the fix this job took that worker and saw it exit mid-pass ("layer worker exited (1)").
      expect(await refusalOf(WORKER_PASSES, blob)).toBe('accepted');
    } finally {
      vi.useRealTimers();
    }
  });
});
