// The one writer of group records (R-R2, R-R3): every change to a group — runner turns, starts and
// stops, evacuation marks, migrations, LOST, destroy — goes through `transact` (read, decide, compare-
// and-set, retry on conflict) or `put` (compare-and-set on the revision the caller decided from, the
// turn hot path). What every write must do happens here once: stamp when a group became LOST (the
// retention clock of its layers, R-R6), count LOST sessions (R-R1), and append the change's events
// to the audit log after the write landed.
import { NotFound } from '../core/index.ts';
import type { FleetMetrics } from '../observability/metrics.ts';
import type { Repository } from '../store/sharded-kv-repository.ts';
import type { Versioned } from '../store/kv-repository.ts';
import type { EventRecorder, TransitionEvent } from './events.ts';
import type { GroupRecord } from './records.ts';
import { Keys, type Clock } from './keys.ts';

/** An event about the group being written (subject filled in by the store). */
export type GroupEventRecord = Omit<TransitionEvent, 'subjectKind' | 'subjectId'>;

/** What a decision writes: the new record and the events that say what happened. */
export interface GroupWrite {
  readonly record: GroupRecord;
  readonly events?: readonly GroupEventRecord[];
}

export interface GroupTransaction {
  /** The record the decision was made on (undefined: absent). */
  readonly before: Versioned<GroupRecord> | undefined;
  /** The written record, or undefined when the decision wrote nothing. */
  readonly after: Versioned<GroupRecord> | undefined;
}

export interface GroupStoreDeps {
  readonly repo: Repository<GroupRecord>;
  readonly events: EventRecorder;
  readonly metrics: FleetMetrics;
  readonly now: Clock;
}

/**
 * The lifecycle event of a transition `before → after` of type `type` (`group_<type>`), with the
 * version that makes a repeated step by a new leader re-append the same event id.
 */
export function lifecycleEvent(type: string, before: GroupRecord, after: GroupRecord, why: string, detail: Record<string, unknown> = {}): GroupEventRecord {
  const lc = after.lifecycle;
  return {
    type: `group_${type}`,
    fromState: before.lifecycle.state,
    toState: lc.state,
    reason: lc.lostReason ?? why,
    version: `${lc.generation}:${lc.activityVersion}:${after.stops}:${after.starts}:${lc.state}`,
    detail: { hostId: lc.hostId, generation: lc.generation, why: why.slice(0, 200), ...(lc.migration ? { targetHostId: lc.migration.targetHostId, checkpointId: lc.migration.checkpointId } : {}), ...detail },
  };
}

export class GroupStore {
  constructor(private readonly deps: GroupStoreDeps) {}

  get bucket(): string {
    return this.deps.repo.bucket;
  }

  /** The stored record, read fresh (never from the read model). */
  get(groupId: string): Promise<Versioned<GroupRecord> | undefined> {
    return this.deps.repo.get(Keys.group(groupId));
  }

  async require(groupId: string): Promise<Versioned<GroupRecord>> {
    const g = await this.get(groupId);
    if (g === undefined) throw new NotFound('group_not_found', `group ${groupId} not found`, { details: { groupId } });
    return g;
  }

  /** Create a new group record (CasConflictError if one exists), then append its events. */
  async create(write: GroupWrite): Promise<Versioned<GroupRecord>> {
    const revision = await this.deps.repo.create(Keys.group(write.record.groupId), write.record);
    await this.#appendEvents(write.record.groupId, write.events);
    return { value: write.record, revision };
  }

  /**
   * Read-modify-write with bounded retries on conflict. `decide` may run several times (once per
   * attempt), so it must be free of side effects; it returns undefined to write nothing.
   */
  async transact(groupId: string, decide: (current: GroupRecord | undefined) => GroupWrite | undefined): Promise<GroupTransaction> {
    let before: Versioned<GroupRecord> | undefined;
    let write: GroupWrite | undefined;
    const result = await this.deps.repo.mutate(Keys.group(groupId), (current, revision) => {
      before = current === undefined ? undefined : { value: current, revision };
      write = decide(current);
      return write === undefined ? undefined : this.#stamp(current, write.record);
    });
    if (write === undefined || result === undefined) return { before, after: undefined };
    await this.#committed(before?.value, result.value, write.events);
    return { before, after: result };
  }

  /** Compare-and-set on `expectedRevision` (the caller decided from that version); CasConflictError otherwise. */
  async put(before: GroupRecord, write: GroupWrite, expectedRevision: number): Promise<Versioned<GroupRecord>> {
    const record = this.#stamp(before, write.record);
    const revision = await this.deps.repo.update(Keys.group(record.groupId), record, expectedRevision);
    await this.#committed(before, record, write.events);
    return { value: record, revision };
  }

  /** Every write: a group that becomes LOST carries when, so its layers' retention can run out. */
  #stamp(before: GroupRecord | undefined, after: GroupRecord): GroupRecord {
    const becameLost = after.lifecycle.state === 'LOST' && before?.lifecycle.state !== 'LOST';
    return becameLost ? { ...after, lostAtMs: this.deps.now() } : after;
  }

  async #committed(before: GroupRecord | undefined, after: GroupRecord, events: readonly GroupEventRecord[] | undefined): Promise<void> {
    if (after.lifecycle.state === 'LOST' && before !== undefined && before.lifecycle.state !== 'LOST') {
      // R-R1: LOST is never silent — the metric counts every member session (the event is the caller's).
      this.deps.metrics.lostSessions.inc({ reason: after.lifecycle.lostReason ?? 'operator_declared' }, after.members.length);
    }
    await this.#appendEvents(after.groupId, events);
  }

  /**
   * A write's events are published in their order (each publish is sent before the next starts) and
   * their acknowledgements awaited together: one round trip per write, not one per event. Any failed
   * append fails the call; the caller's retry re-appends the same ids, deduplicated by the log.
   */
  async #appendEvents(groupId: string, events: readonly GroupEventRecord[] | undefined): Promise<void> {
    if (events === undefined || events.length === 0) return;
    await Promise.all(events.map((e) => this.deps.events.record({ ...e, subjectKind: 'group', subjectId: groupId })));
  }
}
