// Restore an OCI layer tar into an overlay upper dir (R-G5, R-R4). The stream is hashed and parsed
// here; every entry is validated (core/layer-rules.ts) BEFORE it is handed to GNU tar, converted to
// overlay form on the way (`.wh.x` → 0/0 char device `x`, `.wh..wh..opq` → the directory again
// with trusted.overlay.opaque=y), and re-encoded so tar only ever sees names we produced.
// Atomicity: extraction goes into a fresh staging dir next to the target (same filesystem); only
// when the whole-layer digest, the size, the tar structure and tar's exit status are all good is
// the staging dir renamed onto the (empty) target. Any failure removes the staging dir, so the
// target is either untouched or complete, and nothing is ever written outside the staging dir.
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdir, readdir, rename, rm, rmdir } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { DEFAULT_LAYER_LIMITS, LayerRuleError, LayerValidator, OVERLAY_OPAQUE_XATTR, type LayerLimits } from '../../core/layer-rules.ts';
import { LayerTransferError } from './errors.ts';
import { END_OF_ARCHIVE, TarParser, dataPadding, encodeHeader, type TarHeader, type TarSink } from './tar-format.ts';

export interface ExpectedLayer {
  readonly digest: string;
  readonly size: number;
}

/** A running whole-layer sha256; default node:crypto here, or off-thread (sha256-pool.ts). */
export interface StreamHash {
  update(data: Uint8Array): void;
  /** `sha256:<hex>` of everything updated, in order. */
  digest(): string | Promise<string>;
  /** Free it without a result (restore failed). */
  abort?(): void;
}

export interface RestoreOptions {
  readonly limits?: LayerLimits;
  readonly tarPath?: string;
  readonly layerHash?: StreamHash;
}

function localStreamHash(): StreamHash {
  const hash = createHash('sha256');
  return { update: (data) => hash.update(data), digest: () => `sha256:${hash.digest('hex')}` };
}

export interface RestoredLayer {
  readonly entries: number;
  readonly size: number;
}

/**
 * GNU tar arguments for extraction as root: owners, modes, xattrs (incl. trusted.*) as given. 1 MiB
 * reads re-blocked from the pipe (`--read-full-records`): ~25% less tar time than 10 KiB records
 * for a 200 MiB layer (measured here).
 */
export function restoreTarArgs(dir: string): string[] {
  return ['--extract', '--file=-', '--blocking-factor=2048', '--read-full-records', '--xattrs', '--xattrs-include=*', '--same-owner', '--same-permissions', '--numeric-owner', '--directory', dir];
}

const OPAQUE_VALUE = Buffer.from('y');

/** Validates OCI-form entries and re-emits them in overlay form. */
export class OciToOverlay implements TarSink {
  readonly out: Buffer[] = [];
  private dataSize = 0;
  /** Directory headers by path, to re-emit one with the opaque xattr when its marker arrives. */
  private readonly dirs = new Map<string, TarHeader>();

  constructor(private readonly validator: LayerValidator) {}

  entry(h: TarHeader): void {
    const entry = { name: h.name, type: h.type, size: h.size, xattrNames: [...h.xattrs.keys()] };
    const admitted = this.validator.admit(h.linkName !== undefined ? { ...entry, linkName: h.linkName } : entry);
    this.dataSize = h.type === 'file' ? h.size : 0;
    switch (admitted.kind) {
      case 'entry': {
        const header: TarHeader = { ...h, name: admitted.path };
        if (admitted.linkTarget !== undefined) header.linkName = admitted.linkTarget;
        if (h.type === 'directory') this.dirs.set(admitted.path, header);
        this.out.push(encodeHeader(header));
        return;
      }
      case 'whiteout':
        this.out.push(encodeHeader({ ...h, name: admitted.path, type: 'char-device', mode: 0, size: 0, devMajor: 0, devMinor: 0, xattrs: new Map() }));
        return;
      case 'opaque': {
        // Tar sets a directory's metadata again when it meets the directory a second time.
        const dir = this.dirs.get(admitted.dir) ?? { name: admitted.dir, type: 'directory', mode: 0o755, uid: 0, gid: 0, size: 0, mtime: h.mtime, devMajor: 0, devMinor: 0, xattrs: new Map() };
        const xattrs = new Map(dir.xattrs);
        xattrs.set(OVERLAY_OPAQUE_XATTR, OPAQUE_VALUE);
        this.out.push(encodeHeader({ ...dir, xattrs }));
        return;
      }
    }
  }

