// NATS connection and the StateStore: the one place that declares every KV bucket and the event
// stream with EXPLICIT settings (file storage, replicas, history, value bounds, discard policy)
// and creates-or-verifies them at startup (R-A3; R3 in production, R1 locally).
// Services get typed repositories from it. Checkpoint data lives in chunk-store.ts's streams.
import { jetstream, jetstreamManager, DiscardPolicy, JetStreamApiError, RetentionPolicy, StorageType, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { ExponentialBackoff, handleWhen, retry } from 'cockatiel';
import type { NatsConnection, NodeConnectionOptions } from '@nats-io/transport-node';
import { connectCoalescing } from './coalescing-transport.ts';
import type { z } from 'zod';
import type { Logger } from '../observability/logger.ts';
import { StoreConfigMismatchError, StoreUnavailableError, translateReadError } from './errors.ts';
import { DEFAULT_MAX_EVENT_BYTES, EVENTS_SUBJECT_PREFIX, EventLog } from './event-log.ts';
import { KvRepository } from './kv-repository.ts';
import { natsAuthConnectOptions, type NatsAuthOptions } from './nats-auth.ts';
import { MAX_SHARDS, ShardedKvRepository, shardIndex } from './sharded-kv-repository.ts';
import { SHARD_METADATA_KEY, ensureStream, type DesiredStream } from './stream-setup.ts';

export interface ConnectNatsOptions {
  readonly servers: string | readonly string[];
  /** Shown in the server's connection list: say which process this is. */
  readonly name: string;
  readonly logger?: Logger;
  /** -1 (default) retries forever: a control plane must ride out a NATS restart, not exit. */
  readonly maxReconnectAttempts?: number;
  /** Default 1000 ms (plus jitter). */
  readonly reconnectTimeWaitMs?: number;
  /** Timeout of the first connect and of requests; default 5000 ms. */
  readonly timeoutMs?: number;
  /** Keep retrying the very first connect (e.g. NATS starting alongside); default false. */
  readonly waitOnFirstConnect?: boolean;
  /** Credentials, CA and inbox prefix (R-I2, R-R5; nats-auth.ts). */
  readonly auth?: NatsAuthOptions;
  /**
   * Read the socket at most once per this many ms (coalescing-transport.ts): only for a connection
   * that takes in a steady stream nobody waits on, such as heartbeats. Absent: read as data arrives.
   */
  readonly readBatchMs?: number;
  /** Other client options, passed through unchanged. */
  readonly extra?: Partial<NodeConnectionOptions>;
}

/**
 * The servers to try, in order: a list, or one string that may name several comma-separated
 * (SANDBOXFLEET_NATS_URL on a cluster: every member, so a client starts and reconnects while any
 * one of them is up; the client also learns the other members from the server it reaches).
 */
export function seedList(servers: string | readonly string[]): string[] {
  const list = (typeof servers === 'string' ? servers.split(',') : [...servers]).map((s) => s.trim()).filter((s) => s.length > 0);
  if (list.length === 0) throw new Error('no NATS server given');
  return list;
}

/** Connect to NATS; connection status changes are logged. The caller owns (and closes) it. */
export async function connectNats(opts: ConnectNatsOptions): Promise<NatsConnection> {
  const timeout = opts.timeoutMs ?? 5000;
  const nc = await connectCoalescing({
    ...opts.extra,
    ...(opts.auth !== undefined ? natsAuthConnectOptions(opts.auth) : {}),
    servers: seedList(opts.servers),
    name: opts.name,
    maxReconnectAttempts: opts.maxReconnectAttempts ?? -1,
    reconnectTimeWait: opts.reconnectTimeWaitMs ?? 1000,
    timeout,
    waitOnFirstConnect: opts.waitOnFirstConnect ?? false,
    // nats.js otherwise builds two Error objects (with captured stacks) for EVERY request, to have a
    // caller stack ready in case it fails: ~8% of the control plane's CPU on the turn hot path. Our
    // store errors name the bucket, key and operation (errors.ts), which is what a failure report needs.
    noAsyncTraces: true,
    ...(opts.readBatchMs !== undefined ? { readBatchMs: opts.readBatchMs } : {}),
  });
  const logger = opts.logger;
  if (logger) {
    logger.info({ server: nc.getServer(), maxPayload: nc.info?.max_payload }, 'connected to NATS');
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === 'ping' || s.type === 'update') continue;
        const level = s.type === 'disconnect' || s.type === 'error' || s.type === 'slowConsumer' ? 'warn' : 'info';
        logger[level]({ status: s.type, data: 'data' in s ? String(s.data) : undefined }, 'NATS connection status');
      }
    })();
  }
  return nc;
}

