// Content-addressed chunk store and checkpoint manifest log on plain JetStream streams (R-G3, R-G5).
// Why not the NATS Object Store API: it writes ~45 MB/s here, while pipelined plain publishes of
// ~1 MiB messages reach ~200 MB/s (docs/measured-facts.md), and the checkpoint path has a time budget.
// Layout: stream SF_CHUNKS, one message per chunk on `sf.chunk.<sha256hex>` (a digest is stored
// once: dedup across checkpoints and groups); stream SF_CHECKPOINTS, one manifest per
// `sf.manifest.<host>.<groupId>.<checkpointId>`, written LAST: a checkpoint exists only when its
// manifest does. Reads use direct get and verify every chunk digest (R-R2).
// Write-once, enforced by the server: every host may publish on every chunk subject, so both
// streams refuse a second message on a subject (discard new per subject, one message per subject)
// whatever the publisher's headers say; no host can replace a chunk or manifest others rely on.
// Only the control plane's purge (garbage collection) empties a subject, which may then be written
// again. A chunk already stored counts as ours only if its bytes are ours (compared on write).
import { createHash } from 'node:crypto';
import { type NatsConnection } from '@nats-io/transport-node';
import {
  DiscardPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  RetentionPolicy,
  StorageType,
  jetstream,
  jetstreamManager,
  type JetStreamClient,
  type JetStreamManager,
  type StoredMsg,
} from '@nats-io/jetstream';
import {
  MAX_CHUNK_BYTES,
  ManifestError,
  isSafeId,
  isSha256Digest,
  parseCheckpointManifest,
  serializeCheckpointManifest,
  type CheckpointManifest,
  type ChunkRef,
} from '../core/checkpoint-manifest.ts';
import { CHECKPOINT_STREAMS, hostIdFromToken, manifestSubject } from '../core/agent-subjects.ts';
import { ensureStream, type DesiredStream } from './stream-setup.ts';

export type ChunkStoreErrorReason =
  | 'chunk_missing'
  | 'chunk_digest_mismatch'
  | 'chunk_too_large'
  | 'manifest_exists'
  | 'manifest_missing'
  | 'invalid_id'
  /** A transfer to or from the store failed (connection, timeout): nothing says the data is bad; retry. */
  | 'transfer_failed';

