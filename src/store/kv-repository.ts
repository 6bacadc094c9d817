// Typed, validated, compare-and-set access to one JetStream KV bucket. Every write names the
// revision it was computed from (create = "absent"), so two control-plane replicas or a stale
// leader can never overwrite each other silently (R-R2, R-A1: every state write is compare-and-set).
// Values are zod-validated and size-bounded on write and re-validated on read (R-R4).
// watch() follows a bucket through an ordered PULL consumer, paced by what the caller has consumed:
// nats.js's own KV watch pushes with server flow control, and a read model catching up on ten
// buckets at once (bench/scale: 100,000 groups) had the server queue more than its 64 MiB per
// client and close the connection as a slow consumer, then stall for 30 s per watch.
import { setTimeout as sleep } from 'node:timers/promises';
import { DeliverPolicy } from '@nats-io/jetstream';
import { Bucket, KvWatchInclude, type KV, type KvEntry } from '@nats-io/kv';
import type { z } from 'zod';
import { CasConflictError, InvalidKeyError, RecordInvalidError, translateReadError, translateWriteError } from './errors.ts';
import { jsonRecordCodec, type RecordCodec } from './record-codec.ts';

/** A value with the KV revision it was read at (or written as); pass the revision to update(). */
export interface Versioned<T> {
  readonly value: T;
  readonly revision: number;
}

export interface KeyedVersioned<T> extends Versioned<T> {
  readonly key: string;
}

/** One change seen by watch(). A corrupt stored value is reported, not thrown. */
export type KvChange<T> =
  | { readonly op: 'put'; readonly key: string; readonly revision: number; readonly value: T }
  | { readonly op: 'delete'; readonly key: string; readonly revision: number }
  | { readonly op: 'invalid'; readonly key: string; readonly revision: number; readonly error: RecordInvalidError };

export interface KvRepositoryOptions<T> {
  readonly kv: KV;
  /** Bucket name, for error messages. */
  readonly bucket: string;
  readonly schema: z.ZodType<T>;
  /** Bound on one encoded record. */
  readonly maxRecordBytes: number;
  /** Default and maximum number of keys list()/keys() return; default 10 000. */
  readonly maxListKeys?: number;
}

export interface ListOptions {
  /** KV key filter; `*` matches one token, a final `>` the rest. Default: all keys. */
  readonly filter?: string;
  readonly limit?: number;
}

export interface MutateOptions {
  /** Extra attempts after a CAS conflict; default 8. */
  readonly retries?: number;
  /** Base of the jittered pause between attempts; default 5 ms. */
  readonly backoffMs?: number;
}

/** Longest key we accept; NATS subjects may be longer, but our ids are short and bounded. */
export const MAX_KEY_LENGTH = 256;
const KEY_TOKEN = /^[-/=\w]+$/;

/** Throws InvalidKeyError unless `key` is a NATS KV key: dot-separated tokens of [-/=A-Za-z0-9_]. */
export function validateKey(key: string): void {
  if (typeof key !== 'string' || key.length === 0) throw new InvalidKeyError(String(key), 'empty');
  if (key.length > MAX_KEY_LENGTH) throw new InvalidKeyError(key, `longer than ${MAX_KEY_LENGTH} characters`);
  for (const token of key.split('.')) {
    if (!KEY_TOKEN.test(token)) throw new InvalidKeyError(key, 'tokens must be non-empty and use only A-Z a-z 0-9 _ - / =');
  }
}

function validateFilter(filter: string): void {
  if (filter.length === 0 || filter.length > MAX_KEY_LENGTH) throw new InvalidKeyError(filter, 'bad filter length');
  const tokens = filter.split('.');
  tokens.forEach((t, i) => {
    if (t === '*' || (t === '>' && i === tokens.length - 1)) return;
    if (!KEY_TOKEN.test(t)) throw new InvalidKeyError(filter, 'filter tokens must be key tokens, `*`, or a final `>`');
  });
}

/**
 * Messages one watch asks for at a time, at most. It bounds what the server can queue for this
 * connection per watch at ~1.25 batches (the next pull goes out at 75% consumed): with ~1 KiB group
 * records, under 0.1 MiB. Big enough that a catch-up is not paced by round trips. (max_bytes would
 * bound bytes directly, but with it nats.js 3.4's ordered consumer was seen to skip messages.)
 */