/** Largest message the connected server accepts (its max_payload). */
export function serverMaxPayload(nc: NatsConnection): number {
  const max = nc.info?.max_payload;
  if (!max) throw new Error('not connected: server max_payload unknown');
  return max;
}

/** One KV bucket's declared settings. */
export interface KvBucketSpec {
  readonly bucket: string;
  readonly description: string;
  /** Revisions kept per key (1-64): older ones help audits/debugging, CAS needs only the last. */
  readonly history: number;
  /** Bound on one encoded record (R-R4); the repository rejects larger values. */
  readonly maxRecordBytes: number;
  /** Bound on the whole bucket; writes fail (discard new) rather than evict state. */
  readonly maxBucketBytes: number;
  /** Server-side expiry of keys not rewritten within this time; only for lease-like data. */
  readonly ttlMs?: number;
  /**
   * Spread the keys over this many buckets `<bucket>_0..n-1` (see sharded-kv-repository.ts): a
   * stream's writes are applied, and fsynced, one at a time. Fixed for the life of the data.
   */
  readonly shards?: number;
}

/** The physical buckets of `spec`: itself, or one per shard with the byte bound split evenly. */
export function bucketShards(spec: KvBucketSpec): (KvBucketSpec & { readonly shard?: { readonly index: number; readonly count: number } })[] {
  const count = spec.shards ?? 1;
  if (!Number.isInteger(count) || count < 1 || count > MAX_SHARDS) throw new RangeError(`${spec.bucket}: shards must be 1..${MAX_SHARDS}`);
  if (spec.shards === undefined) return [spec];
  return Array.from({ length: count }, (_, index) => ({
    ...spec,
    bucket: `${spec.bucket}_${index}`,
    description: `${spec.description} [shard ${index + 1} of ${count}]`,
    maxBucketBytes: Math.ceil(spec.maxBucketBytes / count),
    shard: { index, count },
  }));
}

const KIB = 1024;
const MIB = 1024 * KIB;
const GIB = 1024 * MIB;
/** Headers a KV or event message carries besides the value (operation, expected sequence, msg id). */
const HEADER_SLACK_BYTES = 1024;

/** The control plane's buckets. Ids are what services ask for; `bucket` is the NATS name. */
export const DEFAULT_BUCKETS = {
  hosts: { bucket: 'sf_hosts', description: 'host registration, attestation and state (R-H1, R-H2)', history: 5, maxRecordBytes: 64 * KIB, maxBucketBytes: 1 * GIB },
  hostLeases: { bucket: 'sf_host_leases', description: 'host lease term and fencing epoch (R-H4, R-H6)', history: 10, maxRecordBytes: 4 * KIB, maxBucketBytes: 256 * MIB },
  heartbeats: { bucket: 'sf_heartbeats', description: 'latest heartbeat and inventory per host (R-H3)', history: 1, maxRecordBytes: 256 * KIB, maxBucketBytes: 1 * GIB },
  // Sharded: both writes of every turn land here (see sharded-kv-repository.ts for the numbers).
  groups: { bucket: 'sf_groups', description: 'sandbox groups, members and placement (R-G1)', history: 10, maxRecordBytes: 64 * KIB, maxBucketBytes: 4 * GIB, shards: 8 },
  locators: { bucket: 'sf_locators', description: 'saved native session locators per member (R-S2)', history: 10, maxRecordBytes: 4 * KIB, maxBucketBytes: 1 * GIB },
  checkpoints: { bucket: 'sf_checkpoints', description: 'checkpoint records and their state (R-G3, R-G4, R-G7)', history: 5, maxRecordBytes: 256 * KIB, maxBucketBytes: 4 * GIB },
  leadership: { bucket: 'sf_leadership', description: 'leader lease of the control plane', history: 1, maxRecordBytes: 1 * KIB, maxBucketBytes: 1 * MIB, ttlMs: 15_000 },
} as const satisfies Record<string, KvBucketSpec>;

