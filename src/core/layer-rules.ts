// Validation of writable-layer tar entries before anything touches a disk (R-R4, R-G5), plus the OCI
// whiteout naming shared by capture and restore (R-G3). Pure: the tar reader in host-agent turns
// bytes into LayerEntry values and asks a LayerValidator whether each may be written, and what it
// becomes in overlay form. Every refusal is a LayerRuleError with a stable machine-readable reason.

/** Stable refusal reasons; callers map them to LOST reasons / events without parsing messages. */
export type LayerRefusalReason =
  | 'path_traversal' // a `..` component
  | 'absolute_path' // an entry name or hard-link target starting with `/`
  | 'link_escape' // symlink target leaving the root, hard link not to an earlier entry, path through a symlink
  | 'device_node' // char/block device or fifo that is not an overlay whiteout
  | 'too_many_entries'
  | 'layer_too_large' // sum of entry sizes (or the stream) above the configured maximum
  | 'name_too_long' // name, component, link target or depth above the limits
  | 'names_too_large' // all entry names and link targets together above the limit (validator memory)
  | 'pax_header_too_large'
  | 'too_many_xattrs'
  | 'forbidden_xattr' // trusted.overlay.* must never come from a layer: it steers overlayfs itself
  | 'invalid_name' // empty, NUL byte, or otherwise unusable name
  | 'invalid_whiteout' // .wh. entry that is not an empty regular file, or an unknown .wh..wh. marker
  | 'duplicate_entry' // the same path twice (ours never does it; refusing keeps link checks sound)
  | 'parent_not_directory' // an entry below a path that this layer made a file/whiteout/etc.
  | 'unsupported_entry_type'
  | 'malformed_tar'; // bad checksum, bad number, truncated stream, data after the end

export class LayerRuleError extends Error {
  override readonly name = 'LayerRuleError';
  constructor(
    readonly reason: LayerRefusalReason,
    message: string,
    /** The offending entry name as found in the archive, when there is one. */
    readonly entryPath?: string,
  ) {
    super(message);
  }
}

/** Bounds for one layer. Defaults fit agent sandboxes (a few GiB, node_modules-sized trees). */
export interface LayerLimits {
  readonly maxEntries: number;
  /** Sum of all entry data sizes (bytes). */
  readonly maxLayerBytes: number;
  /** A full entry name or hard-link target in bytes (Linux PATH_MAX - 1). */
  readonly maxNameBytes: number;
  /** One path component in bytes (NAME_MAX). */
  readonly maxComponentBytes: number;
  readonly maxPathDepth: number;
  /** A symlink target in bytes. */
  readonly maxLinkTargetBytes: number;
  /** One PAX extended header body in bytes (holds long names and xattrs). */
  readonly maxPaxHeaderBytes: number;
  readonly maxXattrsPerEntry: number;
  /**
   * All entry names and link targets together, as string length (one per byte of an ASCII name).
   * The validator remembers every path (for duplicates, parents and hard links), so this, with
   * maxEntries, bounds its memory.
   */
  readonly maxNameBytesTotal: number;
}

export const DEFAULT_LAYER_LIMITS: LayerLimits = Object.freeze({
  maxEntries: 1_000_000,
  maxLayerBytes: 4 * 1024 ** 3,
  maxNameBytes: 4095,
  maxComponentBytes: 255,
  maxPathDepth: 256,
  maxLinkTargetBytes: 4095,
  maxPaxHeaderBytes: 256 * 1024,
  maxXattrsPerEntry: 64,
  maxNameBytesTotal: 256 * 1024 ** 2,
});

/** Merge partial overrides onto the defaults, refusing nonsense (non-positive, non-integer). */
export function layerLimits(overrides: Partial<LayerLimits> = {}): LayerLimits {
  const merged = { ...DEFAULT_LAYER_LIMITS, ...overrides };
  for (const [key, value] of Object.entries(merged)) {
    if (!Number.isSafeInteger(value) || value <= 0) throw new RangeError(`layer limit ${key} must be a positive integer, got ${String(value)}`);
  }
  return Object.freeze(merged);
}

/**
 * The longest layer tar stream (the manifest's layer size) a layer within `limits` can take: its data
 * plus as much again for headers, padding and PAX records (the bound restore has always used), and
 * the end-of-archive blocks and record padding. A larger declared size is refused before any fetch.
 */
