// Capture a container's writable layer (its overlay upper dir) as a portable OCI layer tar (R-G3).
// GNU tar walks the tree at C speed and gives modes, owners, symlinks, hard links, empty dirs and
// xattrs; this module rewrites its stream into OCI form on the fly: 0/0 char devices (overlay
// whiteouts) become `.wh.<name>` files, `trusted.overlay.opaque=y` dirs get a `.wh..wh..opq`
// entry, other overlay-private xattrs are dropped. Every emitted entry passes the same
// LayerValidator that restore uses, so a checkpoint that could not be restored fails here, early.
// The layer is hashed (sha256) while streaming; nothing is written to disk.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
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
  type LayerLimits,
} from '../../core/layer-rules.ts';
import { LayerTransferError } from './errors.ts';
import { END_OF_ARCHIVE, TarParser, dataPadding, encodeHeader, type TarHeader, type TarSink } from './tar-format.ts';

export interface CaptureOptions {
  readonly limits?: LayerLimits;
  /** GNU tar binary; default `tar` from PATH. */
  readonly tarPath?: string;
  /**
   * Hash the emitted layer here (default true). storeLayer with `offThreadHash` turns it off and
   * hashes the same bytes, chunk by chunk in order, on a worker thread instead (sha256-pool.ts).
   */
  readonly hashLayer?: boolean;
}

export interface CapturedLayer {
  /** `sha256:<hex>` of the emitted OCI layer tar; null when `hashLayer` was false. */
  readonly digest: string | null;
  readonly size: number;
  readonly entries: number;
}

export interface LayerCapture {
  /** The OCI layer tar, in pieces; consume it fully (or return early to abort the walk). */
  readonly stream: AsyncIterable<Buffer>;
  /** Resolves after the stream is fully consumed and tar exited cleanly. */
  readonly done: Promise<CapturedLayer>;
}

/** Overlay xattrs that change what a path means; a layer tar cannot express them. */
const UNSUPPORTED_OVERLAY_XATTRS = ['trusted.overlay.redirect', 'trusted.overlay.metacopy'];

/** GNU tar arguments: POSIX format (ustar + PAX only), all xattrs, numeric ids, stable order. */
export function captureTarArgs(upperDir: string): string[] {
  return ['--create', '--file=-', '--format=posix', '--xattrs', '--xattrs-include=*', '--numeric-owner', '--sort=name', '--one-file-system', '--directory', upperDir, '.'];
}

/** Rewrites overlay-form entries to OCI form, validating each before it is emitted. */
export class OverlayToOci implements TarSink {
  readonly out: Buffer[] = [];
  private dataSize = 0;

  constructor(private readonly validator: LayerValidator) {}

  entry(h: TarHeader): void {
    const path = normalizeEntryPath(h.name, this.validator.limits);
    for (const name of UNSUPPORTED_OVERLAY_XATTRS) {
      if (h.xattrs.has(name)) throw new LayerTransferError('unsupported_overlay_feature', `${path} carries ${name}; metacopy/redirect_dir upper dirs cannot be captured`);
    }
    if (h.type === 'char-device' && h.devMajor === 0 && h.devMinor === 0 && path !== '.') {
      // Overlay whiteout → OCI whiteout. Mode is meaningless for whiteouts; fix it for stable bytes.
      this.emit({ ...h, name: joinPath(parentOf(path), whiteoutName(baseNameOf(path))), type: 'file', size: 0, mode: 0o600, devMajor: 0, devMinor: 0, xattrs: new Map() });
      return;
    }
    const opaque = h.type === 'directory' && h.xattrs.get(OVERLAY_OPAQUE_XATTR)?.toString('latin1') === 'y';
    const xattrs = new Map([...h.xattrs].filter(([name]) => !name.startsWith(OVERLAY_XATTR_PREFIX)));
    const linkName = h.type === 'hardlink' && h.linkName !== undefined ? normalizeEntryPath(h.linkName, this.validator.limits) : h.linkName;
    const header: TarHeader = { ...h, name: path, xattrs };
    if (linkName !== undefined) header.linkName = linkName;
    this.emit(header);
    this.dataSize = h.type === 'file' ? h.size : 0;
    if (opaque) this.emit({ ...h, name: joinPath(path, OPAQUE_WHITEOUT), type: 'file', size: 0, mode: 0o600, xattrs: new Map(), linkName: undefined });
  }

  data(slice: Buffer): void {
    this.out.push(slice);
  }

  entryEnd(): void {
    if (this.dataSize > 0) this.out.push(dataPadding(this.dataSize));
    this.dataSize = 0;
  }

  private emit(h: TarHeader): void {
    const admitted = { name: h.name, type: h.type, size: h.type === 'file' ? h.size : 0, xattrNames: [...h.xattrs.keys()] };
    this.validator.admit(h.linkName !== undefined ? { ...admitted, linkName: h.linkName } : admitted);
    if (h.linkName === undefined) delete h.linkName;
    this.out.push(encodeHeader(h));
  }
}

/**
 * Start capturing `upperDir`. The container must be stopped: a file changing under tar fails the
 * capture (`capture_failed`) rather than producing a torn layer.
 */
export function captureLayer(upperDir: string, options: CaptureOptions = {}): LayerCapture {
  let resolve!: (layer: CapturedLayer) => void;
  let reject!: (err: unknown) => void;
  const done = new Promise<CapturedLayer>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  done.catch(() => undefined); // the stream consumer sees the same error
  const stream = generate(upperDir, options, resolve, reject);
  return { stream, done };
}

async function* generate(upperDir: string, options: CaptureOptions, resolve: (l: CapturedLayer) => void, reject: (e: unknown) => void): AsyncGenerator<Buffer> {
  const limits = options.limits ?? DEFAULT_LAYER_LIMITS;
  const validator = new LayerValidator(limits);
  const sink = new OverlayToOci(validator);
  const parser = new TarParser(sink, limits.maxPaxHeaderBytes);
  const hash = options.hashLayer === false ? null : createHash('sha256');
  let size = 0;
  const child = spawn(options.tarPath ?? 'tar', captureTarArgs(upperDir), { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (s: string) => {
    if (stderr.length < 8192) stderr += s;
  });
  const exited = new Promise<number | null>((res) => {
    child.on('close', (code) => res(code));
    child.on('error', (err) => {
      stderr += String(err);
      res(null);
    });
  });
  let finished = false;
  try {
    for await (const input of child.stdout as AsyncIterable<Buffer>) {
      parser.push(input);
      for (const piece of sink.out) {
        hash?.update(piece);
        size += piece.length;
        yield piece;
      }
      sink.out.length = 0;
    }
    const code = await exited;
    if (code !== 0) throw new LayerTransferError('capture_failed', `tar of ${upperDir} exited ${String(code)}: ${stderr.trim()}`);
    parser.end();
    hash?.update(END_OF_ARCHIVE);
    size += END_OF_ARCHIVE.length;
    yield END_OF_ARCHIVE;
    finished = true;
    resolve({ digest: hash === null ? null : `sha256:${hash.digest('hex')}`, size, entries: validator.entryCount });
  } catch (err) {
    reject(err);
    throw err;
  } finally {
    if (!finished) {
      if (child.exitCode === null) child.kill('SIGKILL');
      reject(new LayerTransferError('capture_failed', 'capture abandoned before the end of the layer'));
    }
  }
}
