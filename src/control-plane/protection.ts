// Unprotected groups, visible (R-G6, R-I3): a group survives the loss of its host only when it was
// stopped cleanly and has a checkpoint of its state; every other live group (running, stopping,
// pending, stopped unclean or without such a checkpoint) would be LOST. This index follows the read
// model's group changes (incrementally, on every replica) and keeps, per unprotected group, its host
// and since when it is exposed (core `protection`); scrapes read a per-host summary from it
// (count, how many for longer than the alert age, the oldest exposure). A clean stop whose checkpoint
// the model has not seen yet is re-judged at the next scrape, so its checkpoint's arrival (another
// watch) needs no notification.
import { protection, type Protection } from '../core/idle-stop.ts';
import type { UnprotectedHostSummary } from '../observability/metrics.ts';
import type { FleetState } from './fleet-state.ts';
import type { GroupRecord } from './records.ts';
import { Keys } from './state.ts';

interface Exposed {
  readonly hostId: string;
  readonly sinceMs: number;
  /** Clean stop with a latest checkpoint the model did not have yet: judged again when read. */
  readonly recheck?: GroupRecord | undefined;
}

export class ProtectionIndex {
  readonly #exposed = new Map<string, Exposed>();
  readonly #unsubscribe: () => void;

  constructor(private readonly fleet: FleetState) {
    this.#unsubscribe = fleet.onGroupChange((_key, before, after) => {
      if (after === undefined) {
        if (before !== undefined) this.#exposed.delete(before.groupId);
        return;
      }
      this.#judge(after);
    });
  }

  close(): void {
    this.#unsubscribe();
  }

  /** Core's verdict on `g` with the checkpoint the read model holds for it. */
  protectionOf(g: GroupRecord): Protection {
    const lc = g.lifecycle;
    const latest = g.latestCheckpointId === undefined ? undefined : this.fleet.checkpoint(Keys.checkpoint(g.groupId, g.latestCheckpointId));
    return protection({
      state: lc.state,
      stopClean: lc.stop?.clean,
      activityVersion: lc.activityVersion,
      lastActivityAtMs: lc.lastActivityAtMs,
      runningSinceMs: lc.runningSinceMs,
      createdAtMs: g.createdAtMs,
      checkpointActivityVersion: latest?.activityVersion,
    });
  }

  #judge(g: GroupRecord): void {
    const p = this.protectionOf(g);
    if (p.protected !== false) {
      this.#exposed.delete(g.groupId);
      return;
    }
    const waitingForCheckpoint = g.lifecycle.state === 'STOPPED' && g.lifecycle.stop?.clean === true && g.latestCheckpointId !== undefined;
    this.#exposed.set(g.groupId, { hostId: g.lifecycle.hostId, sinceMs: p.sinceMs, ...(waitingForCheckpoint ? { recheck: g } : {}) });
  }

  /** Unprotected groups now (for tests and the status of one group). */
  unprotectedCount(): number {
    this.#recheck();
    return this.#exposed.size;
  }

  isUnprotected(groupId: string): boolean {
    this.#recheck();
    return this.#exposed.has(groupId);
  }

  #recheck(): void {
    for (const [id, e] of this.#exposed) {
      if (e.recheck === undefined) continue;
      const p = this.protectionOf(e.recheck);
      if (p.protected !== false) this.#exposed.delete(id);
    }
  }

  /** Per host: unprotected groups, those exposed longer than `longAfterMs`, the oldest exposure. */
  summary(nowMs: number, longAfterMs: number): UnprotectedHostSummary[] {
    this.#recheck();
    const byHost = new Map<string, { count: number; longCount: number; oldestMs: number }>();
    for (const e of this.#exposed.values()) {
      const age = Math.max(0, nowMs - e.sinceMs);
      const row = byHost.get(e.hostId) ?? { count: 0, longCount: 0, oldestMs: 0 };
      row.count += 1;
      if (age > longAfterMs) row.longCount += 1;
      row.oldestMs = Math.max(row.oldestMs, age);
      byHost.set(e.hostId, row);
    }
    // Every live host appears (0 when fully protected), so a host's series drops to 0 rather than vanishing.
    for (const { value: h } of this.fleet.hosts()) {
      if (h.lifecycle.state !== 'REMOVED' && !byHost.has(h.hostId)) byHost.set(h.hostId, { count: 0, longCount: 0, oldestMs: 0 });
    }
    return [...byHost].map(([hostId, r]) => ({ hostId, count: r.count, longCount: r.longCount, oldestAgeSeconds: r.oldestMs / 1000 }));
  }
}
