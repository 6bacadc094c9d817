// The checkpoint manifest (R-G3): the record, written last, that makes a checkpoint exist. Pure: a
// strict bounded parser (R-R4) so a corrupt or hostile manifest is refused with a reason before any
// chunk is fetched, and the compatibility check of R-G4 (base image digest, bridge version).
// Two schema versions, both readable; they differ only in what a member's `layer.digest` is:
//   1: sha256 of the whole layer tar (every byte hashed in order: capture must read every byte);
//   2: sha256 of the layer's chunk list (chunkListText): an incremental capture reuses the chunks
//      of unchanged files without reading them (host-agent/layer/incremental.ts), so it cannot hash
//      bytes it never read. Integrity is the same: every chunk is verified against its own sha256
//      on every read, and the list that orders them is what the digest covers.
import { createHash } from 'node:crypto';
import { isHostId } from './ids.ts';

/** The newest schema version (what a capture that may reuse chunks writes). */
export const CHECKPOINT_MANIFEST_SCHEMA_VERSION = 2;
/** Every version this code reads. */
export const MANIFEST_SCHEMA_VERSIONS = [1, 2] as const;
export type ManifestSchemaVersion = (typeof MANIFEST_SCHEMA_VERSIONS)[number];

/** What a layer digest covers: the tar bytes (version 1) or the chunk list (version 2). */
export type LayerDigestKind = 'tar' | 'chunk-list';

export function layerDigestKind(schemaVersion: ManifestSchemaVersion): LayerDigestKind {
  return schemaVersion === 1 ? 'tar' : 'chunk-list';
}

/**
 * The text a version-2 layer digest is the sha256 of: one line per chunk, in layer order,
 * `sha256:<64 hex> <size>\n`. The sizes are in it so the list alone fixes the layer's length.
 */
export function chunkListText(chunks: readonly ChunkRef[]): string {
  let text = '';
  for (const c of chunks) text += `${c.digest} ${c.size}\n`;
  return text;
}

/** `sha256:<hex>` of chunkListText: a version-2 layer digest (hashing is pure; no I/O). */
export function chunkListDigest(chunks: readonly ChunkRef[]): string {
  return `sha256:${createHash('sha256').update(chunkListText(chunks)).digest('hex')}`;
}

/**
 * Upper bound of a serialized manifest. It must fit one NATS message (default max_payload 1 MiB)
 * with headroom for headers; at ~100 bytes per chunk ref that is ~9,000 chunks ≈ 4.5 GiB of layers.
 */
export const DEFAULT_MAX_MANIFEST_BYTES = 960 * 1024;
/** Chunks are stored as single NATS messages, so none may exceed 1 MiB. */
export const MAX_CHUNK_BYTES = 1024 * 1024;

export type ManifestRefusalReason =
  | 'manifest_too_large'
  | 'manifest_invalid'
  | 'manifest_unsupported_version'
  | 'base_image_mismatch'
  | 'bridge_version_mismatch';

export class ManifestError extends Error {
  override readonly name = 'ManifestError';
  constructor(
    readonly reason: ManifestRefusalReason,
    message: string,
  ) {
    super(message);
  }
}

/** A content-addressed piece of a layer blob. */
export interface ChunkRef {
  /** `sha256:<64 hex>` of the chunk bytes. */
  readonly digest: string;
  readonly size: number;
}

/** One member's writable layer in OCI layer-tar form, as an ordered list of chunks. */
export interface LayerRef {
  /** `sha256:<64 hex>` of the whole uncompressed layer tar (its OCI diff id). */
  readonly digest: string;
  readonly size: number;
  readonly chunks: readonly ChunkRef[];
}

export interface CheckpointMember {
  readonly memberId: string;
  /** Which native CLI runs in the member (claude-code, codex, ...). */
  readonly cliKind: string;
  /** The native session locator saved for this member; null if it never completed a turn. */
  readonly savedLocator: string | null;
  /** Absolute in-container paths of the native session files (checked after restore, R-G5). */
  readonly nativeSessionPaths: readonly string[];
  readonly layer: LayerRef;
}

/** Evidence that the stop before this checkpoint was clean (R-G2). */
export interface CleanStopEvidence {
  readonly stoppedAtMs: number;
  /** When the group's last turn completed; null if it never ran one. */
  readonly lastTurnCompletedAtMs: number | null;
  /** The group record revision the checkpoint was taken at ("nothing happened since", R-G4). */
  readonly stateRevision: number;
  readonly members: readonly { readonly memberId: string; readonly exitCode: number; readonly exitedWithinGrace: true }[];
}