export function maxLayerStreamBytes(limits: LayerLimits): number {
  return limits.maxLayerBytes * 2 + 1024 * 1024;
}

// ---- OCI whiteouts -------------------------------------------------------------------------------

export const WHITEOUT_PREFIX = '.wh.';
/** Marks its directory opaque: nothing from lower layers shows through. */
export const OPAQUE_WHITEOUT = '.wh..wh..opq';
/** The overlayfs xattr that marks an upper dir opaque (value "y"). */
export const OVERLAY_OPAQUE_XATTR = 'trusted.overlay.opaque';
export const OVERLAY_XATTR_PREFIX = 'trusted.overlay.';

/** `.wh.<name>`: the OCI entry that deletes `<name>` from lower layers. */
export function whiteoutName(name: string): string {
  if (name === '' || name === '.' || name === '..' || name.includes('/')) throw new RangeError(`not a file name: ${JSON.stringify(name)}`);
  return WHITEOUT_PREFIX + name;
}

export type WhiteoutKind = { readonly kind: 'whiteout'; readonly target: string } | { readonly kind: 'opaque' };

/** Classify a base name: a whiteout of `target`, the opaque marker, or null for ordinary names. */
export function parseWhiteout(baseName: string): WhiteoutKind | null {
  if (baseName === OPAQUE_WHITEOUT) return { kind: 'opaque' };
  if (!baseName.startsWith(WHITEOUT_PREFIX)) return null;
  const target = baseName.slice(WHITEOUT_PREFIX.length);
  // `.wh..wh.*` is reserved for markers (aufs used `.wh..wh.plnk`); we know only the opaque one.
  if (target.startsWith(WHITEOUT_PREFIX)) throw new LayerRuleError('invalid_whiteout', `unknown whiteout marker ${baseName}`, baseName);
  if (target === '' || target === '.' || target === '..') throw new LayerRuleError('invalid_whiteout', `whiteout of nothing: ${baseName}`, baseName);
  return { kind: 'whiteout', target };
}

// ---- names ---------------------------------------------------------------------------------------

const encoder = new TextEncoder();
const byteLength = (s: string): number => encoder.encode(s).length;

/**
 * Normalize an archive name to `a/b/c` (no leading `./`, no trailing `/`, no empty or `.`
 * components); the layer root is `.`. Absolute names and `..` components are refused, not cleaned:
 * a layer we wrote never has them, so their presence means a hostile or broken blob.
 */
export function normalizeEntryPath(raw: string, limits: LayerLimits = DEFAULT_LAYER_LIMITS): string {
  if (raw === '') throw new LayerRuleError('invalid_name', 'empty entry name', raw);
  if (raw.includes('\0')) throw new LayerRuleError('invalid_name', 'NUL byte in entry name', raw);
  if (byteLength(raw) > limits.maxNameBytes) throw new LayerRuleError('name_too_long', `entry name longer than ${limits.maxNameBytes} bytes`, raw);
  if (raw.startsWith('/')) throw new LayerRuleError('absolute_path', `absolute entry name ${raw}`, raw);
  const parts: string[] = [];
  for (const part of raw.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') throw new LayerRuleError('path_traversal', `'..' in entry name ${raw}`, raw);
    if (byteLength(part) > limits.maxComponentBytes) throw new LayerRuleError('name_too_long', `component longer than ${limits.maxComponentBytes} bytes`, raw);
    parts.push(part);
  }
  if (parts.length > limits.maxPathDepth) throw new LayerRuleError('name_too_long', `deeper than ${limits.maxPathDepth} levels`, raw);
  return parts.length === 0 ? '.' : parts.join('/');
}

/** Directory part of a normalized path (`.` for top-level names and the root). */
export function parentOf(path: string): string {
  const i = path.lastIndexOf('/');
  return i < 0 ? '.' : path.slice(0, i);
}

export function baseNameOf(path: string): string {
  return path.slice(path.lastIndexOf('/') + 1);
}

export function joinPath(dir: string, name: string): string {
  return dir === '.' ? name : `${dir}/${name}`;
}

/**
 * True when a relative symlink target, resolved lexically from the link's directory, stays inside
 * the root. Absolute targets are fine: they resolve inside the container at run time.
 */