const WATCH_BATCH = 64;
/**
 * Bytes one batch may hold with every record at its bucket's bound: a bucket of large records gets a
 * smaller batch (watchBatchFor). The read model watches hosts (64 KiB records), eight group shards
 * (64 KiB) and checkpoints (256 KiB): at 64 messages each, the worst case was ~65 MiB queued, past
 * the server's 64 MiB per client (a slow consumer, disconnected); with this, ~50 MiB.
 */
export const WATCH_BATCH_BYTES = 4 * 1024 * 1024;

/** A watch's batch (messages per pull) for records of at most `maxRecordBytes`. */
export function watchBatchFor(maxRecordBytes: number): number {
  return Math.max(1, Math.min(WATCH_BATCH, Math.floor(WATCH_BATCH_BYTES / maxRecordBytes)));
}
/** Lifetime of one pull request of a watch (see #follow). */
const WATCH_PULL_EXPIRES_MS = 5_000;

/** What watch() iterates: KV entries in stream order, and how to stop them. */
interface Following extends AsyncIterable<KvEntry> {
  stop(): void;
}

/**
 * A delete or purge marker. `KvEntry.operation` decodes the message's NATS headers into a map (every
 * stored put carries one, the CAS header of its write): on a read model's catch-up, 100,000s of
 * times. A marker always carries `KV-Operation` or `Nats-Marker-Reason` (the names the getter looks
 * up, matched exactly), so a message whose raw header bytes contain neither is a PUT without the
 * decode; anything else, or a client whose message internals differ, asks the getter.
 */
function isDeleted(e: KvEntry): boolean {
  const raw = rawHeaderBytes(e);
  if (raw === null) return false;
  if (raw !== undefined && raw.indexOf(OPERATION_HEADER) < 0 && raw.indexOf(MARKER_HEADER) < 0) return false;
  return e.operation === 'DEL' || e.operation === 'PURGE';
}

const OPERATION_HEADER = Buffer.from('KV-Operation');
const MARKER_HEADER = Buffer.from('Nats-Marker-Reason');

/**
 * The header block of the JetStream message behind a watch entry (nats.js 3.x: entry.sm is the
 * JsMsg, its msg the core message with `_msg.hdr` the header length, -1 for none, and `_rdata` the
 * payload): null when it has no headers, undefined when these internals are not there.
 */
function rawHeaderBytes(e: KvEntry): Buffer | null | undefined {
  const msg = (e as { sm?: { msg?: { _msg?: { hdr?: unknown }; _rdata?: unknown } } }).sm?.msg;
  const hdr = msg?._msg?.hdr;
  const data = msg?._rdata;
  if (typeof hdr !== 'number' || !(data instanceof Uint8Array)) return undefined;
  if (hdr < 0) return null;
  return Buffer.from(data.buffer, data.byteOffset, Math.min(hdr, data.byteLength));
}

export class KvRepository<T> {
  readonly bucket: string;
  readonly #kv: KV;
  readonly #codec: RecordCodec<T>;
  readonly #maxList: number;

  constructor(opts: KvRepositoryOptions<T>) {
    this.#kv = opts.kv;
    this.bucket = opts.bucket;
    this.#codec = jsonRecordCodec(opts.schema, opts.maxRecordBytes);
    this.#maxList = opts.maxListKeys ?? 10_000;
  }

  get maxRecordBytes(): number {
    return this.#codec.maxBytes;
  }

  /** The physical buckets behind this repository: itself (a sharded one has several). */
  get parts(): readonly KvRepository<T>[] {
    return [this];
  }

  /** Default and maximum number of keys one keys()/list() returns. */
  get maxListKeys(): number {
    return this.#maxList;
  }

