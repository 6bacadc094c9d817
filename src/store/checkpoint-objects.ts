// The checkpoint Object Store (R-A3: checkpoint data kept in JetStream): named,
// digest-verified objects, e.g. checkpoint manifests. Objects are write-once by default (a put
// to an existing name is a CAS conflict) because a checkpoint must never change under a reader
// (R-R2); reads verify the SHA-256 recorded at write time and fail with object_corrupt
// otherwise. Sizes are bounded (R-R4). Bulk layer data goes to the faster chunk store
// (chunk-store.ts), which docs/measured-facts.md puts at ~4× the Object Store API's throughput.
import { Objm, type ObjectInfo, type ObjectStore } from '@nats-io/obj';
import type { JetStreamClient } from '@nats-io/jetstream';
import { CasConflictError, InvalidKeyError, ObjectCorruptError, ObjectNotFoundError, RecordTooLargeError, translateReadError, translateWriteError } from './errors.ts';

export interface StoredObjectInfo {
  readonly name: string;
  readonly size: number;
  /** NATS form, `SHA-256=<base64url>`. */
  readonly digest: string;
  /** The same SHA-256 as lowercase hex, the form our manifests use. */
  readonly sha256Hex: string;
  /** Stream sequence of the object's metadata; not reported by list() (call info()). */
  readonly revision?: number;
  readonly mtime: string;
  readonly metadata: Readonly<Record<string, string>>;
}

export interface PutOptions {
  /** Revision the object must currently have; 0 (default) means it must not exist yet. */
  readonly expectedRevision?: number;
  /** Small string metadata stored with the object. */
  readonly metadata?: Record<string, string>;
}

export interface CheckpointObjectsOptions {
  readonly js: JetStreamClient;
  /** Object bucket name (stream OBJ_<bucket>, created by StateStore with explicit settings). */
  readonly bucket: string;
  /** Bound on one object. */
  readonly maxObjectBytes: number;
  /** Chunk size for puts; default 128 KiB, capped by the server's max_payload. */
  readonly chunkBytes?: number;
  /** Bound on list(); default 10 000. */
  readonly maxList?: number;
}

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,254}$/;

/** Object names: 1-255 of [A-Za-z0-9_.:=/-], starting alphanumeric, no `..` path segment. */
export function validateObjectName(name: string): void {
  if (typeof name !== 'string' || !NAME_RE.test(name)) throw new InvalidKeyError(String(name), 'object names are 1-255 of A-Za-z0-9_.:=/- starting alphanumeric');
  if (name.split('/').some((seg) => seg === '..' || seg === '.' || seg === '')) throw new InvalidKeyError(name, 'empty, . or .. path segment');
}

const DIGEST_PREFIX = 'SHA-256=';

function toInfo(i: ObjectInfo): StoredObjectInfo {
  const b64 = i.digest.startsWith(DIGEST_PREFIX) ? i.digest.slice(DIGEST_PREFIX.length) : '';
  return {
    name: i.name,
    size: i.size,
    digest: i.digest,
    sha256Hex: Buffer.from(b64, 'base64url').toString('hex'),
    ...(typeof i.revision === 'number' ? { revision: i.revision } : {}),
    mtime: i.mtime,
    metadata: { ...(i.metadata ?? {}) },
  };
}

function isDigestMismatch(err: unknown): boolean {
  return err instanceof Error && /digests do not match/.test(err.message);
}

export class CheckpointObjects {
  readonly bucket: string;
  readonly maxObjectBytes: number;
  readonly #os: ObjectStore;
  readonly #chunkBytes: number;
  readonly #maxList: number;

  private constructor(os: ObjectStore, opts: CheckpointObjectsOptions) {
    this.#os = os;
    this.bucket = opts.bucket;
    this.maxObjectBytes = opts.maxObjectBytes;
    this.#chunkBytes = opts.chunkBytes ?? 128 * 1024;
    this.#maxList = opts.maxList ?? 10_000;
  }

  /** Bind to an existing object bucket (StateStore.open creates it). */
  static async open(opts: CheckpointObjectsOptions): Promise<CheckpointObjects> {
    if (!Number.isSafeInteger(opts.maxObjectBytes) || opts.maxObjectBytes <= 0) throw new RangeError('maxObjectBytes must be a positive integer');
    let os: ObjectStore;
    try {
      os = await new Objm(opts.js).open(opts.bucket);
    } catch (err) {
      throw translateReadError(err, `object bucket ${opts.bucket}`);
    }
    return new CheckpointObjects(os, opts);
  }