export type BucketId = keyof typeof DEFAULT_BUCKETS;

export interface EventStreamSpec {
  readonly stream: string;
  readonly maxEventBytes: number;
  /** Events older than this roll off. */
  readonly maxAgeMs: number;
  /** Size bound; the oldest events roll off (discard old) so appends never stall the fleet. */
  readonly maxBytes: number;
  /** Window in which a re-appended event id is recognised as a duplicate. */
  readonly duplicateWindowMs: number;
}

export const DEFAULT_EVENT_STREAM: EventStreamSpec = {
  stream: 'SF_EVENTS',
  maxEventBytes: DEFAULT_MAX_EVENT_BYTES,
  maxAgeMs: 90 * 24 * 3600 * 1000,
  maxBytes: 2 * GIB,
  duplicateWindowMs: 10 * 60 * 1000,
};

export interface StateStoreOptions<B extends Record<string, KvBucketSpec> = typeof DEFAULT_BUCKETS> {
  /** Stream replicas: 1 for a single local server, 3 (or 5) on a production cluster. */
  readonly replicas?: number;
  readonly buckets?: B;
  readonly events?: Partial<EventStreamSpec>;
  /** JetStream API request timeout; default 5000 ms. */
  readonly timeoutMs?: number;
  /**
   * How long set-up keeps trying while JetStream does not answer (a cluster still electing its
   * leaders, a server starting): default 60 s. Wrong settings fail at once.
   */
  readonly setupDeadlineMs?: number;
  readonly logger?: Logger;
}

const nanos = (ms: number): number => ms * 1_000_000;

/** StateStoreOptions.setupDeadlineMs default. */
const DEFAULT_SETUP_DEADLINE_MS = 60_000;

/** The stream under KV bucket `spec`, mirroring what @nats-io/kv creates, plus our explicit choices. */
export function kvStreamConfig(spec: KvBucketSpec & { readonly shard?: { readonly index: number; readonly count: number } }, replicas: number): DesiredStream {
  if (!Number.isInteger(spec.history) || spec.history < 1 || spec.history > 64) throw new RangeError(`${spec.bucket}: history must be 1..64`);
  const maxAge = spec.ttlMs ? nanos(spec.ttlMs) : 0;
  return {
    name: `KV_${spec.bucket}`,
    description: spec.description,
    subjects: [`$KV.${spec.bucket}.>`],
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    num_replicas: replicas,
    max_msgs_per_subject: spec.history,
    max_msg_size: spec.maxRecordBytes + HEADER_SLACK_BYTES,
    max_bytes: spec.maxBucketBytes,
    max_age: maxAge,
    // KV semantics: a full bucket refuses writes; evicting would silently drop live keys.
    discard: DiscardPolicy.New,
    // The server requires duplicate_window ≤ max_age.
    duplicate_window: maxAge > 0 ? Math.min(maxAge, nanos(120_000)) : nanos(120_000),
    allow_rollup_hdrs: true,
    // Reads go to the stream leader: a read after an acknowledged write always sees it, which
    // read-modify-write loops rely on (direct gets may be served by a lagging replica).
    allow_direct: false,
    deny_delete: true,
    deny_purge: false,
    ...(spec.shard !== undefined ? { metadata: { [SHARD_METADATA_KEY]: `${spec.shard.index}/${spec.shard.count}` } } : {}),
  };
}

export function eventStreamConfig(spec: EventStreamSpec, replicas: number): DesiredStream {
  return {
    name: spec.stream,
    description: 'Sandbox Fleet audit/event log (append-only)',
    subjects: [`${EVENTS_SUBJECT_PREFIX}.>`],
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    num_replicas: replicas,
    max_msg_size: spec.maxEventBytes + HEADER_SLACK_BYTES,
    max_bytes: spec.maxBytes,
    max_age: nanos(spec.maxAgeMs),
    discard: DiscardPolicy.Old,
    duplicate_window: nanos(spec.duplicateWindowMs),
    allow_rollup_hdrs: false,
    allow_direct: false,
    // Append-only: no API may delete or purge audit entries (an operator can lift this by a
    // deliberate stream edit).
    deny_delete: true,
    deny_purge: true,
  };
}