export interface CheckpointManifest {
  /** 1 or 2: what each layer digest covers (layerDigestKind). */
  readonly schemaVersion: ManifestSchemaVersion;
  readonly checkpointId: string;
  readonly groupId: string;
  readonly placementGeneration: number;
  readonly source: { readonly hostId: string; readonly epoch: number };
  readonly createdAtMs: number;
  readonly cleanStop: CleanStopEvidence;
  readonly members: readonly CheckpointMember[];
  /** Image the member containers were created from; the target must have exactly this one. */
  readonly baseImageDigest: string;
  /** Live-bridge version inside the containers; the target must run the same. */
  readonly bridgeVersion: string;
}

const ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;
const CLI_KIND_RE = /^[a-z][a-z0-9._-]{0,31}$/;
const VERSION_RE = /^[\x21-\x7e]{1,64}$/;
const MAX_MEMBERS = 16;
const MAX_SESSION_PATHS = 64;
const MAX_PATH_CHARS = 4095;
const MAX_LOCATOR_CHARS = 512;

/**
 * Group, member and checkpoint ids used in subjects and keys: letters, digits, `_`, `-`, 1..64
 * chars. Not for host ids: those are Kubernetes node names with their own rule (ids.ts isHostId).
 */
export function isSafeId(value: unknown): value is string {
  return typeof value === 'string' && ID_RE.test(value);
}

export function isSha256Digest(value: unknown): value is string {
  return typeof value === 'string' && DIGEST_RE.test(value);
}

// ---- strict shape checks -------------------------------------------------------------------------

type Obj = Record<string, unknown>;

function fail(path: string, what: string): never {
  throw new ManifestError('manifest_invalid', `${path}: ${what}`);
}

function obj(v: unknown, path: string, keys: readonly string[]): Obj {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) fail(path, 'expected an object');
  const o = v as Obj;
  for (const k of Object.keys(o)) if (!keys.includes(k)) fail(path, `unknown field ${k}`);
  for (const k of keys) if (!(k in o)) fail(path, `missing field ${k}`);
  return o;
}

function arr(v: unknown, path: string, min: number, max: number): unknown[] {
  if (!Array.isArray(v)) fail(path, 'expected an array');
  if (v.length < min || v.length > max) fail(path, `expected ${min}..${max} items, got ${v.length}`);
  return v;
}

function uint(v: unknown, path: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) fail(path, 'expected a non-negative safe integer');
  return v;
}

function int(v: unknown, path: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) fail(path, 'expected a safe integer');
  return v;
}

function str(v: unknown, path: string, re: RegExp, what: string): string {
  if (typeof v !== 'string' || !re.test(v)) fail(path, `expected ${what}`);
  return v;
}

/** The source host follows the one host-id rule (ids.ts), the same the manifest's subject was built by. */
function hostIdField(v: unknown, path: string): string {
  if (!isHostId(v)) fail(path, 'expected a host id (a Kubernetes node name)');
  return v;
}

function absPath(v: unknown, path: string): string {
  if (typeof v !== 'string' || v.length > MAX_PATH_CHARS || !v.startsWith('/') || v.includes('\0')) fail(path, 'expected an absolute path');
  if (v.split('/').includes('..')) fail(path, "'..' in path");
  return v;
}

function checkLayer(v: unknown, path: string, maxChunks: number, kind: LayerDigestKind): LayerRef {
  const o = obj(v, path, ['digest', 'size', 'chunks']);
  const digest = str(o.digest, `${path}.digest`, DIGEST_RE, 'a sha256 digest');
  const size = uint(o.size, `${path}.size`);
  let sum = 0;
  const chunks = arr(o.chunks, `${path}.chunks`, 0, maxChunks).map((c, i) => {
    const co = obj(c, `${path}.chunks[${i}]`, ['digest', 'size']);
    const chunk = { digest: str(co.digest, `${path}.chunks[${i}].digest`, DIGEST_RE, 'a sha256 digest'), size: uint(co.size, `${path}.chunks[${i}].size`) };
    if (chunk.size === 0 || chunk.size > MAX_CHUNK_BYTES) fail(`${path}.chunks[${i}].size`, `expected 1..${MAX_CHUNK_BYTES}`);
    sum += chunk.size;
    return chunk;
  });
  if (sum !== size) fail(path, `chunk sizes add up to ${sum}, layer size is ${size}`);
  // A version-2 digest is a function of the list: a manifest contradicting itself is refused here,
  // before anything is fetched (a version-1 digest can only be checked against the bytes).
  if (kind === 'chunk-list' && chunkListDigest(chunks) !== digest) fail(`${path}.digest`, 'does not match the chunk list');
  return { digest, size, chunks };
}