  /**
   * Store `data` under `name`. Write-once unless `expectedRevision` names the current revision;
   * a mismatch is a CasConflictError. Data beyond maxObjectBytes aborts the put (nothing visible).
   */
  async put(name: string, data: Uint8Array | ReadableStream<Uint8Array>, opts: PutOptions = {}): Promise<StoredObjectInfo> {
    validateObjectName(name);
    const expectedRevision = opts.expectedRevision ?? 0;
    if (!Number.isSafeInteger(expectedRevision) || expectedRevision < 0) throw new RangeError('expectedRevision must be a non-negative integer');
    const where = `${this.bucket}/${name}`;
    // Fail fast instead of uploading every chunk only to lose the final CAS on the metadata.
    if (expectedRevision === 0 && (await this.#rawExists(name))) throw new CasConflictError(this.bucket, name, 0);
    let counted = 0;
    let source: ReadableStream<Uint8Array>;
    if (data instanceof Uint8Array) {
      if (data.length > this.maxObjectBytes) throw new RecordTooLargeError(where, data.length, this.maxObjectBytes);
      counted = data.length;
      source = new ReadableStream({
        start(c) {
          c.enqueue(data);
          c.close();
        },
      });
    } else {
      const limit = this.maxObjectBytes;
      source = data.pipeThrough(
        new TransformStream<Uint8Array, Uint8Array>({
          transform(chunk, c) {
            counted += chunk.length;
            if (counted > limit) c.error(new RecordTooLargeError(where, counted, limit));
            else c.enqueue(chunk);
          },
        }),
      );
    }
    try {
      const info = await this.#os.put(
        { name, metadata: opts.metadata, options: { max_chunk_size: this.#chunkBytes } },
        source,
        { previousRevision: expectedRevision },
      );
      return toInfo(info);
    } catch (err) {
      throw translateWriteError(err, { bucket: this.bucket, key: name, expectedRevision, sizeBytes: counted, limitBytes: this.maxObjectBytes });
    }
  }

  async #rawExists(name: string): Promise<boolean> {
    try {
      return (await this.#os.info(name)) !== null; // deleted objects count: names are never reused
    } catch (err) {
      throw translateReadError(err, `${this.bucket}/${name}`);
    }
  }

  /** Info of a live object, or undefined if absent or deleted. */
  async info(name: string): Promise<StoredObjectInfo | undefined> {
    validateObjectName(name);
    try {
      const i = await this.#os.info(name);
      return i && !i.deleted ? toInfo(i) : undefined;
    } catch (err) {
      throw translateReadError(err, `${this.bucket}/${name}`);
    }
  }

  /** The whole object, digest-verified. ObjectNotFoundError / ObjectCorruptError otherwise. */
  async getBytes(name: string): Promise<Uint8Array> {
    validateObjectName(name);
    let bytes: Uint8Array | null;
    try {
      bytes = await this.#os.getBlob(name);
    } catch (err) {
      if (isDigestMismatch(err)) throw new ObjectCorruptError(this.bucket, name, { cause: err });
      throw translateReadError(err, `${this.bucket}/${name}`);
    }
    if (bytes === null) throw new ObjectNotFoundError(this.bucket, name);
    if (bytes.length > this.maxObjectBytes) throw new ObjectCorruptError(this.bucket, name);
    return bytes;
  }

  /**
   * Stream an object. The stream errors with ObjectCorruptError at its end if the bytes do not
   * match the recorded digest, so a consumer must not commit anything before the stream ends.
   */
  async getStream(name: string): Promise<{ info: StoredObjectInfo; data: ReadableStream<Uint8Array> }> {
    validateObjectName(name);
    let result;
    try {
      result = await this.#os.get(name);
    } catch (err) {
      throw translateReadError(err, `${this.bucket}/${name}`);
    }
    if (!result || result.info.deleted) throw new ObjectNotFoundError(this.bucket, name);
    const reader = result.data.getReader();
    const bucket = this.bucket;
    const data = new ReadableStream<Uint8Array>({
      async pull(c) {
        try {
          const { done, value } = await reader.read();
          if (done) c.close();
          else c.enqueue(value);
        } catch (err) {
          c.error(isDigestMismatch(err) ? new ObjectCorruptError(bucket, name, { cause: err }) : err);
        }
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return { info: toInfo(result.info), data };
  }

  /** Delete an object (its chunks are purged). Returns false if it did not exist. */
  async delete(name: string): Promise<boolean> {
    validateObjectName(name);
    try {
      const r = await this.#os.delete(name);
      return r.success;
    } catch (err) {
      throw translateWriteError(err, { bucket: this.bucket, key: name, expectedRevision: 0, sizeBytes: 0, limitBytes: this.maxObjectBytes });
    }
  }

  /** Live objects, at most `limit`. */
  async list(limit = this.#maxList): Promise<{ objects: StoredObjectInfo[]; truncated: boolean }> {
    if (!Number.isInteger(limit) || limit < 1 || limit > this.#maxList) throw new RangeError(`limit must be in 1..${this.#maxList}`);
    let all: ObjectInfo[];
    try {
      all = await this.#os.list();
    } catch (err) {
      throw translateReadError(err, `${this.bucket} list`);
    }
    const live = all.filter((i) => !i.deleted).sort((a, b) => a.name.localeCompare(b.name));
    return { objects: live.slice(0, limit).map(toInfo), truncated: live.length > limit };
  }
}