export class ChunkStoreError extends Error {
  override readonly name = 'ChunkStoreError';
  constructor(
    readonly reason: ChunkStoreErrorReason,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

export interface ChunkStoreOptions {
  /** Chunk stream name; default SF_CHUNKS. */
  readonly chunkStream?: string;
  /** Manifest stream name; default SF_CHECKPOINTS. */
  readonly manifestStream?: string;
  /** JetStream replicas (1 for a single server, 3 in a cluster). */
  readonly replicas?: number;
  /** JetStream API timeout per request, ms. */
  readonly timeoutMs?: number;
  /**
   * Create or reconcile the streams (default true: the control plane). Host agents pass false: their
   * credentials may read the streams' info but not administer them (R-R5), so they only check the
   * streams exist and leave their settings to the control plane.
   */
  readonly manage?: boolean;
}

const CHUNK_PREFIX = CHECKPOINT_STREAMS.chunkSubjectPrefix;
const MANIFEST_PREFIX = CHECKPOINT_STREAMS.manifestSubjectPrefix;
const ONE_MIB = 1024 * 1024;
/** Attempts of one chunk put when the subject keeps changing under it (a purge between read and write). */
const PUT_ATTEMPTS = 3;

export function sha256Digest(data: Uint8Array): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

function chunkSubject(digest: string): string {
  if (!isSha256Digest(digest)) throw new ChunkStoreError('invalid_id', `not a sha256 digest: ${digest}`);
  return CHUNK_PREFIX + digest.slice('sha256:'.length);
}

function manifestSubjectOf(hostId: string, groupId: string, checkpointId: string): string {
  if (!isSafeId(groupId) || !isSafeId(checkpointId)) throw new ChunkStoreError('invalid_id', `unsafe group/checkpoint id ${groupId}/${checkpointId}`);
  try {
    return manifestSubject(hostId, groupId, checkpointId);
  } catch (err) {
    throw new ChunkStoreError('invalid_id', `unsafe host id ${hostId}`, { cause: err });
  }
}

/** JetStream "store failed": with the message below, the per-subject write-once limit refused a write. */
const ERR_STREAM_STORE_FAILED = 10077;
const MAX_PER_SUBJECT = /maximum messages per subject exceeded/i;

/**
 * The subject already holds a message: the put-if-absent expectation failed (wrong last sequence;
 * the "constant" form when a clustered stream has another write of that subject in flight), or,
 * without that header, the stream's one-message-per-subject limit refused the write.
 */
function isAlreadyStored(err: unknown): boolean {
  if (!(err instanceof JetStreamApiError)) return false;
  if (err.code === JetStreamApiCodes.StreamWrongLastSequence || err.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown) return true;
  return err.code === ERR_STREAM_STORE_FAILED && MAX_PER_SUBJECT.test(err.message);
}

/**
 * Settings of both checkpoint streams. Write-once: one message per subject and a second one is
 * REFUSED (discard new, per subject; nats-server 2.10+), not swapped in for the first (discard
 * old would keep the newest). No rollup headers (a rollup purges the subject). Whole-stream limits
 * refuse new writes too, never evict a stored checkpoint. Purge stays allowed: garbage collection
 * removes unreferenced chunks and expired manifests with it (control plane credentials only).
 */
function checkpointStreamSettings(replicas: number): Omit<DesiredStream, 'name' | 'subjects'> {
  return {
    storage: StorageType.File,
    retention: RetentionPolicy.Limits,
    discard: DiscardPolicy.New,
    discard_new_per_subject: true,
    max_msgs_per_subject: 1,
    max_msg_size: ONE_MIB,
    num_replicas: replicas,
    allow_rollup_hdrs: false,
    allow_direct: true,
    deny_delete: false,
    deny_purge: false,
  };
}

/** A digest function: synchronous here, or on a worker thread (host-agent/layer/sha256-pool.ts). */
export type DigestFn = (data: Uint8Array) => string | Promise<string>;

export interface ReadOptions {
  /** How to compute a fetched chunk's digest for verification; default sha256Digest. */
  readonly digest?: DigestFn;
  /** Return chunks in SharedArrayBuffer memory (one copy) so worker threads can read them. */
  readonly shared?: boolean;
}

/** Chunk fetches / publishes outstanding at once by default. */
export const DEFAULT_READ_IN_FLIGHT = 16;
export const DEFAULT_WRITE_IN_FLIGHT = 16;

function sharedCopy(data: Uint8Array): Buffer {
  const out = Buffer.from(new SharedArrayBuffer(data.byteLength));
  out.set(data);
  return out;
}

export interface PutResult {
  readonly ref: ChunkRef;
  /** False when the chunk was already present (dedup). */
  readonly stored: boolean;
}

export class ChunkStore {
  private constructor(
    private readonly js: JetStreamClient,
    private readonly jsm: JetStreamManager,
    readonly chunkStream: string,
    readonly manifestStream: string,
  ) {}

  /** Connect to (and create or reconcile) the two streams with explicit settings. */
  static async open(nc: NatsConnection, options: ChunkStoreOptions = {}): Promise<ChunkStore> {
    const timeout = options.timeoutMs ?? 10_000;
    const jsm = await jetstreamManager(nc, { timeout });
    const js = jetstream(nc, { timeout });
    const replicas = options.replicas ?? 1;
    const chunkStream = options.chunkStream ?? CHECKPOINT_STREAMS.chunks;
    const manifestStream = options.manifestStream ?? CHECKPOINT_STREAMS.manifests;
    if (options.manage === false) {
      for (const name of [chunkStream, manifestStream]) {
        try {
          await jsm.streams.info(name);
        } catch (err) {
          throw new ChunkStoreError('transfer_failed', `stream ${name} is not available (the control plane creates it): ${(err as Error).message}`, { cause: err });
        }
      }
      return new ChunkStore(js, jsm, chunkStream, manifestStream);
    }
    const common = checkpointStreamSettings(replicas);
    // Created-or-verified with explicit settings: stream-setup.ts refuses a drifted storage type and
    // updates drifted limits, so streams made by an older build (discard old: a second message
    // replaced the first) become write-once at the control plane's next start.
    await ensureStream(jsm, { ...common, name: chunkStream, subjects: [`${CHUNK_PREFIX}*`] });
    await ensureStream(jsm, { ...common, name: manifestStream, subjects: [`${MANIFEST_PREFIX}*.*.*`] });
    return new ChunkStore(js, jsm, chunkStream, manifestStream);
  }

  /** Whether a chunk is stored, without transferring it (stream info filtered to its subject). */
  async has(digest: string): Promise<boolean> {
    const subject = chunkSubject(digest);
    const info = await this.jsm.streams.info(this.chunkStream, { subjects_filter: subject });
    return (info.state.subjects?.[subject] ?? 0) > 0;
  }

  /**
   * Store one chunk unless present. The stored copy is read first: bytes equal to `data` are this
   * very chunk (dedup, nothing uploaded); other bytes under its digest were planted or damaged, and
   * since chunks are write-once this checkpoint cannot use the digest: chunk_digest_mismatch, rather
   * than a manifest that could never be restored. The write itself is put-if-absent on the server
   * (expected last subject sequence 0, and the stream's one-message-per-subject limit), so two
   * writers racing on the same digest both succeed and one copy is kept.
   */
  async put(data: Uint8Array, ref: ChunkRef = { digest: sha256Digest(data), size: data.length }): Promise<PutResult> {
    if (data.length > MAX_CHUNK_BYTES) throw new ChunkStoreError('chunk_too_large', `chunk of ${data.length} bytes exceeds ${MAX_CHUNK_BYTES}`);
    const subject = chunkSubject(ref.digest);
    for (let attempt = 0; attempt < PUT_ATTEMPTS; attempt++) {
      if (await this.#holdsSame(subject, ref.digest, data)) return { ref, stored: false };
      try {
        // No Nats-Msg-Id on purpose: within the duplicate window the server would silently drop a
        // re-put of a chunk that garbage collection just deleted. Put-if-absent is enough.
        await this.js.publish(subject, data, { expect: { lastSubjectSequence: 0 } });
        return { ref, stored: true };
      } catch (err) {
        // Someone stored it between our read and our write: compare what they stored.
        if (!isAlreadyStored(err)) throw err;
      }
    }
    throw new ChunkStoreError('transfer_failed', `chunk ${ref.digest}: the store reports it present but it could not be read back`);
  }

  /**
   * The message on `subject` (chunks and manifests are write-once: at most one). A direct get is
   * answered by any replica, and a replica that has not caught up yet (after a restart or a freeze)
   * answers "none" for a message the stream holds: that proves nothing, so "none" is asked again of
   * the stream leader, whose answer is the stream's. (Never the other way round: a message a replica
   * has is the stream's.)
   */
  async #lastBySubject(stream: string, subject: string): Promise<StoredMsg | null> {
    const msg = await this.jsm.direct.getMessage(stream, { last_by_subj: subject });
    return msg ?? this.jsm.streams.getMessage(stream, { last_by_subj: subject });
  }

  /** Whether `subject` holds exactly `data`; false when empty; chunk_digest_mismatch when it holds other bytes. */
  async #holdsSame(subject: string, digest: string, data: Uint8Array): Promise<boolean> {
    const msg = await this.#lastBySubject(this.chunkStream, subject);
    if (msg === null) return false;
    if (Buffer.from(msg.data.buffer, msg.data.byteOffset, msg.data.byteLength).equals(Buffer.from(data.buffer, data.byteOffset, data.byteLength))) return true;
    throw new ChunkStoreError(
      'chunk_digest_mismatch',
      `chunk ${digest} is already stored with other bytes (planted or damaged); chunks are write-once, so this digest cannot be stored until garbage collection removes that copy`,
    );
  }

  /** Fetch one chunk and verify its size and digest. */
  async get(ref: ChunkRef, options: ReadOptions = {}): Promise<Buffer> {
    const msg = await this.#lastBySubject(this.chunkStream, chunkSubject(ref.digest));
    if (msg === null) throw new ChunkStoreError('chunk_missing', `chunk ${ref.digest} is not in the store`);
    // msg.data is a view of the client's receive buffer: wrap it, or copy it once into shared
    // memory when the caller hashes or consumes it on worker threads.
    const data = options.shared === true ? sharedCopy(msg.data) : Buffer.from(msg.data.buffer, msg.data.byteOffset, msg.data.byteLength);
    if (data.length !== ref.size || (await (options.digest ?? sha256Digest)(data)) !== ref.digest) {
      throw new ChunkStoreError('chunk_digest_mismatch', `chunk ${ref.digest} does not verify (got ${data.length} bytes)`);
    }
    return data;
  }

  /**
   * Verified chunks in order, with up to `maxInFlight` direct gets outstanding (16: measured best
   * at 512 KiB chunks, see bench/checkpoint/phases.ts). Every chunk's size and digest is checked
   * before it is yielded (R-R2); `options.digest` may compute the digest elsewhere (worker thread).
   */
  async *read(refs: readonly ChunkRef[], maxInFlight = DEFAULT_READ_IN_FLIGHT, options: ReadOptions = {}): AsyncGenerator<Buffer> {
    const window: Promise<Buffer>[] = [];
    let next = 0;
    const fetch = (): void => {
      const p = this.get(refs[next++]!, options);
      p.catch(() => undefined); // awaited below in order; avoid unhandled rejections if abandoned
      window.push(p);
    };
    while (next < refs.length && window.length < maxInFlight) fetch();
    while (window.length > 0) {
      const chunk = await window.shift()!;
      if (next < refs.length) fetch();
      yield chunk;
    }
  }

  /** Remove a chunk (garbage collection of unreferenced digests, R-G7); its digest may then be stored again. */
  async delete(digest: string): Promise<void> {
    await this.jsm.streams.purge(this.chunkStream, { filter: chunkSubject(digest) });
  }

  /** A pipelined writer for one layer: hashes, dedups, keeps several publishes in flight. */
  writer(maxInFlight = DEFAULT_WRITE_IN_FLIGHT): ChunkWriter {
    return new ChunkWriter(this, maxInFlight);
  }

  // ---- manifests ---------------------------------------------------------------------------------

  /**
   * Write a manifest once, under the host that wrote it (`manifest.source.hostId`, which per-host
   * credentials pin to the writer); a second write of the same checkpoint is refused (by the server
   * too, whatever the writer sends), until retention purges it. Call it LAST.
   */
  async putManifest(manifest: CheckpointManifest): Promise<void> {
    const bytes = serializeCheckpointManifest(manifest);
    try {
      await this.js.publish(manifestSubjectOf(manifest.source.hostId, manifest.groupId, manifest.checkpointId), bytes, { expect: { lastSubjectSequence: 0 } });
    } catch (err) {
      if (isAlreadyStored(err)) throw new ChunkStoreError('manifest_exists', `checkpoint ${manifest.groupId}/${manifest.checkpointId} already exists`, { cause: err });
      throw err;
    }
  }

  /**
   * Read and strictly parse the manifest `hostId` wrote (ManifestError on a bad one). One that names
   * another source host than the one whose subject it was written under is corrupt: never used.
   */
  async getManifest(hostId: string, groupId: string, checkpointId: string): Promise<CheckpointManifest> {
    const msg = await this.#lastBySubject(this.manifestStream, manifestSubjectOf(hostId, groupId, checkpointId));
    if (msg === null) throw new ChunkStoreError('manifest_missing', `checkpoint ${groupId}/${checkpointId} of host ${hostId} does not exist`);
    const manifest = parseCheckpointManifest(msg.data);
    if (manifest.source.hostId !== hostId || manifest.groupId !== groupId || manifest.checkpointId !== checkpointId) {
      throw new ManifestError('manifest_invalid', `manifest under ${hostId}/${groupId}/${checkpointId} names ${manifest.source.hostId}/${manifest.groupId}/${manifest.checkpointId}`);
    }
    return manifest;
  }

  /** Checkpoint ids of a group that have a manifest (written by any host). */
  async listCheckpoints(groupId: string): Promise<string[]> {
    if (!isSafeId(groupId)) throw new ChunkStoreError('invalid_id', `unsafe group id ${groupId}`);
    const filter = `${MANIFEST_PREFIX}*.${groupId}.*`;
    const info = await this.jsm.streams.info(this.manifestStream, { subjects_filter: filter });
    return Object.keys(info.state.subjects ?? {}).map((s) => s.slice(s.lastIndexOf('.') + 1)).sort();
  }

  /** Digests of every stored chunk (for the garbage collector's full sweep). */
  async listChunkDigests(): Promise<string[]> {
    const info = await this.jsm.streams.info(this.chunkStream, { subjects_filter: `${CHUNK_PREFIX}*` });
    return Object.keys(info.state.subjects ?? {}).map((s) => `sha256:${s.slice(CHUNK_PREFIX.length)}`);
  }

  /** Every stored manifest's place (host, group, checkpoint), indexed by the control plane or not. */
  /**
   * Every stored manifest's identity. Subjects this version cannot read (e.g. a host id outside
   * today's rule, written by an older version) are counted in `unrecognized`, not dropped: a
   * garbage collector must not take "not listed" for "references nothing".
   */
  async listManifests(): Promise<{ hostId: string; groupId: string; checkpointId: string }[] & { unrecognized: number }> {
    const info = await this.jsm.streams.info(this.manifestStream, { subjects_filter: `${MANIFEST_PREFIX}>` });
    const out = Object.assign([] as { hostId: string; groupId: string; checkpointId: string }[], { unrecognized: 0 });
    for (const subject of Object.keys(info.state.subjects ?? {})) {
      const [host, groupId, checkpointId, extra] = subject.slice(MANIFEST_PREFIX.length).split('.');
      const hostId = host === undefined ? undefined : hostIdFromToken(host);
      if (hostId === undefined || groupId === undefined || checkpointId === undefined || extra !== undefined) {
        out.unrecognized += 1;
        continue;
      }
      out.push({ hostId, groupId, checkpointId });
    }
    return out;
  }

  async deleteManifest(hostId: string, groupId: string, checkpointId: string): Promise<void> {
    await this.jsm.streams.purge(this.manifestStream, { filter: manifestSubjectOf(hostId, groupId, checkpointId) });
  }
}

export interface WriterStats {
  chunks: number;
  bytes: number;
  /** Chunks and bytes actually uploaded (not already present). */
  storedChunks: number;
  storedBytes: number;
}

/** Pipelined, deduplicating upload of one chunk sequence. Call flush() to await the tail. */
export class ChunkWriter {
  private readonly inflight = new Set<Promise<void>>();
  private readonly seen = new Set<string>();
  private failure: unknown = null;
  readonly stats: WriterStats = { chunks: 0, bytes: 0, storedChunks: 0, storedBytes: 0 };