/** Bind to the JetStream API, create or verify every stream, open every bucket (one attempt). */
async function setUp<B extends Record<string, KvBucketSpec>>(nc: NatsConnection, buckets: B, desired: readonly DesiredStream[], timeout: number, logger: Logger | undefined): Promise<{ js: JetStreamClient; jsm: JetStreamManager; kvs: Map<keyof B, KV[]> }> {
  let js: JetStreamClient;
  let jsm: JetStreamManager;
  try {
    js = jetstream(nc, { timeout });
    jsm = await jetstreamManager(nc, { timeout });
  } catch (err) {
    throw translateReadError(err, 'JetStream API');
  }
  // A sharded bucket whose unsharded stream exists holds data from a build that did not shard
  // it: opening the shards would silently hide every one of those keys.
  for (const spec of Object.values(buckets)) {
    if (spec.shards === undefined) continue;
    const legacy = `KV_${spec.bucket}`;
    const exists = await jsm.streams.info(legacy).then(
      () => true,
      (err: unknown) => {
        if (err instanceof JetStreamApiError && err.code === 10059) return false;
        throw translateReadError(err, `stream ${legacy}`);
      },
    );
    if (exists) throw new StoreConfigMismatchError(`bucket ${spec.bucket} exists unsharded (stream ${legacy}); this build keeps it in ${spec.shards} shards ${spec.bucket}_0..${spec.shards - 1}: move its keys over or remove it`);
  }
  for (const d of desired) await ensureStream(jsm, d, logger);

  const kvm = new Kvm(js);
  const kvs = new Map<keyof B, KV[]>();
  for (const [id, spec] of Object.entries(buckets)) {
    const opened: KV[] = [];
    for (const shard of bucketShards(spec)) {
      opened.push(await kvm.open(shard.bucket, { allow_direct: false, timeout }).catch((err: unknown) => {
        throw translateReadError(err, `bucket ${shard.bucket}`);
      }));
    }
    kvs.set(id as keyof B, opened);
  }
  return { js, jsm, kvs };
}

/** Opened buckets and event log over one NATS connection. */
export class StateStore<B extends Record<string, KvBucketSpec> = typeof DEFAULT_BUCKETS> {
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  readonly events: EventLog;
  readonly replicas: number;
  readonly #buckets: B;
  /** Per bucket id, its physical buckets in shard order (one when unsharded). */
  readonly #kvs: Map<keyof B, KV[]>;

  private constructor(init: {
    nc: NatsConnection;
    js: JetStreamClient;
    jsm: JetStreamManager;
    events: EventLog;
    replicas: number;
    buckets: B;
    kvs: Map<keyof B, KV[]>;
  }) {
    this.nc = init.nc;
    this.js = init.js;
    this.jsm = init.jsm;
    this.events = init.events;
    this.replicas = init.replicas;
    this.#buckets = init.buckets;
    this.#kvs = init.kvs;
  }

