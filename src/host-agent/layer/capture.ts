// Capture of a container's writable layer (its overlay upper dir) as a portable OCI layer tar (R-G3).
// GNU tar reads the entries at C speed and gives modes, owners, symlinks, hard links, empty dirs and
// xattrs; it is handed an explicit list of names (walk.ts: the order `tar --sort=name` would use),
// all of them for a full capture, only those that changed for an incremental one (incremental.ts).
// This module rewrites tar's stream into OCI form on the fly: 0/0 char devices (overlay whiteouts)
// become `.wh.<name>` files, `trusted.overlay.opaque=y` dirs get a `.wh..wh..opq` entry, other
// overlay-private xattrs are dropped, and every header is re-encoded in one fixed form (sorted
// xattrs, no user/group names) so an unchanged entry always gives the same bytes. Every emitted
// entry passes the same LayerValidator that restore uses, so a checkpoint that could not be restored
// fails here, early. The output is structured per entry (header, data, tail) so the caller knows
// where each entry's record lies in the layer.
import { spawn } from 'node:child_process';
import {
  DEFAULT_LAYER_LIMITS,
  LayerValidator,
  OPAQUE_WHITEOUT,
  OVERLAY_OPAQUE_XATTR,
  OVERLAY_XATTR_PREFIX,
  baseNameOf,
  joinPath,
  normalizeEntryPath,
  parentOf,
  whiteoutName,
  type LayerEntryType,
  type LayerLimits,
} from '../../core/layer-rules.ts';
import { LayerTransferError } from './errors.ts';
import { runSmall } from './small-process.ts';
import { END_OF_ARCHIVE, TarParser, dataPadding, encodeHeader, type TarHeader, type TarSink } from './tar-format.ts';
import { tarName, walkUpperDir } from './walk.ts';

/** One tar entry as emitted in OCI form. */
export interface CapturedEntry {
  /** Normalized name of the entry tar read (for a whiteout: the deleted name). */
  readonly source: string;
  /** Normalized name of the emitted entry (for a whiteout: the `.wh.` name). */
  readonly name: string;
  readonly type: LayerEntryType;
  /** Data bytes following the header (regular files only). */
  readonly size: number;
  readonly linkName?: string;
  /** The source entry carried xattrs (any, overlay ones included). */
  readonly xattrs: boolean;
  /** The overlay form was rewritten (a whiteout, or an opaque directory with its marker entry). */
  readonly converted: boolean;
  /** The xattr names the emitted entry carries (overlay ones dropped). */
  readonly xattrNames: readonly string[];
}

/** The OCI stream, per source entry: its header bytes, its data, then its tail (padding, opaque marker). */
export type CaptureEvent = { readonly kind: 'head'; readonly entry: CapturedEntry; readonly bytes: Buffer } | { readonly kind: 'data'; readonly bytes: Buffer } | { readonly kind: 'tail'; readonly bytes: Buffer };

/** Overlay xattrs that change what a path means; a layer tar cannot express them. */
const UNSUPPORTED_OVERLAY_XATTRS = ['trusted.overlay.redirect', 'trusted.overlay.metacopy'];
const EMPTY = Buffer.alloc(0);

/**
 * GNU tar arguments: POSIX format (ustar + PAX only), all xattrs, numeric ids, exactly the listed
 * names (NUL-separated on stdin, never taken for options) relative to the upper dir. 64 KiB records:
 * fewer writes into the pipe than the default 10 KiB (measured: ~15% less capture time).
 */
export function captureTarArgs(upperDir: string): string[] {
  return ['--create', '--file=-', '--blocking-factor=128', '--format=posix', '--xattrs', '--xattrs-include=*', '--numeric-owner', '--no-recursion', '--directory', upperDir, '--null', '--verbatim-files-from', '--files-from=-'];
}

/** Rewrites overlay-form entries to OCI form, validating each before it is emitted. */
export class OverlayToOci implements TarSink {
  readonly events: CaptureEvent[] = [];
  private dataSize = 0;
  private marker: Buffer | null = null;

  constructor(private readonly validator: LayerValidator) {}

  /** The emitted bytes so far, flat (what a consumer that needs no structure reads). */
  get out(): Buffer[] {
    return this.events.map((e) => e.bytes);
  }