function checkMember(v: unknown, path: string, maxChunks: number, kind: LayerDigestKind): CheckpointMember {
  const o = obj(v, path, ['memberId', 'cliKind', 'savedLocator', 'nativeSessionPaths', 'layer']);
  const savedLocator = o.savedLocator;
  if (savedLocator !== null && (typeof savedLocator !== 'string' || savedLocator.length === 0 || savedLocator.length > MAX_LOCATOR_CHARS)) {
    fail(`${path}.savedLocator`, `expected null or 1..${MAX_LOCATOR_CHARS} chars`);
  }
  return {
    memberId: str(o.memberId, `${path}.memberId`, ID_RE, 'a safe id'),
    cliKind: str(o.cliKind, `${path}.cliKind`, CLI_KIND_RE, 'a CLI kind'),
    savedLocator,
    nativeSessionPaths: arr(o.nativeSessionPaths, `${path}.nativeSessionPaths`, 0, MAX_SESSION_PATHS).map((p, i) => absPath(p, `${path}.nativeSessionPaths[${i}]`)),
    layer: checkLayer(o.layer, `${path}.layer`, maxChunks, kind),
  };
}

function checkCleanStop(v: unknown, path: string): CleanStopEvidence {
  const o = obj(v, path, ['stoppedAtMs', 'lastTurnCompletedAtMs', 'stateRevision', 'members']);
  const last = o.lastTurnCompletedAtMs === null ? null : uint(o.lastTurnCompletedAtMs, `${path}.lastTurnCompletedAtMs`);
  return {
    stoppedAtMs: uint(o.stoppedAtMs, `${path}.stoppedAtMs`),
    lastTurnCompletedAtMs: last,
    stateRevision: uint(o.stateRevision, `${path}.stateRevision`),
    members: arr(o.members, `${path}.members`, 1, MAX_MEMBERS).map((m, i) => {
      const mo = obj(m, `${path}.members[${i}]`, ['memberId', 'exitCode', 'exitedWithinGrace']);
      if (mo.exitedWithinGrace !== true) fail(`${path}.members[${i}].exitedWithinGrace`, 'a clean stop needs every member to exit within the grace');
      return { memberId: str(mo.memberId, `${path}.members[${i}].memberId`, ID_RE, 'a safe id'), exitCode: int(mo.exitCode, `${path}.members[${i}].exitCode`), exitedWithinGrace: true as const };
    }),
  };
}

