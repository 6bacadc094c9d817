// The control plane's read model of the fleet (R-R7), one per replica: hosts, groups and the
// checkpoint index mirrored from their KV buckets by watches (the informer shape: list once through
// the watch's initial values, then follow every change), the latest heartbeat of every host kept in
// memory only, and the indexes decisions need (groups by host, groups with controller work, member
// load per host, counts by state). Nothing in a control loop lists a bucket: loops read this model and
// react to its change notifications; every WRITE still re-reads its record and compare-and-sets
// (group-store.ts, host-store.ts), so a decision is never applied on a stale copy.
//
// Completeness: each mirrored bucket is a stream; `sync()` reads every stream's last sequence and
// waits (bounded) until the watch has applied it, so "the model has seen every write made before
// this call" is checked against the store, not assumed. A watch that ends (a server gone for good, a
// consumer deleted) is restarted; the new watch delivers every key's last message again, a delete
// marker included, so a key leaves the model only on its own delete marker — never because a
// restarted watch has not re-delivered it yet (a record seen as deleted would read as a group or host
// gone, and a host's in-memory heartbeat with it). No mirrored bucket purges markers or ages values
// out. A periodic check restarts a watch that delivers nothing while its stream moved on. Records
// that fail validation are kept aside as invalid (counted, logged, invalid groups indexed by the
// hosts their last valid version named) — never read as "absent". Change listeners are called on a
// copy of the listener list, each in its own try/catch: one that unsubscribes or throws never keeps
// the others from hearing a change, and never stops the watch.
import type { FleetMetrics } from '../observability/metrics.ts';
import type { Logger } from '../observability/logger.ts';
import type { KvChange, KvRepository, Versioned } from '../store/kv-repository.ts';
import { shardIndex } from '../store/sharded-kv-repository.ts';
import { restorableFromCheckpoint, Unavailable, usableCheckpointTakenAt } from '../core/index.ts';
import { Keys } from './keys.ts';
import type { CheckpointRecord, GroupRecord, HeartbeatRecord, HostRecord } from './records.ts';

type Listener<T> = (key: string, before: T | undefined, after: T | undefined) => void;

/** How often a watch's progress is checked against its stream (a stuck watch is restarted). */
const REVISION_CHECK_MS = 30_000;
/** Default bound of sync(): a caller never waits forever on a watch that stopped. */
export const DEFAULT_SYNC_TIMEOUT_MS = 30_000;

/** sync() did not see the model catch up within its bound (watches stall while NATS restarts): retry. */
export class ReadModelBehindError extends Unavailable {
  constructor(readonly bucket: string, readonly timeoutMs: number) {
    super('store_unavailable', `read model of ${bucket} not caught up within ${timeoutMs} ms`, { details: { bucket, timeoutMs } });
    this.name = 'ReadModelBehindError';
  }
}

/**
 * One KV bucket (one stream) mirrored into a Map by a watch. `seen` is the highest revision applied;
 * `sync()` waits until it reaches the stream's last sequence as read at the call.
 */
interface Waiter {
  readonly revision: number;
  readonly resolve: () => void;
  readonly reject: (e: unknown) => void;
}

class BucketMirror<T> {
  readonly entries = new Map<string, Versioned<T>>();
  readonly invalid = new Map<string, string>();
  #seen = 0;
  #waiters: Waiter[] = [];
  #abort: AbortController | undefined;
  #stopped = false;
  #restarts = 0;
  /** Changes delivered by the current watch (the stall check's measure of progress). */
  #delivered = 0;
  #stalledChecks = 0;
  #lastCheckedDelivered = 0;

  constructor(
    readonly repo: KvRepository<T>,
    private readonly apply: (key: string, before: Versioned<T> | undefined, after: Versioned<T> | undefined) => void,
    private readonly logger: Logger,
    private readonly project: (value: T) => T,
    /** Called when `key` becomes invalid (with its last valid value, if any) or stops being invalid. */
    private readonly invalidChanged: (key: string, invalid: boolean, lastValid: T | undefined) => void = () => undefined,
  ) {}

  get seen(): number {
    return this.#seen;
  }

