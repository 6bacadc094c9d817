// Hostile and well-formed layer tar streams through the bounded reader and both converters:
// restore-side validation (R-R4) and the overlay ↔ OCI whiteout forms (R-G3, R-G5).
import { describe, expect, it } from 'vitest';
import { pack, type Header } from 'tar-stream';
import { LayerRuleError, LayerValidator, layerLimits, type LayerLimits } from '../../../src/core/layer-rules.ts';
import { OverlayToOci } from '../../../src/host-agent/layer/capture.ts';
import { LayerTransferError } from '../../../src/host-agent/layer/errors.ts';
import { OciToOverlay } from '../../../src/host-agent/layer/restore.ts';
import { END_OF_ARCHIVE, TarParser, dataPadding, encodeHeader, parsePaxRecords, type TarHeader, type TarSink } from '../../../src/host-agent/layer/tar-format.ts';

type Spec = Partial<Header> & Pick<Header, 'name'> & { pax?: Record<string, string>; data?: string | Buffer };

/** Build a tar with tar-stream (an independent writer), so hostile input is not shaped by our own encoder. */
async function packTar(entries: Spec[]): Promise<Buffer> {
  const p = pack();
  const parts: Buffer[] = [];
  const done = (async () => {
    for await (const b of p as AsyncIterable<Uint8Array>) parts.push(Buffer.from(b));
  })();
  for (const { data, ...header } of entries) {
    await new Promise<void>((res, rej) => p.entry(header, data ?? '', (err) => (err ? rej(err) : res())));
  }
  p.finalize();
  await done;
  return Buffer.concat(parts);
}

/** Collects parsed entries (headers + data) as the reader delivers them. */
class Collect implements TarSink {
  readonly entries: { header: TarHeader; data: Buffer }[] = [];
  private parts: Buffer[] = [];
  entry(header: TarHeader): void {
    this.entries.push({ header, data: Buffer.alloc(0) });
    this.parts = [];
  }
  data(slice: Buffer): void {
    this.parts.push(Buffer.from(slice));
  }
  entryEnd(): void {
    this.entries[this.entries.length - 1]!.data = Buffer.concat(this.parts);
  }
}

function feed(sink: TarSink, bytes: Buffer, maxPax = 256 * 1024, step = 777): void {
  const parser = new TarParser(sink, maxPax);
  for (let i = 0; i < bytes.length; i += step) parser.push(bytes.subarray(i, i + step));
  parser.end();
}

/** Run the restore-side converter; returns the overlay-form tar it would hand to GNU tar. */
function toOverlay(bytes: Buffer, limits: LayerLimits = layerLimits()): Buffer {
  const sink = new OciToOverlay(new LayerValidator(limits));
  feed(sink, bytes, limits.maxPaxHeaderBytes);
  return Buffer.concat([...sink.out, END_OF_ARCHIVE]);
}

function toOci(bytes: Buffer): Buffer {
  const sink = new OverlayToOci(new LayerValidator());
  feed(sink, bytes);
  return Buffer.concat([...sink.out, END_OF_ARCHIVE]);
}

function parse(bytes: Buffer): { header: TarHeader; data: Buffer }[] {
  const c = new Collect();
  feed(c, bytes);
  return c.entries;
}

function reasonOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof LayerRuleError || err instanceof LayerTransferError) return err.reason;
    throw err;
  }
  return undefined;
}

/** Re-type a single ustar block and fix its checksum (to craft headers no writer would make). */
function withFlag(block: Buffer, flag: string): Buffer {
  const b = Buffer.from(block);
  b[156] = flag.charCodeAt(0);
  b.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of b) sum += byte;
  b.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8, 'latin1');
  return b;
}

function header(h: Partial<TarHeader> & Pick<TarHeader, 'name' | 'type'>): TarHeader {
  return { mode: 0o644, uid: 0, gid: 0, size: 0, mtime: 1_700_000_000, devMajor: 0, devMinor: 0, xattrs: new Map(), ...h };
}

