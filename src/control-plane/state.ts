// What control-plane services are built from. The composition root (control-plane.ts) holds every
// dependency in one ControlPlaneDeps; each service declares the few it uses as a Pick of it (its
// port), so a reader sees from a constructor what a service can touch: most read the fleet from
// the read model (fleet-state.ts) and write through the one writer of each record kind
// (group-store.ts, hosts.ts HostStore, checkpoint-index.ts); none gets the raw buckets.
import type { ControlPlaneConfig } from '../config/control-plane.ts';
import type { Logger } from '../observability/logger.ts';
import type { FleetMetrics } from '../observability/metrics.ts';
import type { ChunkStore } from '../store/chunk-store.ts';
import type { StateStore } from '../store/connection.ts';
import type { KvRepository } from '../store/kv-repository.ts';
import type { Repository } from '../store/sharded-kv-repository.ts';
import type { AgentPort } from './agent-client.ts';
import type { ControlPlaneBuckets } from './buckets.ts';
import type { CheckpointIndex } from './checkpoint-index.ts';
import type { EventRecorder } from './events.ts';
import type { FleetState } from './fleet-state.ts';
import type { GroupStore } from './group-store.ts';
import type { HostStore } from './hosts.ts';
import type { Clock } from './keys.ts';
import {
  CheckpointRecordSchema,
  ConversationRecordSchema,
  GcLockRecordSchema,
  GroupRecordSchema,
  HostRecordSchema,
  IdempotencyRecordSchema,
  type CheckpointRecord,
  type ConversationRecord,
  type GcLockRecord,
  type GroupRecord,
  type HostRecord,
  type IdempotencyRecord,
} from './records.ts';

export { Keys, type Clock } from './keys.ts';

/** The raw buckets: only the stores (and tests that plant records) use these directly. */
export interface Repositories {
  readonly hosts: KvRepository<HostRecord>;
  readonly groups: Repository<GroupRecord>;
  readonly checkpoints: KvRepository<CheckpointRecord>;
  readonly conversations: KvRepository<ConversationRecord>;
  readonly idempotency: KvRepository<IdempotencyRecord>;
  readonly gcLocks: KvRepository<GcLockRecord>;
}

export function openRepositories(store: StateStore<ControlPlaneBuckets>): Repositories {
  return {
    hosts: store.repository('hosts', HostRecordSchema),
    groups: store.shardedRepository('groups', GroupRecordSchema),
    checkpoints: store.repository('checkpoints', CheckpointRecordSchema),
    conversations: store.repository('conversations', ConversationRecordSchema),
    idempotency: store.repository('idempotency', IdempotencyRecordSchema),
    gcLocks: store.repository('gcLocks', GcLockRecordSchema),
  };
}

/** Everything the control plane is built from; services take a Pick of it. */
export interface ControlPlaneDeps {
  readonly config: ControlPlaneConfig;
  /** The read model: what loops and queries read (never the buckets). */
  readonly fleet: FleetState;
  /** The one writer of each record kind. */
  readonly groups: GroupStore;
  readonly hosts: HostStore;
  readonly checkpoints: CheckpointIndex;
  readonly conversations: KvRepository<ConversationRecord>;
  readonly idempotency: KvRepository<IdempotencyRecord>;
  readonly gcLocks: KvRepository<GcLockRecord>;
  readonly chunks: ChunkStore;
  readonly agents: AgentPort;
  readonly events: EventRecorder;
  readonly metrics: FleetMetrics;
  readonly logger: Logger;
  readonly now: Clock;
  /** The control plane's own API/proto SHA (R-H2: agents must match it). */
  readonly apiSha: string;
  /** This replica's id (event actor, leader election holder). */
  readonly replicaId: string;
}
