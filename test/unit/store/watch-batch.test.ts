// A watch's batch is sized by its bucket's record bound, so that the read model's watches together
// cannot make nats-server queue more for the control plane's connection than it allows a client
// (64 MiB by default; past it the server drops the connection as a slow consumer).
import { describe, expect, it } from 'vitest';
import { DEFAULT_BUCKETS, bucketShards } from '../../../src/store/connection.ts';
import { WATCH_BATCH_BYTES, watchBatchFor } from '../../../src/store/kv-repository.ts';

/** nats-server's default max_pending per client connection. */
const SERVER_MAX_PENDING = 64 * 1024 * 1024;
/** What a KV message carries besides its value (connection.ts HEADER_SLACK_BYTES). */
const HEADER_SLACK = 1024;

describe('watch batch', () => {
  it('is 64 messages for small records, fewer for large ones, never 0', () => {
    expect(watchBatchFor(1024)).toBe(64);
    expect(watchBatchFor(64 * 1024)).toBe(64);
    expect(watchBatchFor(256 * 1024)).toBe(16);
    expect(watchBatchFor(WATCH_BATCH_BYTES * 4)).toBe(1);
  });

  it("keeps the read model's watches (control-plane.ts: hosts, every group shard, checkpoints) under the server's per-client limit with every record at its bound", () => {
    const watched = [DEFAULT_BUCKETS.hosts, ...bucketShards(DEFAULT_BUCKETS.groups), DEFAULT_BUCKETS.checkpoints];
    // ~1.25 batches per watch can be queued: the next pull goes out once 75% of one is consumed.
    const worst = watched.reduce((n, b) => n + 1.25 * watchBatchFor(b.maxRecordBytes) * (b.maxRecordBytes + HEADER_SLACK), 0);
    expect(worst).toBeLessThan(SERVER_MAX_PENDING);
    // The bound that held before: 64 messages whatever the record size.
    const before = watched.reduce((n, b) => n + 1.25 * 64 * (b.maxRecordBytes + HEADER_SLACK), 0);
    expect(before).toBeGreaterThan(SERVER_MAX_PENDING);
  });
});