export function symlinkStaysInside(linkPath: string, target: string): boolean {
  if (target.startsWith('/')) return true;
  const dir = parentOf(linkPath);
  let depth = dir === '.' ? 0 : dir.split('/').length;
  for (const part of target.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') {
      depth -= 1;
      if (depth < 0) return false;
    } else depth += 1;
  }
  return true;
}

// ---- entries -------------------------------------------------------------------------------------

export type LayerEntryType = 'file' | 'directory' | 'symlink' | 'hardlink' | 'char-device' | 'block-device' | 'fifo';

/** One tar entry as the reader decoded it (names already PAX-resolved, not yet normalized). */
export interface LayerEntry {
  readonly name: string;
  readonly type: LayerEntryType;
  /** Data bytes that follow the header (0 for anything but regular files). */
  readonly size: number;
  readonly linkName?: string;
  readonly devMajor?: number;
  readonly devMinor?: number;
  readonly xattrNames?: readonly string[];
}

/** What an admitted OCI-form entry becomes in overlay (upper dir) form. */
export type AdmittedEntry =
  /** Write as is, under the normalized path (hard links carry the normalized target). */
  | { readonly kind: 'entry'; readonly path: string; readonly linkTarget?: string }
  /** Create a 0/0 character device at `path` (overlay whiteout). */
  | { readonly kind: 'whiteout'; readonly path: string }
  /** Set trusted.overlay.opaque=y on directory `dir`. */
  | { readonly kind: 'opaque'; readonly dir: string };

type Seen = 'directory' | 'file' | 'symlink' | 'other';

/**
 * Stateful checker for one OCI layer stream, entry by entry, in archive order. Call admit() for
 * every entry BEFORE writing it; it throws LayerRuleError on the first refusal.
 */
export class LayerValidator {
  private entries = 0;
  private dataBytes = 0;
  private nameBytes = 0;
  private readonly seen = new Map<string, Seen>();
  private readonly opaque = new Set<string>();

  constructor(readonly limits: LayerLimits = DEFAULT_LAYER_LIMITS) {}

  /** Bytes of entry data admitted so far. */
  get totalBytes(): number {
    return this.dataBytes;
  }

  get entryCount(): number {
    return this.entries;
  }

  /** Called by readers before buffering a PAX body, so a huge one is refused unread. */
  checkPaxHeaderSize(size: number, name = ''): void {
    if (size > this.limits.maxPaxHeaderBytes) throw new LayerRuleError('pax_header_too_large', `PAX header of ${size} bytes exceeds ${this.limits.maxPaxHeaderBytes}`, name);
  }