/** Validate an in-memory value as a manifest (shape, bounds, cross-field rules). */
export function validateCheckpointManifest(value: unknown, maxManifestBytes = DEFAULT_MAX_MANIFEST_BYTES): CheckpointManifest {
  const version = typeof value === 'object' && value !== null && 'schemaVersion' in value ? (value as Obj).schemaVersion : undefined;
  if (version !== undefined && !(MANIFEST_SCHEMA_VERSIONS as readonly unknown[]).includes(version)) {
    throw new ManifestError('manifest_unsupported_version', `schema version ${String(version)} is not one of ${MANIFEST_SCHEMA_VERSIONS.join(', ')}`);
  }
  const o = obj(value, 'manifest', ['schemaVersion', 'checkpointId', 'groupId', 'placementGeneration', 'source', 'createdAtMs', 'cleanStop', 'members', 'baseImageDigest', 'bridgeVersion']);
  const source = obj(o.source, 'manifest.source', ['hostId', 'epoch']);
  // A chunk ref serializes to at least ~90 bytes: this bounds the arrays before we walk them.
  const maxChunks = Math.floor(maxManifestBytes / 90);
  const schemaVersion = version as ManifestSchemaVersion;
  const kind = layerDigestKind(schemaVersion);
  const manifest: CheckpointManifest = {
    schemaVersion,
    checkpointId: str(o.checkpointId, 'manifest.checkpointId', ID_RE, 'a safe id'),
    groupId: str(o.groupId, 'manifest.groupId', ID_RE, 'a safe id'),
    placementGeneration: uint(o.placementGeneration, 'manifest.placementGeneration'),
    source: { hostId: hostIdField(source.hostId, 'manifest.source.hostId'), epoch: uint(source.epoch, 'manifest.source.epoch') },
    createdAtMs: uint(o.createdAtMs, 'manifest.createdAtMs'),
    cleanStop: checkCleanStop(o.cleanStop, 'manifest.cleanStop'),
    members: arr(o.members, 'manifest.members', 1, MAX_MEMBERS).map((m, i) => checkMember(m, `manifest.members[${i}]`, maxChunks, kind)),
    baseImageDigest: str(o.baseImageDigest, 'manifest.baseImageDigest', DIGEST_RE, 'a sha256 digest'),
    bridgeVersion: str(o.bridgeVersion, 'manifest.bridgeVersion', VERSION_RE, 'a printable version string'),
  };
  const ids = manifest.members.map((m) => m.memberId);
  if (new Set(ids).size !== ids.length) fail('manifest.members', 'duplicate memberId');
  const stopped = manifest.cleanStop.members.map((m) => m.memberId);
  if (stopped.length !== ids.length || !stopped.every((id) => ids.includes(id))) fail('manifest.cleanStop.members', 'must name exactly the manifest members');
  if (manifest.cleanStop.stoppedAtMs > manifest.createdAtMs) fail('manifest.createdAtMs', 'checkpoint taken before the stop it relies on');
  return manifest;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

/** Parse bytes (or a string) into a manifest, size-checking before parsing JSON. */
export function parseCheckpointManifest(input: Uint8Array | string, maxManifestBytes = DEFAULT_MAX_MANIFEST_BYTES): CheckpointManifest {
  const size = typeof input === 'string' ? encoder.encode(input).length : input.length;
  if (size > maxManifestBytes) throw new ManifestError('manifest_too_large', `manifest of ${size} bytes exceeds ${maxManifestBytes}`);
  let value: unknown;
  try {
    value = JSON.parse(typeof input === 'string' ? input : decoder.decode(input));
  } catch (err) {
    throw new ManifestError('manifest_invalid', `manifest is not UTF-8 JSON: ${(err as Error).message}`);
  }
  return validateCheckpointManifest(value, maxManifestBytes);
}

/** Validate then serialize; refuses a manifest that would not fit the bound. */
export function serializeCheckpointManifest(manifest: CheckpointManifest, maxManifestBytes = DEFAULT_MAX_MANIFEST_BYTES): Uint8Array {
  const checked = validateCheckpointManifest(manifest, maxManifestBytes);
  const bytes = encoder.encode(JSON.stringify(checked));
  if (bytes.length > maxManifestBytes) throw new ManifestError('manifest_too_large', `manifest of ${bytes.length} bytes exceeds ${maxManifestBytes}`);
  return bytes;
}

export interface RestoreTarget {
  readonly baseImageDigest: string;
  readonly bridgeVersion: string;
}

export type Compatibility = { readonly ok: true } | { readonly ok: false; readonly reason: 'base_image_mismatch' | 'bridge_version_mismatch'; readonly detail: string };

/** R-G4: a checkpoint restores only onto the same base image digest and live-bridge version. */
export function checkManifestCompatible(manifest: CheckpointManifest, target: RestoreTarget): Compatibility {
  if (manifest.baseImageDigest !== target.baseImageDigest) {
    return { ok: false, reason: 'base_image_mismatch', detail: `checkpoint needs ${manifest.baseImageDigest}, target has ${target.baseImageDigest}` };
  }
  if (manifest.bridgeVersion !== target.bridgeVersion) {
    return { ok: false, reason: 'bridge_version_mismatch', detail: `checkpoint needs bridge ${manifest.bridgeVersion}, target runs ${target.bridgeVersion}` };
  }
  return { ok: true };
}

/** Throwing form of checkManifestCompatible, for code paths that abort on refusal. */
export function assertManifestCompatible(manifest: CheckpointManifest, target: RestoreTarget): void {
  const result = checkManifestCompatible(manifest, target);
  if (!result.ok) throw new ManifestError(result.reason, result.detail);
}
