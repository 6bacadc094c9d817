// Spot evacuation inside the notice (R-H5, R-G2, R-G3, R-G6): when a host gets a spot/preemption
// notice (its agent's notice file, or a spot-termination taint on its Node) it becomes DRAINING with
// source spot_preemption. Its groups are then first brought, in parallel (spotEvacuationParallelism)
// and least recently active first, to "stopped cleanly with a checkpoint off the host" — the state
// that survives the host's death — and only then restored elsewhere (the groups queue holds every
// restore until all of the host's groups are saved or the notice ran out; a restore needs nothing
// from the source, so it may follow after the host is gone). The host says how many made it: a
// `spot_evacuation_summary` event at the notice's deadline and once every group is settled, and
// `sandboxfleet_spot_evacuation_groups{host,result}`.
// Leader only, a keyed queue of group ids; the per-host tally is memory (a new leader starts a new
// tally from the groups still on the host). A group counts as saved the moment the read model shows
// it saved, whoever did the work (this queue, or the groups queue evacuating the draining host): the
// queue's own pass over a group can come much later, and a save it did not see before the deadline
// would otherwise be reported after it (or not at all).
import { describeError, isTerminal } from './fleet.ts';
import type { GroupOpsDeps } from './group-ops.ts';
import { spotSaveOrder } from './evacuation-policy.ts';
import { KeyedQueue, type ReconcileResult } from './keyed-queue.ts';
import type { MigrationController } from './migration-controller.ts';
import type { FleetState } from './fleet-state.ts';
import type { GroupRecord, HostRecord } from './records.ts';
import { Keys } from './state.ts';

/** Retry of a group that is waiting (a turn in flight, a checkpoint that failed). */
const RETRY_MS = 250;

interface HostTally {
  readonly hostId: string;
  readonly epoch: number;
  readonly noticedAtMs: number;
  readonly deadlineMs: number;
  readonly groups: Set<string>;
  readonly savedAtMs: Map<string, number>;
  readonly lost: Set<string>;
  timer: NodeJS.Timeout | undefined;
  deadlineReported: boolean;
  finalReported: boolean;
}

/** What the host said about one spot notice (also the event's detail). */
export interface SpotEvacuationSummary {
  readonly hostId: string;
  readonly groups: number;
  readonly savedBeforeDeadline: number;
  readonly savedAfterDeadline: number;
  readonly lost: number;
  readonly pending: number;
  readonly noticedAtMs: number;
  readonly deadlineMs: number;
  /** When the last group was saved (or lost), when all are settled. */
  readonly settledAtMs?: number | undefined;
}

/**
 * What a change of one of a noticed host's groups says (pure but for the read model's checkpoint
 * index): `saved` once it is stopped cleanly with a checkpoint of its state (a latest checkpoint
 * that changed in this very change is one: GroupOps sets it only for the current state), moving
 * (MIGRATING) or off the host; `lost` once LOST; undefined while neither.
 */
export function spotOutcomeOf(before: GroupRecord | undefined, after: GroupRecord, hostId: string, fleet: Pick<FleetState, 'checkpoint'>): 'saved' | 'lost' | undefined {
  const lc = after.lifecycle;
  if (lc.state === 'LOST') return 'lost';
  if (lc.state === 'DESTROYED') return undefined;
  if (lc.state === 'MIGRATING' || lc.hostId !== hostId) return 'saved';
  if (lc.state !== 'STOPPED' || lc.stop?.clean !== true || after.latestCheckpointId === undefined) return undefined;
  if (before?.latestCheckpointId !== after.latestCheckpointId) return 'saved';
  return fleet.checkpoint(Keys.checkpoint(after.groupId, after.latestCheckpointId))?.activityVersion === lc.activityVersion ? 'saved' : undefined;
}

export class SpotEvacuator {
  readonly #queue: KeyedQueue;
  readonly #tallies = new Map<string, HostTally>();
  readonly #hostOf = new Map<string, string>();
  /** The last summary each host reported (kept after the tally ends: the host may be gone by then). */
  readonly #reported = new Map<string, SpotEvacuationSummary>();
  #leading = false;
  #unsubscribe: (() => void) | undefined;