describe('tar reader', () => {
  it('reads entries written by tar-stream, in any input split', async () => {
    const longName = `${'d'.repeat(120)}/file.txt`;
    const bytes = await packTar([
      { name: 'dir/', type: 'directory', mode: 0o755 },
      { name: 'dir/a.txt', data: 'hello', mode: 0o640, uid: 1000, gid: 1001 },
      { name: longName, data: 'x', pax: { path: longName } },
      { name: 'ln', type: 'symlink', linkname: 'dir/a.txt' },
    ]);
    for (const step of [1, 511, 512, 4096, bytes.length]) {
      const c = new Collect();
      feed(c, bytes, 1024, step);
      expect(c.entries.map((e) => e.header.name)).toEqual(['dir/', 'dir/a.txt', longName, 'ln']);
      expect(c.entries[1]).toMatchObject({ header: { mode: 0o640, uid: 1000, gid: 1001, size: 5 }, data: Buffer.from('hello') });
      expect(c.entries[3]!.header).toMatchObject({ type: 'symlink', linkName: 'dir/a.txt' });
    }
  });

  it('round-trips our own encoder incl. PAX names, big ids, xattrs and fractional mtime', () => {
    const h = header({ name: `${'n'.repeat(150)}`, type: 'file', size: 3, uid: 5_000_000, gid: 7, mtimePax: '1700000000.25', xattrs: new Map([['user.b', Buffer.from([0, 1, 255])], ['user.a', Buffer.from('v')]]) });
    const bytes = Buffer.concat([encodeHeader(h), Buffer.from('abc'), dataPadding(3), END_OF_ARCHIVE]);
    const [e] = parse(bytes);
    expect(e!.header).toMatchObject({ name: h.name, uid: 5_000_000, gid: 7, size: 3, mtime: 1_700_000_000, mtimePax: '1700000000.25' });
    expect([...e!.header.xattrs.keys()]).toEqual(['user.a', 'user.b']);
    expect(e!.header.xattrs.get('user.b')).toEqual(Buffer.from([0, 1, 255]));
    expect(e!.data.toString()).toBe('abc');
  });

  it('parses PAX records with multi-digit lengths exactly', () => {
    const value = 'v'.repeat(95); // record length crosses from 2 to 3 digits
    const rec = encodeHeader(header({ name: 'f', type: 'file', xattrs: new Map([['user.k', Buffer.from(value)]]) }));
    const body = rec.subarray(512, 512 + parseInt(rec.toString('latin1', 124, 135), 8));
    expect(parsePaxRecords(body).get('SCHILY.xattr.user.k')!.toString()).toBe(value);
  });

  it('refuses a bad checksum, truncation, data after the end and unknown types', async () => {
    const good = await packTar([{ name: 'a', data: 'hello' }]);
    const corrupt = Buffer.from(good);
    corrupt[0] = 0x62;
    expect(reasonOf(() => parse(corrupt))).toBe('malformed_tar');
    expect(reasonOf(() => parse(good.subarray(0, 700)))).toBe('malformed_tar');
    expect(reasonOf(() => parse(good.subarray(0, good.length - 512 * 2)))).toBe('malformed_tar');
    expect(reasonOf(() => parse(Buffer.concat([good, Buffer.from('smuggled')])))).toBe('malformed_tar');
    const gnuLong = withFlag(encodeHeader(header({ name: '././@LongLink', type: 'file' })), 'L');
    expect(reasonOf(() => parse(Buffer.concat([gnuLong, END_OF_ARCHIVE])))).toBe('unsupported_entry_type');
  });

  it('refuses an oversize PAX header before buffering it', async () => {
    const bytes = await packTar([{ name: 'a', data: 'x', pax: { 'SCHILY.xattr.user.big': 'y'.repeat(300 * 1024) } }]);
    expect(reasonOf(() => parse(bytes))).toBe('pax_header_too_large');
    // A PAX header that merely CLAIMS 10 GiB is refused from its header block alone.
    const claim = withFlag(encodeHeader(header({ name: 'PaxHeader', type: 'file', size: 4 * 1024 ** 3 })), 'x');
    expect(reasonOf(() => new TarParser(new Collect(), 256 * 1024).push(claim))).toBe('pax_header_too_large');
  });
});