  #where(key: string): string {
    return `${this.bucket}/${key}`;
  }

  /** Current value and revision, or undefined if absent or deleted. Corrupt values throw RecordInvalidError. */
  async get(key: string): Promise<Versioned<T> | undefined> {
    validateKey(key);
    let entry: KvEntry | null;
    try {
      entry = await this.#kv.get(key);
    } catch (err) {
      throw translateReadError(err, this.#where(key));
    }
    if (!entry || isDeleted(entry)) return undefined;
    return { value: this.#codec.decode(entry.value, this.#where(key)), revision: entry.revision };
  }

  /** Create `key`; CasConflictError (expectedRevision 0) if it exists. Returns the new revision. */
  async create(key: string, value: T): Promise<number> {
    validateKey(key);
    const bytes = this.#codec.encode(value, this.#where(key));
    try {
      return await this.#kv.create(key, bytes);
    } catch (err) {
      throw translateWriteError(err, { bucket: this.bucket, key, expectedRevision: 0, sizeBytes: bytes.length, limitBytes: this.#codec.maxBytes });
    }
  }

  /** Replace `key` only if its revision is still `expectedRevision`; else CasConflictError. Returns the new revision. */
  async update(key: string, value: T, expectedRevision: number): Promise<number> {
    validateKey(key);
    assertRevision(expectedRevision);
    const bytes = this.#codec.encode(value, this.#where(key));
    try {
      return await this.#kv.update(key, bytes, expectedRevision);
    } catch (err) {
      throw translateWriteError(err, { bucket: this.bucket, key, expectedRevision, sizeBytes: bytes.length, limitBytes: this.#codec.maxBytes });
    }
  }

  /** Delete `key` only if its revision is still `expectedRevision`; else CasConflictError. */
  async delete(key: string, expectedRevision: number): Promise<void> {
    validateKey(key);
    assertRevision(expectedRevision);
    try {
      await this.#kv.delete(key, { previousSeq: expectedRevision });
    } catch (err) {
      throw translateWriteError(err, { bucket: this.bucket, key, expectedRevision, sizeBytes: 0, limitBytes: this.#codec.maxBytes });
    }
  }

  /**
   * Read-modify-write with bounded retries on CAS conflict. `fn` gets the current value (undefined
   * if absent) and returns the new one, or undefined to leave the key unchanged. `fn` may run
   * several times, so it must not have side effects that assume it runs once. Errors other than CasConflictError are not retried: in
   * particular an ambiguous StoreUnavailableError (the write may have landed) is surfaced.
   */
  async mutate(
    key: string,
    fn: (current: T | undefined, revision: number) => T | undefined | Promise<T | undefined>,
    opts: MutateOptions = {}): Promise<Versioned<T> | undefined> {
    const retries = opts.retries ?? 8;
    const backoff = opts.backoffMs ?? 5;
    for (let attempt = 0; ; attempt++) {
      const current = await this.get(key);
      const next = await fn(current?.value, current?.revision ?? 0);
      if (next === undefined) return current;
      try {
        const revision = current ? await this.update(key, next, current.revision) : await this.create(key, next);
        return { value: next, revision };
      } catch (err) {
        if (!(err instanceof CasConflictError) || attempt >= retries) throw err;
        // Jitter spreads the retries of writers that all lost to the same winner.
        await sleep(Math.floor(Math.random() * backoff * (attempt + 1)));
      }
    }
  }

  /** Live keys (deleted ones excluded), at most `limit`; `truncated` says more exist. */
  async keys(opts: ListOptions = {}): Promise<{ keys: string[]; truncated: boolean }> {
    const limit = this.#limit(opts.limit);
    if (opts.filter !== undefined) validateFilter(opts.filter);
    const keys: string[] = [];
    let truncated = false;
    try {
      const iter = await this.#kv.keys(opts.filter ?? '>');
      for await (const k of iter) {
        if (keys.length === limit) {
          truncated = true;
          iter.stop();
          break;
        }
        keys.push(k);
      }
    } catch (err) {
      throw translateReadError(err, `${this.bucket} keys`);
    }
    keys.sort();
    return { keys, truncated };
  }

  /**
   * Values of live keys, at most `limit`. Corrupt records do not fail the listing (one bad record
   * must not blind a reconcile loop): they are returned in `invalid` for the caller to report.
   */
  async list(opts: ListOptions = {}): Promise<{ entries: KeyedVersioned<T>[]; invalid: RecordInvalidError[]; truncated: boolean }> {
    const { keys, truncated } = await this.keys(opts);
    const entries: KeyedVersioned<T>[] = [];
    const invalid: RecordInvalidError[] = [];
    const concurrency = 16;
    for (let i = 0; i < keys.length; i += concurrency) {
      const batch = keys.slice(i, i + concurrency);
      const results = await Promise.allSettled(batch.map((k) => this.get(k)));
      results.forEach((r, j) => {
        const key = batch[j] as string;
        if (r.status === 'fulfilled') {
          if (r.value) entries.push({ key, ...r.value }); // deleted between keys() and get()
        } else if (r.reason instanceof RecordInvalidError) {
          invalid.push(r.reason);
        } else {
          throw r.reason;
        }
      });
    }
    return { entries, invalid, truncated };
  }

  /**
   * Changes to keys matching `filter`, as they happen; first the current values unless
   * `updatesOnly`. Stops when the consumer breaks out of the loop or `signal` aborts.
   */
  async *watch(opts: { filter?: string; updatesOnly?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<KvChange<T>> {
    if (opts.filter !== undefined) validateFilter(opts.filter);
    let iter: Following;
    try {
      iter = await this.#follow(opts.filter ?? '>', opts.updatesOnly === true);
    } catch (err) {
      throw translateReadError(err, `${this.bucket} watch`);
    }
    const onAbort = (): void => iter.stop();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      if (opts.signal?.aborted) return;
      for await (const e of iter) {
        if (isDeleted(e)) {
          yield { op: 'delete', key: e.key, revision: e.revision };
          continue;
        }
        let value: T;
        try {
          value = this.#codec.decode(e.value, this.#where(e.key));
        } catch (err) {
          yield { op: 'invalid', key: e.key, revision: e.revision, error: err as RecordInvalidError };
          continue;
        }
        yield { op: 'put', key: e.key, revision: e.revision, value };
      }
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      iter.stop();
    }
  }

  /**
   * The bucket's entries as its stream delivers them: the last value of every key matching `filter`
   * (unless `updatesOnly`), then every change, in stream order. An ordered pull consumer asks for
   * watchBatchFor(its record bound) messages at a time as the caller consumes them, so however many buckets are watched
   * at once and however slow the caller, the server never queues more than a few batches per watch
   * for this connection; it recreates itself from the last sequence it delivered after a gap, a
   * reconnect or missed heartbeats. A KV handle that is not a JetStream bucket falls back to the
   * client's push watch.
   */
  async #follow(filter: string, updatesOnly: boolean): Promise<Following> {
    const kv = this.#kv;
    if (!(kv instanceof Bucket)) return kv.watch({ key: filter, include: updatesOnly ? KvWatchInclude.UpdatesOnly : KvWatchInclude.LastValue });
    const consumer = await kv.js.consumers.get(kv.stream, { filter_subjects: [kv.fullKeyName(filter)], deliver_policy: updatesOnly ? DeliverPolicy.New : DeliverPolicy.LastPerSubject });
    // Pull requests expire after WATCH_PULL_EXPIRES_MS (the client's default is 30 s): the idle
    // heartbeats that tell the consumer its server is gone come at half that, so a watch whose
    // consumer lived on a NATS node that died recreates itself in seconds, not minutes (measured on
    // a 3-node cluster: caught up ~10 s after the kill, against > 60 s with the default).
    const messages = await consumer.consume({ max_messages: watchBatchFor(this.#codec.maxBytes), expires: WATCH_PULL_EXPIRES_MS });
    return {
      async *[Symbol.asyncIterator]() {
        for await (const m of messages) yield kv.jmToWatchEntry(m, false);
      },
      stop() {
        messages.stop();
        // Ephemeral anyway (removed after 5 min without interest); deleted now to be tidy.
        consumer.delete().catch(() => undefined);
      },
    };
  }

  /**
   * The bucket's last stream sequence: every revision written so far is ≤ it. A read model that has
   * applied a watch up to this revision has seen every write made before this call (sync barrier).
   */
  async lastRevision(): Promise<number> {
    try {
      return (await this.#kv.status()).streamInfo.state.last_seq;
    } catch (err) {
      throw translateReadError(err, `${this.bucket} status`);
    }
  }

  #limit(limit: number | undefined): number {
    if (limit === undefined) return this.#maxList;
    if (!Number.isInteger(limit) || limit < 1 || limit > this.#maxList) throw new RangeError(`limit must be an integer in 1..${this.#maxList}, got ${limit}`);
    return limit;
  }
}

function assertRevision(rev: number): void {
  if (!Number.isSafeInteger(rev) || rev < 1) throw new RangeError(`expectedRevision must be a positive integer, got ${rev}`);
}