  constructor(private readonly ctx: GroupOpsDeps, private readonly controller: MigrationController) {
    this.#queue = new KeyedQueue((groupId) => {
      ctx.metrics.reconciles.inc({ queue: 'spot', result: 'ok' });
      return this.reconcile(groupId);
    }, {
      concurrency: ctx.config.spotEvacuationParallelism,
      onError: (key, err) => {
        ctx.metrics.reconciles.inc({ queue: 'spot', result: 'error' });
        ctx.logger.warn({ key, queue: 'spot', ...describeError(err) }, 'spot evacuation step failed; retried');
      },
      baseBackoffMs: 200,
      maxBackoffMs: 2_000,
      now: ctx.now,
    });
    controller.spotDeadlineOf = (hostId) => this.#tallies.get(hostId)?.deadlineMs;
  }

  get depth(): number {
    return this.#queue.depth;
  }

  /** This replica leads: tally every host already under a spot notice (the model is synced). */
  startLeading(): void {
    this.#leading = true;
    this.#unsubscribe ??= this.ctx.fleet.onGroupChange((_key, before, after) => this.#groupChanged(before, after));
    this.#queue.start();
    for (const { value: h } of this.ctx.fleet.hosts()) this.hostChanged(undefined, h);
  }

  stopLeading(): void {
    this.#leading = false;
    this.#unsubscribe?.();
    this.#unsubscribe = undefined;
    this.#queue.stop();
    for (const t of this.#tallies.values()) if (t.timer) clearTimeout(t.timer);
    this.#tallies.clear();
    this.#hostOf.clear();
  }

  whenIdle(): Promise<void> {
    return this.#queue.whenIdle();
  }

  /** The summary of a host's current spot notice (tests, benchmarks), if one is being tallied. */
  summaryOf(hostId: string): SpotEvacuationSummary | undefined {
    const t = this.#tallies.get(hostId);
    return t === undefined ? this.#reported.get(hostId) : this.#summary(t);
  }

  /** A host change from the read model: a host that starts draining for a spot notice is evacuated. */
  hostChanged(before: HostRecord | undefined, after: HostRecord | undefined): void {
    if (!this.#leading || after === undefined) return;
    const spot = after.lifecycle.state === 'DRAINING' && after.lifecycle.goingAway === 'spot_preemption';
    const known = this.#tallies.get(after.hostId);
    if (!spot) {
      // Gone (DEAD/REMOVED) or back: report what made it, once, and stop tallying.
      if (known !== undefined) {
        this.#report(known, 'deadline');
        this.#report(known, 'final');
        if (known.timer) clearTimeout(known.timer);
        this.#tallies.delete(after.hostId);
      }
      return;
    }
    if (known !== undefined && known.epoch === after.lifecycle.epoch) return;
    const now = this.ctx.now();
    // The notice's start: when this leader first sees the drain (a notice is applied within a heartbeat).
    const noticedAtMs = before === undefined ? Math.min(now, after.updatedAtMs) : now;
    const tally: HostTally = {
      hostId: after.hostId, epoch: after.lifecycle.epoch, noticedAtMs, deadlineMs: noticedAtMs + this.ctx.config.spotNoticeMs,
      groups: new Set(), savedAtMs: new Map(), lost: new Set(), timer: undefined, deadlineReported: false, finalReported: false,
    };
    this.#tallies.set(after.hostId, tally);
    const live = [...this.ctx.fleet.groupKeysOnHost(after.hostId)]
      .map((k) => this.ctx.fleet.group(k)?.value)
      .filter((g) => g !== undefined && !isTerminal(g) && g.lifecycle.hostId === after.hostId)
      .map((g) => ({ groupId: g!.groupId, lastActivityAtMs: g!.lifecycle.lastActivityAtMs }));
    // Least recently active first: the queue takes keys in the order they are added.
    for (const g of spotSaveOrder(live)) {
      tally.groups.add(g.groupId);
      this.#hostOf.set(g.groupId, after.hostId);
      this.#queue.add(g.groupId);
    }
    this.ctx.logger.info({ hostId: after.hostId, groups: tally.groups.size, deadlineMs: tally.deadlineMs }, 'spot notice: saving every group before the deadline');
    tally.timer = setTimeout(() => this.#report(tally, 'deadline'), Math.max(0, tally.deadlineMs - now));
    tally.timer.unref?.();
    this.#gauge(tally);
    if (tally.groups.size === 0) this.#report(tally, 'final');
  }

  /** A group of a noticed host changed: tally it saved (or lost) now if it is. */
  #groupChanged(before: GroupRecord | undefined, after: GroupRecord | undefined): void {
    if (after === undefined) return;
    const hostId = this.#hostOf.get(after.groupId);
    const tally = hostId === undefined ? undefined : this.#tallies.get(hostId);
    if (tally === undefined || !tally.groups.has(after.groupId) || tally.savedAtMs.has(after.groupId) || tally.lost.has(after.groupId)) return;
    const outcome = spotOutcomeOf(before, after, tally.hostId, this.ctx.fleet);
    if (outcome === undefined) return;
    if (outcome === 'saved') tally.savedAtMs.set(after.groupId, this.ctx.now());
    else tally.lost.add(after.groupId);
    this.#gauge(tally);
    if (tally.savedAtMs.size + tally.lost.size >= tally.groups.size) this.#report(tally, 'final');
  }

  async reconcile(groupId: string): Promise<ReconcileResult> {
    const hostId = this.#hostOf.get(groupId);
    const tally = hostId === undefined ? undefined : this.#tallies.get(hostId);
    if (tally === undefined) return {};
    const r = await this.controller.saveBeforeDeparture(groupId);
    const now = this.ctx.now();
    switch (r) {
      case 'saved':
        if (!tally.savedAtMs.has(groupId)) tally.savedAtMs.set(groupId, now);
        break;
      case 'lost':
        if (!tally.savedAtMs.has(groupId)) tally.lost.add(groupId);
        break;
      case 'none': {
        // Moved off the host, or nothing to evacuate: saved if it is somewhere safe, else lost.
        const g = this.ctx.fleet.group(Keys.group(groupId))?.value;
        if (g !== undefined && g.lifecycle.state === 'LOST') tally.lost.add(groupId);
        else if (!tally.savedAtMs.has(groupId)) tally.savedAtMs.set(groupId, now);
        break;
      }
      case 'waiting':
      case 'busy':
        return { requeueAfterMs: RETRY_MS };
    }
    this.#gauge(tally);
    if (tally.savedAtMs.size + tally.lost.size >= tally.groups.size) this.#report(tally, 'final');
    return {};
  }

  #summary(t: HostTally): SpotEvacuationSummary {
    let before = 0;
    let after = 0;
    let last = 0;
    for (const at of t.savedAtMs.values()) {
      if (at <= t.deadlineMs) before += 1;
      else after += 1;
      last = Math.max(last, at);
    }
    const pending = t.groups.size - t.savedAtMs.size - t.lost.size;
    return {
      hostId: t.hostId, groups: t.groups.size, savedBeforeDeadline: before, savedAfterDeadline: after, lost: t.lost.size, pending,
      noticedAtMs: t.noticedAtMs, deadlineMs: t.deadlineMs, ...(pending === 0 ? { settledAtMs: last } : {}),
    };
  }

  #gauge(t: HostTally): void {
    const s = this.#summary(t);
    const m = this.ctx.metrics.spotEvacuation;
    m.set({ host: t.hostId, result: 'saved_before_deadline' }, s.savedBeforeDeadline);
    m.set({ host: t.hostId, result: 'saved_after_deadline' }, s.savedAfterDeadline);
    m.set({ host: t.hostId, result: 'lost' }, s.lost);
    m.set({ host: t.hostId, result: 'pending' }, s.pending);
  }

  /** The host says how many made it: at the deadline, and once all are settled. */
  #report(t: HostTally, when: 'deadline' | 'final'): void {
    if (when === 'deadline' ? t.deadlineReported : t.finalReported) return;
    if (when === 'deadline') t.deadlineReported = true;
    else t.finalReported = true;
    const s = this.#summary(t);
    this.#gauge(t);
    this.#reported.delete(t.hostId);
    this.#reported.set(t.hostId, s);
    if (this.#reported.size > 256) this.#reported.delete(this.#reported.keys().next().value as string);
    this.ctx.logger.info({ ...s, when }, 'spot evacuation summary');
    void this.ctx.events.record({
      subjectKind: 'host', subjectId: t.hostId, type: 'spot_evacuation_summary', reason: 'spot_preemption',
      version: `${t.epoch}:${when}`,
      detail: { when, ...s },
    }).catch((err: unknown) => this.ctx.logger.warn({ hostId: t.hostId, ...describeError(err) }, 'recording the spot evacuation summary failed'));
  }
}