  get restarts(): number {
    return this.#restarts;
  }

  start(): void {
    this.#stopped = false;
    void this.#follow();
  }

  stop(): void {
    this.#stopped = true;
    this.#abort?.abort();
    for (const w of this.#waiters.splice(0)) w.reject(new Error(`${this.repo.bucket}: read model stopped`));
  }

  /**
   * Resolves once every write made to the bucket before this call has been applied; rejects with
   * ReadModelBehindError after `timeoutMs` (the waiter is dropped).
   */
  async sync(timeoutMs: number): Promise<void> {
    const target = await this.repo.lastRevision();
    if (this.#seen >= target) return;
    await new Promise<void>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const waiter: Waiter = {
        revision: target,
        resolve: () => { clearTimeout(timer); resolve(); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      };
      this.#waiters.push(waiter);
      if (Number.isFinite(timeoutMs)) {
        timer = setTimeout(() => {
          this.#waiters = this.#waiters.filter((w) => w !== waiter);
          reject(new ReadModelBehindError(this.repo.bucket, timeoutMs));
        }, timeoutMs);
        timer.unref?.();
      }
    });
  }

  /**
   * Restart the watch when the stream is ahead of the model and the watch delivered nothing since
   * the last check, twice in a row. Progress is what the watch delivers, not the highest revision:
   * a restarted watch re-delivering a large bucket moves no revision forward while it catches up.
   */
  async checkProgress(): Promise<number> {
    const last = await this.repo.lastRevision();
    const lag = Math.max(0, last - this.#seen);
    if (lag > 0 && this.#delivered === this.#lastCheckedDelivered) this.#stalledChecks += 1;
    else this.#stalledChecks = 0;
    this.#lastCheckedDelivered = this.#delivered;
    if (this.#stalledChecks >= 2) {
      this.logger.warn({ bucket: this.repo.bucket, seen: this.#seen, last }, 'read model watch stopped advancing: restarting it');
      this.#abort?.abort();
    }
    return lag;
  }

  async #follow(): Promise<void> {
    while (!this.#stopped) {
      const abort = new AbortController();
      this.#abort = abort;
      // A new watch starts with a clean stall record: its catch-up is judged on its own deliveries.
      this.#stalledChecks = 0;
      this.#lastCheckedDelivered = this.#delivered;
      try {
        // The watch first delivers the last message of every key (values and delete markers), then
        // every change. Each is applied as it comes; nothing is inferred from a key not (yet) seen.
        for await (const change of this.repo.watch({ signal: abort.signal })) {
          this.#delivered += 1;
          this.#applyChange(change);
        }
      } catch (err) {
        if (!this.#stopped) this.logger.warn({ err, bucket: this.repo.bucket }, 'read model watch failed: restarting it');
      }
      if (this.#stopped) return;
      this.#restarts += 1;
      await new Promise((r) => setTimeout(r, Math.min(5_000, 100 * 2 ** Math.min(this.#restarts, 6))).unref?.());
    }
  }

  #applyChange(change: KvChange<T>): void {
    if (change.revision <= this.#seen && this.entries.get(change.key)?.revision === change.revision) return;
    const before = this.entries.get(change.key);
    if (change.op === 'put') {
      const after = { value: this.project(change.value), revision: change.revision };
      this.entries.set(change.key, after);
      if (this.invalid.delete(change.key)) this.invalidChanged(change.key, false, undefined);
      this.apply(change.key, before, after);
    } else {
      this.entries.delete(change.key);
      if (change.op === 'invalid') {
        this.invalid.set(change.key, change.error.message.slice(0, 256));
        this.invalidChanged(change.key, true, before?.value);
        this.logger.error({ bucket: this.repo.bucket, key: change.key, revision: change.revision, err: change.error.message }, 'invalid record in the store: kept aside, never read as absent');
      } else if (this.invalid.delete(change.key)) {
        this.invalidChanged(change.key, false, undefined);
      }
      if (before !== undefined) this.apply(change.key, before, undefined);
    }
    if (change.revision > this.#seen) this.#seen = change.revision;
    if (this.#waiters.length > 0) {
      const ready = this.#waiters.filter((w) => w.revision <= this.#seen);
      this.#waiters = this.#waiters.filter((w) => w.revision > this.#seen);
      for (const w of ready) w.resolve();
    }
  }
}

/** Members each host holds or is about to hold, counted from group records (placement's view). */
function loadOf(g: GroupRecord): [string, number][] {
  if (isTerminal(g)) return [];
  const out: [string, number][] = [[g.lifecycle.hostId, g.members.length]];
  if (g.lifecycle.migration) out.push([g.lifecycle.migration.targetHostId, g.members.length]);
  return out;
}

/** The checkpoint ids a group record pins (never deleted by retention while it does). */
function pinnedBy(g: GroupRecord): string[] {
  const out: string[] = [];
  if (g.latestCheckpointId !== undefined) out.push(g.latestCheckpointId);
  if (g.lifecycle.migration !== undefined) out.push(g.lifecycle.migration.checkpointId);
  return out;
}

export function isTerminal(g: GroupRecord): boolean {
  return g.lifecycle.state === 'LOST' || g.lifecycle.state === 'DESTROYED';
}

/** Whether the migration controller has work on the group: an evacuation mark or a migration. */
export function hasControllerWork(g: GroupRecord): boolean {
  return g.evacuation !== undefined || g.lifecycle.state === 'MIGRATING';
}

/**
 * The read model keeps no turn-call idempotency state (the runner backend reads that from the
 * store in the same compare-and-set it writes it with): at 100,000 groups it would be most of the
 * model's memory, and no control loop reads it. The control plane's group watches already read
 * through GroupReadModelSchema, which leaves it out (and does not validate it: the writers do,
 * reading through GroupRecordSchema); this keeps it out whatever repository the model is given.
 */
function projectGroup(g: GroupRecord): GroupRecord {
  if (!g.members.some((m) => m.calls !== undefined || m.turns !== undefined)) return g;
  return { ...g, members: g.members.map(({ calls: _calls, turns: _turns, ...m }) => m) };
}

export interface FleetStateSources {
  readonly hosts: KvRepository<HostRecord>;
  /** Every physical bucket of the (sharded) groups repository. */
  readonly groups: readonly KvRepository<GroupRecord>[];
  readonly checkpoints: KvRepository<CheckpointRecord>;
}

export class FleetState {
  readonly #hosts: BucketMirror<HostRecord>;
  readonly #groups: BucketMirror<GroupRecord>[];
  readonly #checkpoints: BucketMirror<CheckpointRecord>;
  readonly #heartbeats = new Map<string, HeartbeatRecord>();
  /** Group keys per host id: groups placed there and groups migrating there. */
  readonly #groupsByHost = new Map<string, Set<string>>();
  readonly #withWork = new Set<string>();
  readonly #load = new Map<string, number>();
  readonly #groupStates = new Map<string, number>();
  readonly #hostStates = new Map<string, number>();
  /** Checkpoint keys per group key (checkpoint keys are `<group key>.<checkpoint key>`). */
  readonly #checkpointsByGroup = new Map<string, Set<string>>();
  /**
   * Per clean-STOPPED group key (the groups a checkpoint can save, R-G6): when its usable latest
   * checkpoint was taken, or null when it has none. Kept on every group and checkpoint change so the
   * retention pass reads exposure and refresh candidates without rebuilding maps over the fleet.
   */
  readonly #restorable = new Map<string, number | null>();
  /** How many group records pin each checkpoint id (named as latest, or a migration's source). */
  readonly #pinned = new Map<string, number>();
  /**
   * Group keys whose checkpoints retention may have to delete: more than `checkpointKeep` of them,
   * or a terminal group record (destroyed, or LOST whose retention may have passed). A group with
   * fewer checkpoints, or whose record the model does not hold, has none to delete.
   */
  readonly #cleanupCandidates = new Set<string>();
  readonly #checkpointKeep: number;
  /**
   * True during start()'s first load: the retention indexes are built once at its end (one walk over
   * the groups) instead of on every group and checkpoint as they arrive (bench/scale: catch-up).
   */
  #loading = false;
  /** Invalid group keys per host their last valid version named (placement or migration target). */
  readonly #invalidGroupsByHost = new Map<string, Set<string>>();
  /** The hosts each invalid group key is indexed under (empty: never seen valid, host unknown). */
  readonly #invalidGroupHosts = new Map<string, readonly string[]>();
  /** Invalid group keys never seen valid: any host may hold them. */
  readonly #unattributedInvalidGroups = new Set<string>();
  readonly #groupListeners: Listener<GroupRecord>[] = [];
  readonly #hostListeners: Listener<HostRecord>[] = [];
  #timer: NodeJS.Timeout | undefined;
  readonly #revisionCheckMs: number;

  /**
   * `checkpointKeep` is retention's per-group keep count (the candidate threshold; a smaller one only
   * makes more groups candidates).
   */
  constructor(sources: FleetStateSources, private readonly logger: Logger, private readonly metrics?: FleetMetrics, opts: { readonly revisionCheckMs?: number; readonly checkpointKeep?: number } = {}) {
    this.#revisionCheckMs = opts.revisionCheckMs ?? REVISION_CHECK_MS;
    this.#checkpointKeep = Math.max(1, Math.floor(opts.checkpointKeep ?? 1));
    this.#hosts = new BucketMirror(sources.hosts, (k, b, a) => this.#hostChanged(k, b?.value, a?.value), logger, (h) => h);
    this.#groups = sources.groups.map((repo) => new BucketMirror(repo, (k, b, a) => this.#groupChanged(k, b?.value, a?.value), logger, projectGroup,
      (k, invalid, lastValid) => this.#groupInvalidChanged(k, invalid, lastValid)));
    this.#checkpoints = new BucketMirror(sources.checkpoints, (k, b, a) => this.#checkpointChanged(k, b?.value, a?.value), logger, (c) => c);
  }

  #mirrors(): BucketMirror<unknown>[] {
    return [this.#hosts, ...this.#groups, this.#checkpoints] as BucketMirror<unknown>[];
  }

  /** Start following the buckets; resolves when the model holds everything the store held at start. */
  async start(): Promise<void> {
    this.#loading = true;
    try {
      for (const m of this.#mirrors()) m.start();
      this.#timer = setInterval(() => void this.#checkProgress(), this.#revisionCheckMs);
      this.#timer.unref?.();
      // Starting up waits as long as catching up takes (the replica is not ready before).
      await this.sync({ timeoutMs: Infinity });
    } finally {
      // Synchronously (no change can be applied in between), then every change keeps them current.
      this.#loading = false;
      this.#rebuildRetentionIndexes();
    }
  }

  #rebuildRetentionIndexes(): void {
    this.#restorable.clear();
    this.#cleanupCandidates.clear();
    for (const m of this.#groups) for (const [key, g] of m.entries) this.#reindexCheckpointsOf(key, g.value);
    // Checkpoints of groups the model does not hold (they may be candidates by their count).
    for (const key of this.#checkpointsByGroup.keys()) if (this.group(key) === undefined) this.#reindexCheckpointsOf(key, undefined);
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    for (const m of this.#mirrors()) m.stop();
  }

  /**
   * Resolves once every write made to the mirrored buckets before this call is in the model; rejects
   * with ReadModelBehindError when that takes longer than `timeoutMs` (default 30 s), so no caller —
   * the leader's pass above all — waits forever on a watch that stopped.
   */
  async sync(opts: { timeoutMs?: number } = {}): Promise<void> {
    const timeoutMs = opts.timeoutMs ?? DEFAULT_SYNC_TIMEOUT_MS;
    await Promise.all(this.#mirrors().map((m) => m.sync(timeoutMs)));
  }

  async #checkProgress(): Promise<void> {
    try {
      const lags = await Promise.all(this.#mirrors().map((m) => m.checkProgress()));
      this.metrics?.readModelLag.set(lags.reduce((a, b) => a + b, 0));
    } catch (err) {
      this.logger.warn({ err }, 'read model revision check failed');
    }
  }

  // ---- notifications ----------------------------------------------------------------------------

  /**
   * Call every listener on a copy of the list (one that unsubscribes during the call does not make
   * the next one skipped), each isolated: a throwing listener is logged and counted, the others
   * still hear the change, and the watch goes on.
   */
  #notify<T>(kind: string, listeners: readonly Listener<T>[], key: string, before: T | undefined, after: T | undefined): void {
    for (const fn of [...listeners]) {
      try {
        fn(key, before, after);
      } catch (err) {
        this.metrics?.reconciles.inc({ queue: 'read_model_listener', result: 'error' });
        this.logger.error({ err, kind, key }, 'read model change listener failed');
      }
    }
  }

  /** Call `fn` on every group change; returns the function that stops it. */
  onGroupChange(fn: Listener<GroupRecord>): () => void {
    this.#groupListeners.push(fn);
    return () => {
      const i = this.#groupListeners.indexOf(fn);
      if (i >= 0) this.#groupListeners.splice(i, 1);
    };
  }

  /** Call `fn` on every host change; returns the function that stops it. */
  onHostChange(fn: Listener<HostRecord>): () => void {
    this.#hostListeners.push(fn);
    return () => {
      const i = this.#hostListeners.indexOf(fn);
      if (i >= 0) this.#hostListeners.splice(i, 1);
    };
  }

  // ---- hosts ------------------------------------------------------------------------------------

  host(hostKey: string): Versioned<HostRecord> | undefined {
    return this.#hosts.entries.get(hostKey);
  }

  hosts(): IterableIterator<Versioned<HostRecord>> {
    return this.#hosts.entries.values();
  }

  hostKeys(): IterableIterator<string> {
    return this.#hosts.entries.keys();
  }

  hostCountsByState(): ReadonlyMap<string, number> {
    return this.#hostStates;
  }

  /** The latest accepted heartbeat of the host (memory only; each replica receives every heartbeat). */
  heartbeat(hostId: string): HeartbeatRecord | undefined {
    return this.#heartbeats.get(hostId);
  }

  /** Keep `hb` unless an equal or newer beat of the same epoch is already held. */
  recordHeartbeat(hb: HeartbeatRecord): 'accepted' | 'stale' {
    const current = this.#heartbeats.get(hb.hostId);
    if (current !== undefined && current.epoch === hb.epoch && current.sequence >= hb.sequence) return 'stale';
    if (current !== undefined && current.epoch > hb.epoch) return 'stale';
    this.#heartbeats.set(hb.hostId, hb);
    return 'accepted';
  }

  forgetHeartbeat(hostId: string): void {
    this.#heartbeats.delete(hostId);
  }

  #hostChanged(key: string, before: HostRecord | undefined, after: HostRecord | undefined): void {
    if (before !== undefined) this.#hostStates.set(before.lifecycle.state, (this.#hostStates.get(before.lifecycle.state) ?? 1) - 1);
    if (after !== undefined) this.#hostStates.set(after.lifecycle.state, (this.#hostStates.get(after.lifecycle.state) ?? 0) + 1);
    // Only a delete marker gets here with no `after` (a watch restart drops nothing): the host
    // record is gone, and its heartbeat with it.
    else if (before !== undefined) this.#heartbeats.delete(before.hostId);
    this.#notify('host', this.#hostListeners, key, before, after);
  }

  // ---- groups -----------------------------------------------------------------------------------

  group(groupKey: string): Versioned<GroupRecord> | undefined {
    return this.#groupMirror(groupKey).entries.get(groupKey);
  }

  /** True when the stored record under `groupKey` exists but failed validation. */
  groupInvalid(groupKey: string): boolean {
    return this.#groupMirror(groupKey).invalid.has(groupKey);
  }

  #groupMirror(groupKey: string): BucketMirror<GroupRecord> {
    // The same shard function the repository writes with.
    return this.#groups[shardIndex(groupKey, this.#groups.length)]!;
  }

  *groups(): IterableIterator<Versioned<GroupRecord>> {
    for (const m of this.#groups) yield* m.entries.values();
  }

  groupCount(): number {
    return this.#groups.reduce((n, m) => n + m.entries.size, 0);
  }

  invalidGroupCount(): number {
    return this.#groups.reduce((n, m) => n + m.invalid.size, 0);
  }

  /** Keys of the groups placed on, or migrating to, `hostId`. */
  groupKeysOnHost(hostId: string): ReadonlySet<string> {
    return this.#groupsByHost.get(hostId) ?? EMPTY;
  }

  /** Keys of the groups with an evacuation mark or a migration in progress. */
  groupKeysWithWork(): ReadonlySet<string> {
    return this.#withWork;
  }

  /** Members placed on, or migrating to, each host (non-terminal groups). */
  memberLoad(hostId: string): number {
    return this.#load.get(hostId) ?? 0;
  }

  groupCountsByState(): ReadonlyMap<string, number> {
    return this.#groupStates;
  }

  #groupChanged(key: string, before: GroupRecord | undefined, after: GroupRecord | undefined): void {
    if (before !== undefined) {
      for (const [h, n] of loadOf(before)) this.#load.set(h, (this.#load.get(h) ?? n) - n);
      for (const h of [before.lifecycle.hostId, before.lifecycle.migration?.targetHostId]) if (h !== undefined) this.#groupsByHost.get(h)?.delete(key);
      this.#groupStates.set(before.lifecycle.state, (this.#groupStates.get(before.lifecycle.state) ?? 1) - 1);
      for (const id of pinnedBy(before)) {
        const n = (this.#pinned.get(id) ?? 1) - 1;
        if (n > 0) this.#pinned.set(id, n);
        else this.#pinned.delete(id);
      }
    }
    if (after !== undefined) {
      for (const id of pinnedBy(after)) this.#pinned.set(id, (this.#pinned.get(id) ?? 0) + 1);
      for (const [h, n] of loadOf(after)) this.#load.set(h, (this.#load.get(h) ?? 0) + n);
      if (!isTerminal(after)) {
        for (const h of [after.lifecycle.hostId, after.lifecycle.migration?.targetHostId]) {
          if (h === undefined) continue;
          let set = this.#groupsByHost.get(h);
          if (set === undefined) this.#groupsByHost.set(h, (set = new Set()));
          set.add(key);
        }
      }
      this.#groupStates.set(after.lifecycle.state, (this.#groupStates.get(after.lifecycle.state) ?? 0) + 1);
      if (hasControllerWork(after)) this.#withWork.add(key);
      else this.#withWork.delete(key);
    } else {
      this.#withWork.delete(key);
    }
    this.#reindexCheckpointsOf(key, after);
    this.#notify('group', this.#groupListeners, key, before, after);
  }

  /** Keys of groups whose stored record fails validation and whose last valid version named `hostId`. */
  invalidGroupKeysOnHost(hostId: string): ReadonlySet<string> {
    return this.#invalidGroupsByHost.get(hostId) ?? EMPTY;
  }

  /** Keys of invalid group records never seen valid here: the host they belong to is unknown. */
  unattributedInvalidGroupKeys(): ReadonlySet<string> {
    return this.#unattributedInvalidGroups;
  }

  #groupInvalidChanged(key: string, invalid: boolean, lastValid: GroupRecord | undefined): void {
    const previous = this.#invalidGroupHosts.get(key);
    if (previous !== undefined) {
      for (const h of previous) {
        const set = this.#invalidGroupsByHost.get(h);
        set?.delete(key);
        if (set?.size === 0) this.#invalidGroupsByHost.delete(h);
      }
      this.#unattributedInvalidGroups.delete(key);
      this.#invalidGroupHosts.delete(key);
    }
    if (!invalid) return;
    // An invalid record replacing another invalid one keeps the attribution of the last valid one.
    const hosts = lastValid !== undefined
      ? [lastValid.lifecycle.hostId, ...(lastValid.lifecycle.migration !== undefined ? [lastValid.lifecycle.migration.targetHostId] : [])]
      : previous ?? [];
    this.#invalidGroupHosts.set(key, hosts);
    if (hosts.length === 0) this.#unattributedInvalidGroups.add(key);
    for (const h of hosts) {
      let set = this.#invalidGroupsByHost.get(h);
      if (set === undefined) this.#invalidGroupsByHost.set(h, (set = new Set()));
      set.add(key);
    }
  }

  // ---- checkpoints ------------------------------------------------------------------------------

  checkpoint(checkpointKey: string): CheckpointRecord | undefined {
    return this.#checkpoints.entries.get(checkpointKey)?.value;
  }

  /** The indexed checkpoints of the group stored under `groupKey`. */
  checkpointsOf(groupKey: string): CheckpointRecord[] {
    const keys = this.#checkpointsByGroup.get(groupKey);
    if (keys === undefined) return [];
    return [...keys].flatMap((k) => {
      const c = this.#checkpoints.entries.get(k);
      return c === undefined ? [] : [c.value];
    });
  }

  *checkpoints(): IterableIterator<{ readonly key: string; readonly record: CheckpointRecord }> {
    for (const [key, v] of this.#checkpoints.entries) yield { key, record: v.value };
  }

  checkpointCount(): number {
    return this.#checkpoints.entries.size;
  }

  invalidCheckpointCount(): number {
    return this.#checkpoints.invalid.size;
  }

  #checkpointChanged(key: string, _before: CheckpointRecord | undefined, after: CheckpointRecord | undefined): void {
    const groupKey = key.slice(0, key.indexOf('.'));
    let set = this.#checkpointsByGroup.get(groupKey);
    if (after !== undefined) {
      if (set === undefined) this.#checkpointsByGroup.set(groupKey, (set = new Set()));
      set.add(key);
    } else if (set !== undefined) {
      set.delete(key);
      if (set.size === 0) this.#checkpointsByGroup.delete(groupKey);
    }
    if (!this.#loading) this.#reindexCheckpointsOf(groupKey, this.group(groupKey)?.value);
  }

  /** Update the retention indexes of the group under `groupKey` (its record `g`, if the model holds one). */
  #reindexCheckpointsOf(groupKey: string, g: GroupRecord | undefined): void {
    if (this.#loading) return;
    if (g !== undefined && restorableFromCheckpoint(g.lifecycle)) {
      const latest = g.latestCheckpointId === undefined ? undefined : this.#checkpoints.entries.get(Keys.checkpoint(g.groupId, g.latestCheckpointId))?.value;
      this.#restorable.set(groupKey, usableCheckpointTakenAt(g.lifecycle, latest) ?? null);
    } else {
      this.#restorable.delete(groupKey);
    }
    const n = this.#checkpointsByGroup.get(groupKey)?.size ?? 0;
    if (n > 0 && (n > this.#checkpointKeep || (g !== undefined && isTerminal(g)))) this.#cleanupCandidates.add(groupKey);
    else this.#cleanupCandidates.delete(groupKey);
  }

  /**
   * Per clean-STOPPED group key: when the usable checkpoint a host loss would restore it from was
   * taken, or null when it has none (kept current on every change; retention reads it per pass).
   */
  restorableCheckpoints(): ReadonlyMap<string, number | null> {
    return this.#restorable;
  }

  /** Group keys that may have checkpoints for retention to delete (see #cleanupCandidates). */
  cleanupCandidateGroupKeys(): ReadonlySet<string> {
    return this.#cleanupCandidates;
  }

  /** The indexed checkpoints stored under group key `groupKey`, with their keys. */
  checkpointEntriesOf(groupKey: string): { readonly key: string; readonly record: CheckpointRecord }[] {
    const keys = this.#checkpointsByGroup.get(groupKey);
    if (keys === undefined) return [];
    return [...keys].flatMap((key) => {
      const c = this.#checkpoints.entries.get(key);
      return c === undefined ? [] : [{ key, record: c.value }];
    });
  }

  /** True when a group record in the model names `checkpointId` as its latest or a migration's source. */
  checkpointPinned(checkpointId: string): boolean {
    return this.#pinned.has(checkpointId);
  }

  /** Watch restarts so far, over every mirrored bucket (a test and an operator signal). */
  get watchRestarts(): number {
    return this.#mirrors().reduce((n, m) => n + m.restarts, 0);
  }
}

const EMPTY: ReadonlySet<string> = new Set();