  entry(h: TarHeader): void {
    const path = normalizeEntryPath(h.name, this.validator.limits);
    for (const name of UNSUPPORTED_OVERLAY_XATTRS) {
      if (h.xattrs.has(name)) throw new LayerTransferError('unsupported_overlay_feature', `${path} carries ${name}; metacopy/redirect_dir upper dirs cannot be captured`);
    }
    this.dataSize = h.type === 'file' ? h.size : 0;
    this.marker = null;
    const xattrs = h.xattrs.size > 0;
    if (h.type === 'char-device' && h.devMajor === 0 && h.devMinor === 0 && path !== '.') {
      // Overlay whiteout → OCI whiteout. Mode is meaningless for whiteouts; fix it for stable bytes.
      const name = joinPath(parentOf(path), whiteoutName(baseNameOf(path)));
      const bytes = this.encode({ ...h, name, type: 'file', size: 0, mode: 0o600, devMajor: 0, devMinor: 0, xattrs: new Map() });
      this.events.push({ kind: 'head', entry: { source: path, name, type: 'file', size: 0, xattrs, converted: true, xattrNames: [] }, bytes });
      return;
    }
    const opaque = h.type === 'directory' && h.xattrs.get(OVERLAY_OPAQUE_XATTR)?.toString('latin1') === 'y';
    const kept = new Map([...h.xattrs].filter(([name]) => !name.startsWith(OVERLAY_XATTR_PREFIX)));
    const linkName = h.type === 'hardlink' && h.linkName !== undefined ? normalizeEntryPath(h.linkName, this.validator.limits) : h.linkName;
    const header: TarHeader = { ...h, name: path, xattrs: kept };
    if (linkName !== undefined) header.linkName = linkName;
    const bytes = this.encode(header);
    const entry: CapturedEntry = { source: path, name: path, type: h.type, size: this.dataSize, xattrs, converted: opaque, xattrNames: [...kept.keys()], ...(linkName !== undefined ? { linkName } : {}) };
    this.events.push({ kind: 'head', entry, bytes });
    if (opaque) this.marker = this.encode({ ...h, name: joinPath(path, OPAQUE_WHITEOUT), type: 'file', size: 0, mode: 0o600, xattrs: new Map(), linkName: undefined });
  }

  data(slice: Buffer): void {
    this.events.push({ kind: 'data', bytes: slice });
  }

  entryEnd(): void {
    const padding = this.dataSize > 0 ? dataPadding(this.dataSize) : EMPTY;
    this.events.push({ kind: 'tail', bytes: this.marker === null ? padding : Buffer.concat([padding, this.marker]) });
    this.dataSize = 0;
    this.marker = null;
  }

  private encode(h: TarHeader): Buffer {
    const admitted = { name: h.name, type: h.type, size: h.type === 'file' ? h.size : 0, xattrNames: [...h.xattrs.keys()] };
    this.validator.admit(h.linkName !== undefined ? { ...admitted, linkName: h.linkName } : admitted);
    if (h.linkName === undefined) delete h.linkName;
    return encodeHeader(h);
  }
}

export interface TarRun {
  /** tar's output (a tar stream), to be consumed fully or abandoned with `return()`. */
  readonly stdout: AsyncIterable<Buffer>;
  /** Resolves once tar exited 0 (after stdout ended); rejects with `capture_failed` otherwise. */
  readonly done: Promise<void>;
  /** Stop tar (the capture failed elsewhere). */
  kill(): void;
}

/**
 * Run GNU tar over `names` (tar list form, walk.ts tarName) in `upperDir`. The container must be
 * stopped: a file changing under tar fails the capture (`capture_failed`) rather than producing a
 * torn layer.
 */
