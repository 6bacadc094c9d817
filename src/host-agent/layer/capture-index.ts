// The per-host capture index (issue #17): what the last checkpoint of one container's upper dir
// read, so the next one reads only what changed. For every entry: its lstat (inode, mode, owner,
// links, size, mtime and ctime in ns), where its record lies in that layer, and whether it may be
// reused at all; plus the layer's chunk list. Kept on this host's disk next to the chunk cache, not
// in the manifest: inodes and ctimes mean something only on the host that stat'ed them, and a
// manifest is bounded to one NATS message while an index grows with the number of files.
// A hint, never evidence: a missing, unreadable, damaged (checksum), foreign (other container,
// upper dir, format) or inconsistent index just means a full capture. Reused chunks are checked to
// be in the store before a manifest names them, and restore verifies every chunk as always.
// File format: `<sha256 hex of the JSON>\n<JSON>`, written to a temp file and renamed into place.
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, readFile, readdir, rename, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { isSafeId, isSha256Digest, type ChunkRef } from '../../core/checkpoint-manifest.ts';
import type { EntryStat } from './walk.ts';

export const CAPTURE_INDEX_VERSION = 1;
/** A larger index file is not read (it would be a layer of millions of entries): full capture. */
const MAX_INDEX_BYTES = 512 * 1024 * 1024;

export interface IndexEntry {
  readonly key: string;
  readonly stat: EntryStat;
  /** The entry's record in the layer: [start, end), its data from dataStart. */
  readonly start: number;
  readonly dataStart: number;
  readonly end: number;
  /**
   * Whether an unchanged stat lets the next capture copy this record unread: false for entries
   * written within RACY_MARGIN of the walk (a write in the same tick leaves the stat unchanged), with
   * xattrs, whiteouts, opaque dirs, hard links, other file systems and anything but files, dirs
   * and symlinks.
   */
  readonly reusable: boolean;
  /** A symlink's target (restore's validator checks it; the record is copied, not re-read). */
  readonly linkName?: string;
}

export interface CaptureIndex {
  readonly version: typeof CAPTURE_INDEX_VERSION;
  /** Chunker and header-encoder identity: another format reuses nothing. */
  readonly format: string;
  /** The container whose upper dir this is. */
  readonly containerId: string;
  readonly upperDir: string;
  readonly rootDev: bigint;
  readonly rootIno: bigint;
  /** Captures since the last full read (0: this one was full). */
  readonly capturesSinceFull: number;
  readonly layer: { readonly digest: string; readonly size: number; readonly chunks: readonly ChunkRef[] };
  readonly entries: readonly IndexEntry[];
}

type Row = [string, string, number, number, number, number, number, string, string, number, number, number, 0 | 1, string?];

function toJson(index: CaptureIndex): string {
  const rows: Row[] = index.entries.map((e) => {
    const s = e.stat;
    const row: Row = [e.key, String(s.ino), s.mode, s.nlink, s.uid, s.gid, s.size, String(s.mtimeNs), String(s.ctimeNs), e.start, e.dataStart, e.end, e.reusable ? 1 : 0];
    if (e.linkName !== undefined) row.push(e.linkName);
    return row;
  });
  return JSON.stringify({
    version: index.version,
    format: index.format,
    containerId: index.containerId,
    upperDir: index.upperDir,
    rootDev: String(index.rootDev),
    rootIno: String(index.rootIno),
    capturesSinceFull: index.capturesSinceFull,
    layer: index.layer,
    entries: rows,
  });
}

const isUint = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const isBigText = (v: unknown): v is string => typeof v === 'string' && /^[0-9]{1,20}$/.test(v);