describe('restore validation of hostile OCI layers', () => {
  it('refuses ".." names', async () => {
    const bytes = await packTar([{ name: '../../etc/cron.d/x', data: 'boom' }]);
    expect(reasonOf(() => toOverlay(bytes))).toBe('path_traversal');
    const viaPax = await packTar([{ name: 'innocent', data: 'boom', pax: { path: 'a/../../../root/.ssh/authorized_keys' } }]);
    expect(reasonOf(() => toOverlay(viaPax))).toBe('path_traversal');
  });

  it('refuses absolute names', async () => {
    const viaPax = await packTar([{ name: 'x', data: 'boom', pax: { path: '/etc/passwd' } }]);
    expect(reasonOf(() => toOverlay(viaPax))).toBe('absolute_path');
  });

  it('refuses links out of the root and writes through symlinks', async () => {
    const sym = await packTar([{ name: 'up', type: 'symlink', linkname: '../../../../etc' }]);
    expect(reasonOf(() => toOverlay(sym))).toBe('link_escape');
    const hard = await packTar([{ name: 'h', type: 'link', linkname: '/etc/shadow' }]);
    expect(reasonOf(() => toOverlay(hard))).toBe('link_escape');
    const through = await packTar([
      { name: 'etc', type: 'symlink', linkname: '/etc' },
      { name: 'etc/passwd', data: 'root::0:0::/:/bin/sh\n' },
    ]);
    expect(reasonOf(() => toOverlay(through))).toBe('link_escape');
  });

  it('refuses device nodes and fifos, including a raw 0/0 char device', async () => {
    const dev = await packTar([{ name: 'mem', type: 'character-device', devmajor: 1, devminor: 1 }]);
    expect(reasonOf(() => toOverlay(dev))).toBe('device_node');
    const wh = await packTar([{ name: 'x', type: 'character-device', devmajor: 0, devminor: 0 }]);
    expect(reasonOf(() => toOverlay(wh))).toBe('device_node');
    const fifo = await packTar([{ name: 'p', type: 'fifo' }]);
    expect(reasonOf(() => toOverlay(fifo))).toBe('device_node');
  });

  it('refuses entry-count and size bombs', async () => {
    const many = await packTar(Array.from({ length: 101 }, (_, i) => ({ name: `f${i}` })));
    expect(reasonOf(() => toOverlay(many, layerLimits({ maxEntries: 100 })))).toBe('too_many_entries');
    // A header that claims 8 GiB of data: refused at the header, before any data is read.
    const bomb = encodeHeader(header({ name: 'big', type: 'file', size: 8 * 1024 ** 3 }));
    const sink = new OciToOverlay(new LayerValidator(layerLimits({ maxLayerBytes: 1024 ** 3 })));
    expect(reasonOf(() => new TarParser(sink, 1024).push(bomb))).toBe('layer_too_large');
    expect(sink.out).toEqual([]);
  });

  it('refuses overlay xattrs smuggled in a layer and bad whiteouts', async () => {
    const redirect = await packTar([{ name: 'd/', type: 'directory', pax: { 'SCHILY.xattr.trusted.overlay.redirect': '/etc' } }]);
    expect(reasonOf(() => toOverlay(redirect))).toBe('forbidden_xattr');
    const fat = await packTar([{ name: '.wh.x', data: 'not empty' }]);
    expect(reasonOf(() => toOverlay(fat))).toBe('invalid_whiteout');
  });
});

describe('overlay ↔ OCI conversion', () => {
  /** What GNU tar gives for an upper dir: a 0/0 char device and an opaque dir with overlay xattrs. */
  function overlayTar(extra: TarHeader[] = []): Buffer {
    const x = (k: string, v: string): [string, Buffer] => [k, Buffer.from(v)];
    const hs = [
      header({ name: './', type: 'directory', mode: 0o755 }),
      header({ name: './gone', type: 'char-device', mode: 0o644, uid: 0 }),
      header({ name: './opq/', type: 'directory', mode: 0o750, uid: 12, gid: 34, xattrs: new Map([x('trusted.overlay.opaque', 'y'), x('trusted.overlay.origin', 'zz'), x('user.keep', 'me')]) }),
      header({ name: './opq/f', type: 'file', size: 2, xattrs: new Map([x('trusted.overlay.impure', 'y')]) }),
      ...extra,
    ];
    return Buffer.concat(
      hs.flatMap((h) => (h.type === 'file' && h.size > 0 ? [encodeHeader(h), Buffer.from('hi'), dataPadding(2)] : [encodeHeader(h)])).concat(END_OF_ARCHIVE),
    );
  }

  it('captures whiteouts and opaque dirs in OCI form and restores them in overlay form', () => {
    const oci = parse(toOci(overlayTar()));
    expect(oci.map((e) => [e.header.name, e.header.type])).toEqual([
      ['./', 'directory'],
      ['.wh.gone', 'file'],
      ['opq/', 'directory'],
      ['opq/.wh..wh..opq', 'file'],
      ['opq/f', 'file'],
    ]);
    expect([...oci[2]!.header.xattrs.keys()]).toEqual(['user.keep']);
    expect(oci[4]!.header.xattrs.size).toBe(0);
    expect(oci[4]!.data.toString()).toBe('hi');

    const back = parse(toOverlay(toOci(overlayTar())));
    expect(back.map((e) => [e.header.name, e.header.type])).toEqual([
      ['./', 'directory'],
      ['gone', 'char-device'],
      ['opq/', 'directory'],
      ['opq/', 'directory'],
      ['opq/f', 'file'],
    ]);
    expect(back[1]!.header).toMatchObject({ devMajor: 0, devMinor: 0 });
    expect(back[3]!.header).toMatchObject({ mode: 0o750, uid: 12, gid: 34 });
    expect(back[3]!.header.xattrs.get('trusted.overlay.opaque')?.toString()).toBe('y');
    expect(back[3]!.header.xattrs.get('user.keep')?.toString()).toBe('me');
  });

  it('is deterministic: the same tree gives the same bytes', () => {
    expect(toOci(overlayTar()).equals(toOci(overlayTar()))).toBe(true);
  });

  it('refuses real device nodes and metacopy/redirect upper dirs at capture', () => {
    expect(reasonOf(() => toOci(overlayTar([header({ name: './null', type: 'char-device', devMajor: 1, devMinor: 3 })])))).toBe('device_node');
    expect(reasonOf(() => toOci(overlayTar([header({ name: './mc', type: 'file', xattrs: new Map([['trusted.overlay.metacopy', Buffer.alloc(0)]]) })])))).toBe('unsupported_overlay_feature');
  });
});