  data(slice: Buffer): void {
    this.out.push(slice);
  }

  entryEnd(): void {
    if (this.dataSize > 0) this.out.push(dataPadding(this.dataSize));
    this.dataSize = 0;
  }
}

async function assertEmptyOrAbsent(target: string): Promise<boolean> {
  try {
    const names = await readdir(target);
    if (names.length > 0) throw new LayerTransferError('target_not_empty', `restore target ${target} is not empty`);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}

/**
 * Verify and extract a layer stream into `targetDir` (absent or empty). Throws LayerRuleError for
 * a refused entry, LayerTransferError for digest/size/extract failures; the target then is unchanged.
 */
export async function restoreLayer(source: AsyncIterable<Uint8Array> | Iterable<Uint8Array>, expected: ExpectedLayer, targetDir: string, options: RestoreOptions = {}): Promise<RestoredLayer> {
  const limits = options.limits ?? DEFAULT_LAYER_LIMITS;
  // Tar headers can at most double a layer of empty entries; the data bound is the validator's.
  if (expected.size > limits.maxLayerBytes * 2 + 1024 * 1024) throw new LayerRuleError('layer_too_large', `layer of ${expected.size} bytes exceeds the limit`);
  const targetExists = await assertEmptyOrAbsent(targetDir);
  const staging = join(dirname(targetDir), `.${basename(targetDir)}.restore-${randomBytes(6).toString('hex')}`);
  await mkdir(staging, { mode: 0o700 });
  const child = spawn(options.tarPath ?? 'tar', restoreTarArgs(staging), { stdio: ['pipe', 'ignore', 'pipe'] });
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
  let committed = false;
  const hash = options.layerHash ?? localStreamHash();
  let hashed = false;
  try {
    const validator = new LayerValidator(limits);
    const sink = new OciToOverlay(validator);
    const parser = new TarParser(sink, limits.maxPaxHeaderBytes);
    let size = 0;
    for await (const input of source) {
      size += input.length;
      if (size > expected.size) throw new LayerTransferError('layer_size_mismatch', `layer is longer than the expected ${expected.size} bytes`);
      hash.update(input);
      parser.push(Buffer.isBuffer(input) ? input : Buffer.from(input.buffer, input.byteOffset, input.byteLength));
      let writable = true;
      for (const piece of sink.out) writable = child.stdin.write(piece);
      sink.out.length = 0;
      if (!writable && child.exitCode === null) await Promise.race([once(child.stdin, 'drain'), exited]);
    }
    if (size !== expected.size) throw new LayerTransferError('layer_size_mismatch', `layer has ${size} bytes, expected ${expected.size}`);
    hashed = true;
    const digest = await hash.digest();
    if (digest !== expected.digest) throw new LayerTransferError('layer_digest_mismatch', `layer hashes to ${digest}, expected ${expected.digest}`);
    parser.end();
    child.stdin.end(END_OF_ARCHIVE);
    const code = await exited;
    if (code !== 0) throw new LayerTransferError('extract_failed', `tar -x exited ${String(code)}: ${stderr.trim()}`);
    if (targetExists) await rmdir(targetDir);
    await rename(staging, targetDir);
    committed = true;
    return { entries: validator.entryCount, size };
  } finally {
    if (!committed) {
      if (!hashed) hash.abort?.();
      if (child.exitCode === null) child.kill('SIGKILL');
      await exited;
      await rm(staging, { recursive: true, force: true });
    }
  }
}