export function runTar(upperDir: string, names: readonly Buffer[], tarPath = 'tar'): TarRun {
  const child = spawn(tarPath, captureTarArgs(upperDir), { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (s: string) => {
    if (stderr.length < 8192) stderr += s;
  });
  child.stdin.on('error', () => undefined); // EPIPE when tar dies early; its exit status reports it
  const exited = new Promise<number | null>((res) => {
    child.on('close', (code) => res(code));
    child.on('error', (err) => {
      stderr += String(err);
      res(null);
    });
  });
  // The list goes in while tar's output is read (a long list must not wait for a full pipe).
  void (async () => {
    const nul = Buffer.alloc(1);
    for (const name of names) {
      if (!child.stdin.write(Buffer.concat([name, nul]))) {
        // Room again, or tar is gone (its exit status says why).
        await new Promise<void>((r) => {
          child.stdin.once('drain', r);
          child.stdin.once('close', r);
        });
      }
      if (child.stdin.destroyed || child.exitCode !== null) return;
    }
    child.stdin.end();
  })();
  const done = exited.then((code) => {
    if (code !== 0) throw new LayerTransferError('capture_failed', `tar of ${upperDir} exited ${String(code)}: ${stderr.trim()}`);
  });
  done.catch(() => undefined); // the consumer awaits it
  return {
    stdout: child.stdout as AsyncIterable<Buffer>,
    done,
    kill: () => {
      if (child.exitCode === null) child.kill('SIGKILL');
    },
  };
}

/** Room for one entry's header in a tar stream: its PAX header (xattrs) and the ustar header itself. */
export const TAR_HEADER_ALLOWANCE = 8 * 1024;
/** tar pads the archive with zeros to whole records (captureTarArgs: 128 blocks of 512 bytes). */
const TAR_RECORD_BYTES = 128 * 512;
/** Small runs larger than this are not worth the copy through the helper's IPC channel. */
export const SMALL_TAR_MAX_BYTES = 4 * 1024 * 1024;

/** Most bytes tar can write for `names` of these data sizes (0 for non-files), with the allowance above per header. */
export function tarOutputBound(dataSizes: readonly number[]): number {
  return dataSizes.reduce((n, size) => n + TAR_HEADER_ALLOWANCE + Math.ceil(size / 512) * 512, 0) + 1024 + TAR_RECORD_BYTES;
}

/** How many entry headers a tar stream (prefix) holds in full. */
function completeHeaders(bytes: Buffer, limits: LayerLimits): number {
  let n = 0;
  const parser = new TarParser({ entry: () => void (n += 1), data: () => undefined, entryEnd: () => undefined }, limits.maxPaxHeaderBytes);
  try {
    parser.push(bytes);
  } catch {
    // Malformed: the caller's own parse of the same bytes reports it.
    return Number.POSITIVE_INFINITY;
  }
  return n;
}

/**
 * `runTar` from the small helper process (small-process.ts: no fork of this large process) when
 * the output fits `maxBytes`, or when `headersNeeded` is given and that many headers are complete in
 * the prefix the helper kept (the caller stops reading there). `undefined`: run tar directly (the
 * helper is unavailable, or the answer did not fit).
 */
export async function smallTarRun(upperDir: string, names: readonly Buffer[], maxBytes: number, limits: LayerLimits, tarPath = 'tar', headersNeeded?: number): Promise<TarRun | undefined> {
  if (maxBytes > SMALL_TAR_MAX_BYTES) return undefined;
  const nul = Buffer.alloc(1);
  const r = await runSmall({ file: tarPath, args: captureTarArgs(upperDir), input: Buffer.concat(names.flatMap((n) => [n, nul])), maxOutputBytes: maxBytes });
  // Not started (EAGAIN, EMFILE…: the direct run may do better), or stopped short of what is needed.
  if (r === undefined || r.spawnFailed) return undefined;
  if (r.truncated && (headersNeeded === undefined || completeHeaders(r.stdout, limits) < headersNeeded)) return undefined;
  // Stopped where the caller stops reading, but tar had complained before (e.g. a file that shrank,
  // padded with zeros): the direct run reads on and its exit status says so.
  if (r.truncated && r.stderr.trim() !== '') return undefined;
  const done = r.truncated || r.code === 0 ? Promise.resolve() : Promise.reject(new LayerTransferError('capture_failed', `tar of ${upperDir} exited ${String(r.code ?? r.signal)}: ${r.stderr.trim()}`));
  done.catch(() => undefined); // the consumer awaits it
  const out = r.stdout;
  smallTarRunsUsed += 1;
  return { stdout: (async function* () { yield out; })(), done, kill: () => undefined };
}

let smallTarRunsUsed = 0;
/** Tar runs whose output from the helper was used (tests check the path is taken, not only asked). */
export function smallTarRunsUsedCount(): number {
  return smallTarRunsUsed;
}

/**
 * The OCI header of one regular file, from a tar run stopped as soon as the header is out: for a
 * file whose data the capture reads itself (large files re-read for an incremental capture, whose
 * bytes through tar's pipe cost more than reading them directly). Its own validator: the caller
 * admits the entry where it lies in the layer.
 */
export async function headerOnly(upperDir: string, name: Buffer, limits: LayerLimits, tarPath = 'tar'): Promise<{ entry: CapturedEntry; bytes: Buffer }> {
  const oci = new OverlayToOci(new LayerValidator(limits));
  const parser = new TarParser(oci, limits.maxPaxHeaderBytes);
  const tar = (await smallTarRun(upperDir, [name], TAR_HEADER_ALLOWANCE, limits, tarPath, 1)) ?? runTar(upperDir, [name], tarPath);
  try {
    for await (const piece of tar.stdout) {
      parser.push(piece);
      const head = oci.events.find((e) => e.kind === 'head');
      if (head !== undefined && head.kind === 'head') return { entry: head.entry, bytes: head.bytes };
      oci.events.length = 0;
    }
    await tar.done;
    throw new LayerTransferError('capture_failed', `tar gave no header for ${name.toString('latin1')}`);
  } finally {
    tar.kill();
  }
}

export interface CaptureOptions {
  readonly limits?: LayerLimits;
  /** GNU tar binary; default `tar` from PATH. */
  readonly tarPath?: string;
}

/**
 * The whole layer of `upperDir` as one OCI tar stream, nothing stored: a full capture's bytes
 * (what storeLayer chunks), for tools and measurements. Resolves `entries` at the end.
 */
export async function* captureLayer(upperDir: string, options: CaptureOptions = {}): AsyncGenerator<Buffer, { entries: number; size: number }> {
  const limits = options.limits ?? DEFAULT_LAYER_LIMITS;
  const walk = await walkUpperDir(upperDir, limits.maxEntries);
  const validator = new LayerValidator(limits);
  const sink = new OverlayToOci(validator);
  const parser = new TarParser(sink, limits.maxPaxHeaderBytes);
  const tar = runTar(upperDir, walk.map((e) => tarName(e.key)), options.tarPath);
  let size = 0;
  try {
    for await (const piece of tar.stdout) {
      parser.push(piece);
      for (const e of sink.events) {
        size += e.bytes.length;
        yield e.bytes;
      }
      sink.events.length = 0;
    }
    await tar.done;
    parser.end();
  } finally {
    tar.kill();
  }
  yield END_OF_ARCHIVE;
  return { entries: validator.entryCount, size: size + END_OF_ARCHIVE.length };
}