  admit(entry: LayerEntry): AdmittedEntry {
    const raw = entry.name;
    this.entries += 1;
    if (this.entries > this.limits.maxEntries) throw new LayerRuleError('too_many_entries', `more than ${this.limits.maxEntries} entries`, raw);
    if (!Number.isSafeInteger(entry.size) || entry.size < 0) throw new LayerRuleError('malformed_tar', `bad size ${entry.size}`, raw);
    if (entry.type !== 'file' && entry.size !== 0) throw new LayerRuleError('malformed_tar', `${entry.type} entry with data`, raw);
    this.dataBytes += entry.size;
    if (this.dataBytes > this.limits.maxLayerBytes) throw new LayerRuleError('layer_too_large', `layer data exceeds ${this.limits.maxLayerBytes} bytes`, raw);
    this.checkXattrs(entry);

    const path = normalizeEntryPath(raw, this.limits);
    // What this entry adds to the names the validator holds (the raw name is never shorter than its normal form).
    this.nameBytes += raw.length + (entry.linkName?.length ?? 0);
    if (this.nameBytes > this.limits.maxNameBytesTotal) throw new LayerRuleError('names_too_large', `entry names exceed ${this.limits.maxNameBytesTotal} bytes in all`, raw);
    if (entry.type === 'char-device' || entry.type === 'block-device' || entry.type === 'fifo') {
      throw new LayerRuleError('device_node', `${entry.type} entries are refused (whiteouts travel as .wh. files)`, raw);
    }
    if (path === '.') {
      if (entry.type !== 'directory') throw new LayerRuleError('invalid_name', 'the layer root must be a directory', raw);
      this.record('.', 'directory', raw);
      return { kind: 'entry', path };
    }
    this.checkParents(path, raw);

    const wh = parseWhiteout(baseNameOf(path));
    if (wh !== null) {
      if (entry.type !== 'file' || entry.size !== 0 || (entry.xattrNames?.length ?? 0) > 0) {
        throw new LayerRuleError('invalid_whiteout', 'a whiteout must be an empty regular file without xattrs', raw);
      }
      const dir = parentOf(path);
      if (wh.kind === 'opaque') {
        if (this.seen.has(dir) && this.seen.get(dir) !== 'directory') throw new LayerRuleError('parent_not_directory', `opaque marker in non-directory ${dir}`, raw);
        if (this.opaque.has(dir)) throw new LayerRuleError('duplicate_entry', `directory ${dir} marked opaque twice`, raw);
        this.opaque.add(dir);
        return { kind: 'opaque', dir };
      }
      const target = joinPath(dir, wh.target);
      this.record(target, 'other', raw);
      return { kind: 'whiteout', path: target };
    }

    switch (entry.type) {
      case 'directory':
        this.record(path, 'directory', raw);
        return { kind: 'entry', path };
      case 'file':
        this.record(path, 'file', raw);
        return { kind: 'entry', path };
      case 'symlink': {
        const target = entry.linkName ?? '';
        if (target === '' || target.includes('\0')) throw new LayerRuleError('invalid_name', 'empty or NUL symlink target', raw);
        if (byteLength(target) > this.limits.maxLinkTargetBytes) throw new LayerRuleError('name_too_long', `symlink target longer than ${this.limits.maxLinkTargetBytes} bytes`, raw);
        if (!symlinkStaysInside(path, target)) throw new LayerRuleError('link_escape', `symlink ${path} -> ${target} leaves the root`, raw);
        this.record(path, 'symlink', raw);
        return { kind: 'entry', path };
      }
      case 'hardlink': {
        const rawTarget = entry.linkName ?? '';
        if (rawTarget.startsWith('/')) throw new LayerRuleError('link_escape', `hard link ${path} to absolute ${rawTarget}`, raw);
        let target: string;
        try {
          target = normalizeEntryPath(rawTarget, this.limits);
        } catch (err) {
          if (err instanceof LayerRuleError && err.reason === 'path_traversal') throw new LayerRuleError('link_escape', `hard link ${path} to ${rawTarget} leaves the root`, raw);
          throw err;
        }
        const kind = this.seen.get(target);
        if (kind !== 'file' && kind !== 'symlink') {
          throw new LayerRuleError('link_escape', `hard link ${path} must point to an earlier file of this layer, not ${rawTarget}`, raw);
        }
        this.record(path, kind, raw);
        return { kind: 'entry', path, linkTarget: target };
      }
      default:
        throw new LayerRuleError('unsupported_entry_type', `entry type ${String(entry.type)}`, raw);
    }
  }

  private checkXattrs(entry: LayerEntry): void {
    const names = entry.xattrNames ?? [];
    if (names.length > this.limits.maxXattrsPerEntry) throw new LayerRuleError('too_many_xattrs', `more than ${this.limits.maxXattrsPerEntry} xattrs`, entry.name);
    for (const name of names) {
      if (name.startsWith(OVERLAY_XATTR_PREFIX)) throw new LayerRuleError('forbidden_xattr', `xattr ${name} may not come from a layer`, entry.name);
      if (name === '' || name.includes('\0')) throw new LayerRuleError('invalid_name', 'bad xattr name', entry.name);
    }
  }

  /** No ancestor may be a symlink (tar would write through it) or a non-directory of this layer. */
  private checkParents(path: string, raw: string): void {
    let i = path.indexOf('/');
    while (i >= 0) {
      const kind = this.seen.get(path.slice(0, i));
      if (kind === 'symlink') throw new LayerRuleError('link_escape', `${path} goes through symlink ${path.slice(0, i)}`, raw);
      if (kind !== undefined && kind !== 'directory') throw new LayerRuleError('parent_not_directory', `${path} is below non-directory ${path.slice(0, i)}`, raw);
      i = path.indexOf('/', i + 1);
    }
  }

  private record(path: string, kind: Seen, raw: string): void {
    if (this.seen.has(path)) throw new LayerRuleError('duplicate_entry', `${path} appears twice`, raw);
    this.seen.set(path, kind);
  }
}