  /**
   * Create or verify every bucket and stream, then bind to them. Safe to run concurrently from
   * several control-plane replicas. Does not take ownership of `nc`.
   */
  static async open<B extends Record<string, KvBucketSpec> = typeof DEFAULT_BUCKETS>(nc: NatsConnection, opts: StateStoreOptions<B> = {}): Promise<StateStore<B>> {
    const replicas = opts.replicas ?? 1;
    if (![1, 3, 5].includes(replicas)) throw new RangeError(`replicas must be 1, 3 or 5, got ${replicas}`);
    const buckets = (opts.buckets ?? DEFAULT_BUCKETS) as B;
    const eventsSpec = { ...DEFAULT_EVENT_STREAM, ...opts.events };
    const timeout = opts.timeoutMs ?? 5000;
    const logger = opts.logger;

    const maxPayload = serverMaxPayload(nc);
    const desired: DesiredStream[] = [
      ...Object.values(buckets).flatMap((b) => bucketShards(b).map((shard) => kvStreamConfig(shard, replicas))),
      eventStreamConfig(eventsSpec, replicas),
    ];
    for (const d of desired) {
      if (d.max_msg_size !== undefined && d.max_msg_size > maxPayload) {
        throw new StoreConfigMismatchError(`${d.name}: max message size ${d.max_msg_size} exceeds the server's max_payload ${maxPayload}`);
      }
    }

    // Set-up is idempotent (every step creates or verifies), so a step nobody answered is simply
    // run again, from the start, until the deadline: a cluster whose meta leader is being elected
    // answers nothing for seconds, and a replica that gave up then would only be restarted to try
    // again later. Any other error (incompatible settings) fails at once.
    const deadline = Date.now() + (opts.setupDeadlineMs ?? DEFAULT_SETUP_DEADLINE_MS);
    const policy = retry(handleWhen((err) => err instanceof StoreUnavailableError && Date.now() < deadline), {
      maxAttempts: Number.MAX_SAFE_INTEGER,
      backoff: new ExponentialBackoff({ initialDelay: 250, maxDelay: 5_000 }),
    });
    policy.onRetry(({ delay, ...reason }) => {
      const err = 'error' in reason ? reason.error : undefined;
      logger?.warn({ err: err instanceof Error ? err.message : err, retryInMs: Math.round(delay) }, 'state store set-up got no answer from NATS; retrying');
    });
    const { js, jsm, kvs } = await policy.execute(() => setUp(nc, buckets, desired, timeout, logger));
    const events = new EventLog({ js, jsm, stream: eventsSpec.stream, maxEventBytes: eventsSpec.maxEventBytes });
    logger?.info({ replicas, buckets: Object.values(buckets).map((b) => (b.shards === undefined ? b.bucket : `${b.bucket}_0..${b.shards - 1}`)), events: eventsSpec.stream }, 'state store ready');
    return new StateStore({ nc, js, jsm, events, replicas, buckets, kvs });
  }

  /** The declared settings of bucket `id`. */
  spec(id: keyof B): KvBucketSpec {
    const s = this.#buckets[id];
    if (!s) throw new Error(`unknown bucket id ${String(id)}`);
    return s;
  }

  /** A typed CAS repository over unsharded bucket `id`, validating records with `schema`. */
  repository<T>(id: keyof B, schema: z.ZodType<T>): KvRepository<T> {
    const spec = this.spec(id);
    if (spec.shards !== undefined) throw new Error(`bucket ${spec.bucket} is sharded: use shardedRepository()`);
    return new KvRepository<T>({ kv: this.#physical(id)[0]!, bucket: spec.bucket, schema, maxRecordBytes: spec.maxRecordBytes });
  }

  /** A typed CAS repository over bucket `id`, sharded or not (see sharded-kv-repository.ts). */
  shardedRepository<T>(id: keyof B, schema: z.ZodType<T>): ShardedKvRepository<T> {
    const spec = this.spec(id);
    const kvs = this.#physical(id);
    const shards = bucketShards(spec).map((s, i) => new KvRepository<T>({ kv: kvs[i]!, bucket: s.bucket, schema, maxRecordBytes: s.maxRecordBytes }));
    return new ShardedKvRepository<T>(spec.bucket, shards);
  }

  /** The NATS bucket that holds `key` of bucket `id` (the bucket itself when unsharded). */
  bucketFor(id: keyof B, key: string): string {
    const spec = this.spec(id);
    return spec.shards === undefined ? spec.bucket : `${spec.bucket}_${shardIndex(key, spec.shards)}`;
  }

  /**
   * The untyped client bucket: for leader-lease style uses and tests; prefer repository(). A sharded
   * bucket needs the key, to name the shard that holds it.
   */
  rawKv(id: keyof B, key?: string): KV {
    const kvs = this.#physical(id);
    if (kvs.length === 1) return kvs[0]!;
    if (key === undefined) throw new Error(`bucket ${this.spec(id).bucket} is sharded: rawKv needs the key`);
    return kvs[shardIndex(key, kvs.length)]!;
  }

  #physical(id: keyof B): KV[] {
    const kvs = this.#kvs.get(id);
    if (!kvs) throw new Error(`unknown bucket id ${String(id)}`);
    return kvs;
  }
}