  constructor(
    private readonly store: ChunkStore,
    private readonly maxInFlight: number,
  ) {}

  /**
   * Queue a chunk's upload; resolves once there is room for another in flight. `digest` is the
   * chunk's sha256 when the caller already computed it (off-thread); otherwise it is hashed here.
   * Trust boundary: the chunk is stored under that digest unverified, so it must come from hashing
   * these very bytes (storeLayer's worker does). Reads verify every chunk anyway (R-R2), so a wrong
   * one could only make checkpoints using that digest fail to restore, never restore wrong bytes.
   */
  async put(data: Buffer, digest?: string): Promise<ChunkRef> {
    this.throwIfFailed();
    const ref: ChunkRef = { digest: digest ?? sha256Digest(data), size: data.length };
    this.stats.chunks += 1;
    this.stats.bytes += data.length;
    if (this.seen.has(ref.digest)) return ref;
    this.seen.add(ref.digest);
    while (this.inflight.size >= this.maxInFlight) await Promise.race(this.inflight);
    this.throwIfFailed();
    const task: Promise<void> = this.store.put(data, ref).then(
      (result) => {
        if (result.stored) {
          this.stats.storedChunks += 1;
          this.stats.storedBytes += data.length;
        }
      },
      (err: unknown) => {
        this.failure ??= err;
      },
    );
    const tracked = task.finally(() => this.inflight.delete(tracked));
    this.inflight.add(tracked);
    return ref;
  }

  async flush(): Promise<WriterStats> {
    await Promise.all(this.inflight);
    this.throwIfFailed();
    return { ...this.stats };
  }

  private throwIfFailed(): void {
    if (this.failure !== null) throw this.failure;
  }
}
