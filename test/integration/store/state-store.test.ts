// StateStore.open against a real nats-server: buckets and streams are created with the declared
// settings, opening is idempotent and race-safe, drift is detected (immutable) or repaired
// (mutable), and limits that the server could not honour are refused up front.
import { DiscardPolicy, RetentionPolicy, StorageType } from '@nats-io/jetstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bucketShards, connectNats, DEFAULT_BUCKETS, DEFAULT_EVENT_STREAM, StateStore, kvStreamConfig, type KvBucketSpec } from '../../../src/store/connection.ts';
import { SHARD_METADATA_KEY } from '../../../src/store/stream-setup.ts';
import { shardIndex } from '../../../src/store/sharded-kv-repository.ts';
import { z } from 'zod';
import { Kvm } from '@nats-io/kv';
import { StoreConfigMismatchError } from '../../../src/store/errors.ts';
import { LocalNatsServer } from '../../../src/store/local-nats-server.ts';
import { startTestNats, type TestNats } from '../../support/nats.ts';

let nats: TestNats;

beforeAll(async () => {
  nats = await startTestNats();
});

afterAll(async () => {
  await nats?.cleanup();
});

describe('StateStore.open', () => {
  it('creates every bucket and stream with the declared settings, idempotently and race-safely', async () => {
    const conns = await Promise.all([0, 1, 2, 3].map((i) => nats.connect(`open-${i}`)));
    const stores = await Promise.all(conns.map((nc) => StateStore.open(nc)));
    expect(stores).toHaveLength(4);
    await StateStore.open(conns[0] as (typeof conns)[0]); // and once more, sequentially
    const jsm = (stores[0] as StateStore).jsm;
    for (const spec of (Object.values(DEFAULT_BUCKETS) as KvBucketSpec[]).flatMap(bucketShards)) {
      const { config } = await jsm.streams.info(`KV_${spec.bucket}`);
      expect(config.metadata?.[SHARD_METADATA_KEY], spec.bucket).toBe(spec.shard !== undefined ? `${spec.shard.index}/${spec.shard.count}` : undefined);
      expect(config.storage, spec.bucket).toBe(StorageType.File);
      expect(config.num_replicas).toBe(1);
      expect(config.max_msgs_per_subject).toBe(spec.history);
      expect(config.max_msg_size).toBeGreaterThan(spec.maxRecordBytes);
      expect(config.max_msg_size).toBeLessThanOrEqual(spec.maxRecordBytes + 1024);
      expect(config.max_bytes).toBe(spec.maxBucketBytes);
      expect(config.discard).toBe(DiscardPolicy.New);
      expect(config.allow_direct ?? false).toBe(false);
      expect(config.deny_delete).toBe(true);
    }
    const ev = (await jsm.streams.info(DEFAULT_EVENT_STREAM.stream)).config;
    expect(ev).toMatchObject({ subjects: ['sf.events.>'], storage: StorageType.File, retention: RetentionPolicy.Limits, discard: DiscardPolicy.Old, deny_delete: true, deny_purge: true });
    expect(ev.duplicate_window).toBe(DEFAULT_EVENT_STREAM.duplicateWindowMs * 1_000_000);
    const leader = (await jsm.streams.info(`KV_${DEFAULT_BUCKETS.leadership.bucket}`)).config;
    expect(leader.max_age).toBe(DEFAULT_BUCKETS.leadership.ttlMs * 1_000_000);
  });

  it('refuses a bucket whose existing stream has incompatible (immutable) settings', async () => {
    const nc = await nats.connect('drift');
    const spec: KvBucketSpec = { bucket: 'drift_mem', description: 'test', history: 3, maxRecordBytes: 1024, maxBucketBytes: 1024 * 1024 };
    const base = await StateStore.open(nc, { buckets: {} });
    await base.jsm.streams.add({ ...kvStreamConfig(spec, 1), storage: StorageType.Memory });
    const err = await StateStore.open(nc, { buckets: { d: spec } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreConfigMismatchError);
    expect((err as StoreConfigMismatchError).reason).toBe('store_config_mismatch');
    expect((err as Error).message).toMatch(/storage: memory → file/);
  });

  it('refuses to reopen a sharded bucket with another shard count (keys would move between shards)', async () => {
    const nc = await nats.connect('shards');
    const spec: KvBucketSpec = { bucket: 'sharded_t', description: 'test', history: 2, maxRecordBytes: 1024, maxBucketBytes: 8 * 1024 * 1024, shards: 4 };
    const store = await StateStore.open(nc, { buckets: { s: spec } });
    const repo = store.shardedRepository('s', z.object({ n: z.number() }));
    for (let i = 0; i < 40; i++) await repo.create(`k${i}`, { n: i });
    // Every key is in the shard its hash names, and only there.
    const counts = [0, 0, 0, 0];
    for (let i = 0; i < 4; i++) {
      const kv = await new Kvm(nc).open(`sharded_t_${i}`);
      for await (const key of await kv.keys()) {
        expect(shardIndex(key, 4), key).toBe(i);
        counts[i]! += 1;
      }
    }
    expect(counts.reduce((a, b) => a + b, 0)).toBe(40);
    expect(counts.every((c) => c > 0), `keys spread over all shards: ${counts.join(',')}`).toBe(true);
    // Merged listings keep the bounds of one bucket.
    expect((await repo.keys()).keys).toEqual(Array.from({ length: 40 }, (_, i) => `k${i}`).sort());
    const cut = await repo.list({ limit: 7 });
    expect(cut).toMatchObject({ truncated: true });
    expect(cut.entries.map((e) => e.key)).toEqual(Array.from({ length: 40 }, (_, i) => `k${i}`).sort().slice(0, 7));
    // Same layout: fine. Another count, fewer or more: refused before anything is read or written.
    await StateStore.open(nc, { buckets: { s: spec } });
    for (const shards of [2, 8]) {
      const err = await StateStore.open(nc, { buckets: { s: { ...spec, shards } } }).catch((e: unknown) => e);
      expect(err, `shards ${shards}`).toBeInstanceOf(StoreConfigMismatchError);
      expect((err as Error).message).toMatch(new RegExp(`shard layout: 0/4 → 0/${shards}`));
    }
    // An unsharded store over the same name does not see half the keys by accident either.
    const plain = await StateStore.open(nc, { buckets: { s: { ...spec, bucket: 'sharded_t_0', shards: undefined } } }).catch((e: unknown) => e);
    expect(plain).toBeInstanceOf(StoreConfigMismatchError);
    expect(() => store.repository('s', z.object({ n: z.number() }))).toThrow(/sharded/);
    // Data of a build that kept the bucket unsharded is never hidden behind new empty shards.
    const legacySpec: KvBucketSpec = { ...spec, bucket: 'legacy_t', shards: undefined };
    await StateStore.open(nc, { buckets: { s: legacySpec } });
    const refused = await StateStore.open(nc, { buckets: { s: { ...legacySpec, shards: 4 } } }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(StoreConfigMismatchError);
    expect((refused as Error).message).toMatch(/legacy_t exists unsharded/);
  });

  it('repairs drifted mutable settings (e.g. history, value bound) with a stream update', async () => {
    const nc = await nats.connect('drift2');
    const spec: KvBucketSpec = { bucket: 'drift_hist', description: 'test', history: 7, maxRecordBytes: 2048, maxBucketBytes: 1024 * 1024 };
    const base = await StateStore.open(nc, { buckets: {} });
    await base.jsm.streams.add({ ...kvStreamConfig(spec, 1), max_msgs_per_subject: 1, max_msg_size: 100 });
    const store = await StateStore.open(nc, { buckets: { d: spec } });
    const { config } = await store.jsm.streams.info('KV_drift_hist');
    expect(config.max_msgs_per_subject).toBe(7);
    expect(config.max_msg_size).toBe(2048 + 1024);
  });

  it('refuses limits above the server max_payload, and bad replica counts', async () => {
    const nc = await nats.connect('payload');
    const maxPayload = nc.info?.max_payload as number;
    const spec: KvBucketSpec = { bucket: 'too_big', description: 'test', history: 1, maxRecordBytes: maxPayload, maxBucketBytes: -1 };
    await expect(StateStore.open(nc, { buckets: { t: spec } })).rejects.toBeInstanceOf(StoreConfigMismatchError);
    await expect(StateStore.open(nc, { replicas: 2 })).rejects.toBeInstanceOf(RangeError);
  });

  it('asks the single local server for R3 and surfaces the refusal', async () => {
    const nc = await nats.connect('r3');
    await expect(StateStore.open(nc, { replicas: 3, buckets: { x: { bucket: 'r3_bucket', description: 't', history: 1, maxRecordBytes: 100, maxBucketBytes: -1 } } })).rejects.toThrow(
      /replicas|cluster/i,
    );
  });
});

describe('LocalNatsServer', () => {
  it('fails to start with a clear error when the port is taken, and stop() is idempotent', async () => {
    const clash = new LocalNatsServer({ storeDir: `${nats.dir}/clash-store`, workDir: `${nats.dir}/clash`, port: nats.server.port, monitorPort: false, startTimeoutMs: 5000 });
    await expect(clash.start()).rejects.toThrow(/nats-server failed to start/);
    expect(clash.running).toBe(false);
    await clash.stop();
  });

  it('runs without a monitoring port, readiness by client greeting', async () => {
    const s = await LocalNatsServer.start({ storeDir: `${nats.dir}/nomon-store`, workDir: `${nats.dir}/nomon`, monitorPort: false });
    try {
      expect(s.monitorUrl).toBeUndefined();
      const store = await StateStore.open(await connectNats({ servers: s.url, name: 'nomon' }));
      expect((await store.events.append({ id: 'x', timeMs: 0, actor: 'a', subjectKind: 'host', subjectId: 'h', type: 't' })).seq).toBe(1);
      await store.nc.close();
    } finally {
      await s.stop();
    }
  });
});
