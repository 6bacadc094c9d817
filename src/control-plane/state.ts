// Typed repositories over the control plane's buckets and the shared dependencies every service in
// this folder receives. Key encodings live here so no caller builds a KV key by hand.
import { createHash } from 'node:crypto';
import type { ControlPlaneConfig } from '../config/control-plane.ts';
import type { Logger } from '../observability/logger.ts';
import type { FleetMetrics } from '../observability/metrics.ts';
import type { ChunkStore } from '../store/chunk-store.ts';
import type { StateStore } from '../store/connection.ts';
import type { KvRepository } from '../store/kv-repository.ts';
import type { Repository } from '../store/sharded-kv-repository.ts';
import type { AgentPort } from './agent-client.ts';
import type { ControlPlaneBuckets } from './buckets.ts';
import type { EventRecorder } from './events.ts';
import {
  CheckpointRecordSchema,
  ConversationRecordSchema,
  GcLockRecordSchema,
  GroupRecordSchema,
  HeartbeatRecordSchema,
  HostRecordSchema,
  IdempotencyRecordSchema,
  type CheckpointRecord,
  type ConversationRecord,
  type GcLockRecord,
  type GroupRecord,
  type HeartbeatRecord,
  type HostRecord,
  type IdempotencyRecord,
} from './records.ts';

export interface Repositories {
  readonly hosts: KvRepository<HostRecord>;
  readonly heartbeats: KvRepository<HeartbeatRecord>;
  readonly groups: Repository<GroupRecord>;
  readonly checkpoints: KvRepository<CheckpointRecord>;
  readonly conversations: KvRepository<ConversationRecord>;
  readonly idempotency: KvRepository<IdempotencyRecord>;
  readonly gcLocks: KvRepository<GcLockRecord>;
}

export function openRepositories(store: StateStore<ControlPlaneBuckets>): Repositories {
  return {
    hosts: store.repository('hosts', HostRecordSchema),
    heartbeats: store.repository('heartbeats', HeartbeatRecordSchema),
    groups: store.shardedRepository('groups', GroupRecordSchema),
    checkpoints: store.repository('checkpoints', CheckpointRecordSchema),
    conversations: store.repository('conversations', ConversationRecordSchema),
    idempotency: store.repository('idempotency', IdempotencyRecordSchema),
    gcLocks: store.repository('gcLocks', GcLockRecordSchema),
  };
}

/** KV keys: ids are validated before they get here; dots (legal in host ids) become `=`. */
export const Keys = {
  host: (hostId: string) => hostId.replaceAll('.', '='),
  group: (groupId: string) => groupId.replaceAll('.', '='),
  /** `<group>/<checkpoint>` so a group's checkpoints list with one filter... KV tokens allow `/`. */
  checkpoint: (groupId: string, checkpointId: string) => `${groupId.replaceAll('.', '=')}.${checkpointId.replaceAll('.', '=')}`,
  checkpointsOf: (groupId: string) => `${groupId.replaceAll('.', '=')}.*`,
  /** Conversation ids may contain `:`; base64url keeps the key in the KV charset and one-to-one. */
  conversation: (conversationId: string) => Buffer.from(conversationId, 'utf8').toString('base64url'),
  /** Idempotency keys are caller-chosen strings: hashed, scoped by operation. */
  idempotency: (operation: string, key: string) => `${operation}.${createHash('sha256').update(key).digest('hex')}`,
} as const;

export type Clock = () => number;

/** What every control-plane service gets. */
export interface ControlPlaneContext {
  readonly config: ControlPlaneConfig;
  readonly repos: Repositories;
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
