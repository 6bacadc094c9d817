// The control plane's KV buckets: the store's defaults plus two the runner API needs (idempotency
// answers and the conversation → group index). Declared here, opened by StateStore.open with
// explicit settings like every other bucket, so nothing is created implicitly.
import { DEFAULT_BUCKETS, type KvBucketSpec } from '../store/connection.ts';

const KIB = 1024;
const MIB = 1024 * KIB;

export const CONTROL_PLANE_BUCKETS = {
  ...DEFAULT_BUCKETS,
  // First answers to idempotency keys (R-I1); keys expire after a day (a retry comes within seconds).
  idempotency: { bucket: 'sf_idempotency', description: 'first answers of mutating runner calls by idempotency key (R-I1)', history: 1, maxRecordBytes: 64 * KIB, maxBucketBytes: 512 * MIB, ttlMs: 24 * 3600 * 1000 },
  // Mutual exclusion of chunk sweeps and checkpoints in progress (chunk-gc-locks.ts).
  gcLocks: { bucket: 'sf_gc_locks', description: 'chunk garbage collection vs checkpoints in progress (R-G7)', history: 1, maxRecordBytes: 1 * KIB, maxBucketBytes: 64 * MIB },
  conversations: { bucket: 'sf_conversations', description: 'conversation id to its sandbox group', history: 5, maxRecordBytes: 1 * KIB, maxBucketBytes: 256 * MIB },
} as const satisfies Record<string, KvBucketSpec>;

export type ControlPlaneBuckets = typeof CONTROL_PLANE_BUCKETS;
