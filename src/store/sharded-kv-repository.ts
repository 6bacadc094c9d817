// One logical KV bucket spread over N JetStream KV buckets ("shards"), each key always in the same
// shard. Why: nats-server applies a stream's writes one at a time, and with `sync_interval: always`
// each write waits for its own fsync, so one stream caps the whole fleet's compare-and-set rate
// (measured here at c64: 1 stream ≈ 3.0k CAS/s, p50 21 ms; 8 streams ≈ 8.1k CAS/s, p50 7.6 ms).
// The turn hot path writes the group record twice per turn, so groups are sharded.
//
// Semantics are the single bucket's, key by key: a key's revision is its shard's sequence, so CAS on
// a key is unchanged; revisions of keys in different shards are not comparable (nothing compares
// them). keys()/list() merge the shards and keep their bounds. The shard of a key is a pure function
// of the key and the shard count (FNV-1a), and the count is fixed for the life of the data: every
// shard stream records "index/count" in its metadata and StateStore.open refuses a different layout.
import type { RecordInvalidError } from './errors.ts';
import type { KeyedVersioned, KvRepository, ListOptions, MutateOptions, Versioned } from './kv-repository.ts';

/** What the control plane needs from a bucket of records, sharded or not. */
export type Repository<T> = Pick<KvRepository<T>, 'bucket' | 'maxRecordBytes' | 'get' | 'create' | 'update' | 'delete' | 'mutate' | 'keys' | 'list'> & {
  /** The physical buckets, each watched on its own (a read model follows every one). */
  readonly parts: readonly KvRepository<T>[];
};

/** Most shards a logical bucket may have (each is a stream, and a Raft group in a cluster). */
export const MAX_SHARDS = 64;

/** The shard holding `key`: 32-bit FNV-1a of its UTF-16 code units, mod `count`. Stable forever. */
export function shardIndex(key: string, count: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % count;
}

export class ShardedKvRepository<T> implements Repository<T> {
  /** The logical bucket name (the shards are `<bucket>_<i>`), for error messages. */
  readonly bucket: string;
  readonly #shards: readonly KvRepository<T>[];

  constructor(bucket: string, shards: readonly KvRepository<T>[]) {
    if (shards.length < 1 || shards.length > MAX_SHARDS) throw new RangeError(`${bucket}: 1..${MAX_SHARDS} shards, got ${shards.length}`);
    this.bucket = bucket;
    this.#shards = shards;
  }

  get maxRecordBytes(): number {
    return this.#shards[0]!.maxRecordBytes;
  }

  get parts(): readonly KvRepository<T>[] {
    return this.#shards;
  }

  /** The shard repository that holds `key`. */
  shardOf(key: string): KvRepository<T> {
    return this.#shards[shardIndex(key, this.#shards.length)]!;
  }

  get(key: string): Promise<Versioned<T> | undefined> {
    return this.shardOf(key).get(key);
  }

  create(key: string, value: T): Promise<number> {
    return this.shardOf(key).create(key, value);
  }

  update(key: string, value: T, expectedRevision: number): Promise<number> {
    return this.shardOf(key).update(key, value, expectedRevision);
  }

  delete(key: string, expectedRevision: number): Promise<void> {
    return this.shardOf(key).delete(key, expectedRevision);
  }

  mutate(key: string, fn: (current: T | undefined, revision: number) => T | undefined | Promise<T | undefined>, opts?: MutateOptions): Promise<Versioned<T> | undefined> {
    return this.shardOf(key).mutate(key, fn, opts);
  }

  /** Live keys of all shards, sorted, at most `limit` (each shard is asked for at most `limit`). */
  async keys(opts: ListOptions = {}): Promise<{ keys: string[]; truncated: boolean }> {
    const parts = await Promise.all(this.#shards.map((s) => s.keys(opts)));
    const all = parts.flatMap((p) => p.keys).sort();
    const limit = opts.limit ?? this.#shards[0]!.maxListKeys;
    // A shard cut at the shared limit means the merged listing is cut too.
    const truncated = parts.some((p) => p.truncated) || all.length > limit;
    return { keys: all.length > limit ? all.slice(0, limit) : all, truncated };
  }

  /** Values of live keys of all shards, sorted by key, at most `limit`; corrupt records reported in `invalid`. */
  async list(opts: ListOptions = {}): Promise<{ entries: KeyedVersioned<T>[]; invalid: RecordInvalidError[]; truncated: boolean }> {
    const parts = await Promise.all(this.#shards.map((s) => s.list(opts)));
    const entries = parts.flatMap((p) => p.entries).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    const limit = opts.limit ?? this.#shards[0]!.maxListKeys;
    return {
      entries: entries.length > limit ? entries.slice(0, limit) : entries,
      invalid: parts.flatMap((p) => p.invalid),
      truncated: parts.some((p) => p.truncated) || entries.length > limit,
    };
  }
}