/** Parse and check an index's JSON; undefined for anything that is not exactly what we write. */
function fromJson(text: string): CaptureIndex | undefined {
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(text) as Record<string, unknown>;
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null || v.version !== CAPTURE_INDEX_VERSION) return undefined;
  if (typeof v.format !== 'string' || typeof v.containerId !== 'string' || typeof v.upperDir !== 'string' || !isBigText(v.rootDev) || !isBigText(v.rootIno) || !isUint(v.capturesSinceFull)) return undefined;
  const layer = v.layer as Record<string, unknown> | undefined;
  if (typeof layer !== 'object' || layer === null || !isSha256Digest(layer.digest) || !isUint(layer.size) || !Array.isArray(layer.chunks)) return undefined;
  let sum = 0;
  const chunks: ChunkRef[] = [];
  for (const c of layer.chunks as unknown[]) {
    const o = c as Record<string, unknown>;
    if (typeof o !== 'object' || o === null || !isSha256Digest(o.digest) || !isUint(o.size) || o.size === 0) return undefined;
    chunks.push({ digest: o.digest, size: o.size });
    sum += o.size;
  }
  if (sum !== layer.size || !Array.isArray(v.entries)) return undefined;
  const entries: IndexEntry[] = [];
  let previousEnd = 0;
  for (const r of v.entries as unknown[]) {
    if (!Array.isArray(r) || r.length < 13 || r.length > 14) return undefined;
    const [key, ino, mode, nlink, uid, gid, size, mtimeNs, ctimeNs, start, dataStart, end, reusable, linkName] = r as unknown[];
    if (typeof key !== 'string' || !isBigText(ino) || !isUint(mode) || !isUint(nlink) || !isUint(uid) || !isUint(gid) || !isUint(size) || !isBigText(mtimeNs) || !isBigText(ctimeNs)) return undefined;
    // Records lie in order, inside the layer, without overlap.
    if (!isUint(start) || !isUint(dataStart) || !isUint(end) || start < previousEnd || dataStart < start || end < dataStart || end > layer.size) return undefined;
    if (reusable !== 0 && reusable !== 1) return undefined;
    if (linkName !== undefined && typeof linkName !== 'string') return undefined;
    previousEnd = end;
    const stat: EntryStat = { dev: BigInt(v.rootDev), ino: BigInt(ino), mode, nlink, uid, gid, size, mtimeNs: BigInt(mtimeNs), ctimeNs: BigInt(ctimeNs) };
    entries.push({ key, stat, start, dataStart, end, reusable: reusable === 1, ...(linkName !== undefined ? { linkName } : {}) });
  }
  return {
    version: CAPTURE_INDEX_VERSION,
    format: v.format,
    containerId: v.containerId,
    upperDir: v.upperDir,
    rootDev: BigInt(v.rootDev),
    rootIno: BigInt(v.rootIno),
    capturesSinceFull: v.capturesSinceFull,
    layer: { digest: layer.digest, size: layer.size, chunks },
    entries,
  };
}

export function serializeCaptureIndex(index: CaptureIndex): string {
  const json = toJson(index);
  return `${createHash('sha256').update(json).digest('hex')}\n${json}`;
}

/** The index in `text`, or undefined when it is damaged or not one this version wrote. */
export function parseCaptureIndex(text: string): CaptureIndex | undefined {
  const nl = text.indexOf('\n');
  if (nl !== 64) return undefined;
  const json = text.slice(nl + 1);
  if (createHash('sha256').update(json).digest('hex') !== text.slice(0, nl)) return undefined;
  return fromJson(json);
}

/** Where the indexes of this host live: one file per group member, `<dir>/<group>/<member>.idx`. */
export class CaptureIndexStore {
  private lastPrune = 0;

  constructor(
    readonly dir: string,
    /** Index files untouched this long are removed (their groups left this host or were destroyed). */
    private readonly maxAgeMs = 30 * 24 * 3_600_000,
  ) {}

  private fileOf(groupId: string, memberId: string): string {
    if (!isSafeId(groupId) || !isSafeId(memberId)) throw new RangeError(`unsafe group/member id ${groupId}/${memberId}`);
    return join(this.dir, groupId, `${memberId}.idx`);
  }

  /** The member's index if it is intact and was taken of `containerId`; undefined otherwise. */
  async load(groupId: string, memberId: string, containerId: string): Promise<CaptureIndex | undefined> {
    const file = this.fileOf(groupId, memberId);
    try {
      if ((await stat(file)).size > MAX_INDEX_BYTES) return undefined;
      const index = parseCaptureIndex(await readFile(file, 'utf8'));
      return index?.containerId === containerId ? index : undefined;
    } catch {
      return undefined;
    }
  }

  /** Replace the member's index (atomically: a crash leaves the old one or the new one). */
  async save(groupId: string, memberId: string, index: CaptureIndex, nowMs: number): Promise<void> {
    const file = this.fileOf(groupId, memberId);
    await mkdir(join(this.dir, groupId), { recursive: true, mode: 0o700 });
    const tmp = `${file}.${randomBytes(6).toString('hex')}.tmp`;
    try {
      await writeFile(tmp, serializeCaptureIndex(index), { mode: 0o600 });
      await rename(tmp, file);
    } finally {
      await unlink(tmp).catch(() => undefined);
    }
    if (nowMs - this.lastPrune > 3_600_000) {
      this.lastPrune = nowMs;
      await this.prune(nowMs).catch(() => undefined);
    }
  }

  /** Forget a member's index (its next capture is full). */
  async drop(groupId: string, memberId: string): Promise<void> {
    await rm(this.fileOf(groupId, memberId), { force: true });
  }

  private async prune(nowMs: number): Promise<void> {
    for (const group of await readdir(this.dir)) {
      const dir = join(this.dir, group);
      const files = await readdir(dir).catch(() => [] as string[]);
      for (const name of files) {
        const st = await stat(join(dir, name)).catch(() => undefined);
        if (st !== undefined && nowMs - st.mtimeMs > this.maxAgeMs) await rm(join(dir, name), { force: true });
      }
      if (files.length === 0 || (await readdir(dir).catch(() => ['x'])).length === 0) await rm(dir, { recursive: true, force: true }).catch(() => undefined);
    }
  }
}
