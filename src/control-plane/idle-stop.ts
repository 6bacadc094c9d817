// Idle auto-stop (R-G2, R-G3, R-G6): a RUNNING group that sits idle between turns is stopped cleanly
// and checkpointed, so the loss of its host restores it instead of making it LOST. A keyed reconciler
// on the leader, fed by the read model's group changes (never a scan of all groups on a timer): each
// change re-judges its group with core's decideIdleStop and parks the key until the group's own idle
// deadline (requeueAfter). The stop itself is a compare-and-set that re-checks the rule on the stored
// record, so a BeginTurn that got in first wins and the stop is not taken; a BeginTurn that comes
// after the stop waits for it and starts the group again (RESTORED). Stops are rate-limited
// (idleStopsPerSecond) and bounded in parallel (idleStopParallelism).
// The same queue retries the checkpoint of clean stops until one covers the group's state (its own
// right away, anyone else's after CHECKPOINT_RETRY_MS: a runner's StopGroup or a completion below
// takes its own first), and finishes a stop that a crash left STOPPING.
// idleStopAfter 0 ("stop right after every completed turn") is done ON the turn's path, not by the
// queue: the completion stops and checkpoints its group before it answers (protectAfterTurn, called
// by the runner backend's CompleteTurn and so by RunTurn's end), so a runner that holds the answer
// holds a protected conversation. The queue steps in for such a group only TURN_END_HANDOFF_MARGIN_MS
// after the stop grace has passed since the turn's end (the completing call died or failed).
import { afterTurnStep, decideIdleStop, type AfterTurnBlocker, type AfterTurnView, type IdleStopAfter, type IdleStopDecision } from '../core/idle-stop.ts';
import { isFleetError } from '../core/index.ts';
import { CasConflictError } from '../store/errors.ts';
import { describeError, isTerminal } from './fleet.ts';
import { GroupOps, type GroupOpsDeps } from './group-ops.ts';
import { KeyedQueue, type ReconcileResult } from './keyed-queue.ts';
import type { GroupRecord } from './records.ts';
import { Keys } from './state.ts';

/** Retry of a checkpoint that failed (the host busy, the group started again in between, ...). */
const CHECKPOINT_RETRY_MS = 30_000;
/**
 * A checkpoint that keeps failing (its host unreachable, full, refusing) is retried with doubling
 * delays up to this: at fleet scale, thousands of uncovered groups retried every 30 s forever would
 * be the control plane's main load (measured by bench/scale before the backoff).
 */
const CHECKPOINT_RETRY_MAX_MS = 15 * 60_000;

/** Delay before the next checkpoint attempt after `failures` failed ones in a row. */
export function checkpointRetryDelayMs(failures: number): number {
  return Math.min(CHECKPOINT_RETRY_MAX_MS, CHECKPOINT_RETRY_MS * 2 ** Math.max(0, Math.min(failures - 1, 16)));
}
/** A STOPPING group is left to whoever stops it for the grace plus this, then its stop is finished here. */
const STOP_FINISH_MARGIN_MS = 15_000;
/** With idleStopAfter 0, the queue leaves a group to its completing call for the stop grace plus this. */
const TURN_END_HANDOFF_MARGIN_MS = 10_000;

/** What the idle queue has to do for a group now. */
export type IdleWork =
  | { readonly kind: 'none' }
  | { readonly kind: 'wait'; readonly atMs: number }
  /** RUNNING and idle for long enough: stop it cleanly, then checkpoint it. */
  | { readonly kind: 'stop' }
  /** STOPPING for longer than a stop takes (a crash cut it off): finish the stop (same command id). */
  | { readonly kind: 'finish_stop' }
  /** STOPPED clean by an idle stop, without a checkpoint of its state yet: take it. */
  | { readonly kind: 'checkpoint' };

/** The group's idle-stop setting: its own (OpenGroup), else the fleet's. */
export function idleStopAfterOf(g: GroupRecord, fleetDefault: IdleStopAfter): IdleStopAfter {
  return g.idleStopAfterMs ?? fleetDefault;
}

/** Core's decision on a stored group record. */
export function idleDecision(g: GroupRecord, after: IdleStopAfter, startGraceMs: number, nowMs: number, turnEndHandoffMs = 0): IdleStopDecision {
  return decideIdleStop(idleView(g), { after, startGraceMs, turnEndHandoffMs }, nowMs);
}

function idleView(g: GroupRecord): AfterTurnView {
  return {
    state: g.lifecycle.state,
    evacuating: g.evacuation !== undefined,
    lastActivityAtMs: g.lifecycle.lastActivityAtMs,
    lastTurnCompletedAtMs: g.lastTurnCompletedAtMs,
    members: g.members.map((m) => ({ phase: m.session.phase, exitUnconfirmed: m.session.reclaim !== undefined })),
    stopClean: g.lifecycle.stop?.clean,
    checkpointCovers: false,
  };
}

export interface IdleWorkSettings {
  readonly idleStopAfterMs: IdleStopAfter;
  readonly idleStopStartGraceMs: number;
  readonly stopGraceMs: number;
}

/**
 * What the idle queue does for `g` (pure). `checkpointCovers`: the group's latest checkpoint is of
 * its current state (the read model's checkpoint index; false while unknown). `ownStop`: this
 * leader's idle stop stopped it; anyone else's clean stop (a runner's StopGroup, a completion with
 * idleStopAfter 0) takes its own checkpoint first, and the queue takes it only CHECKPOINT_RETRY_MS
 * after the stop when none covers the state by then (theirs failed or was cut off).
 */
export function idleWork(g: GroupRecord, checkpointCovers: boolean, ownStop: boolean, s: IdleWorkSettings, nowMs: number): IdleWork {
  if (isTerminal(g) || g.evacuation !== undefined) return { kind: 'none' };
  const after = idleStopAfterOf(g, s.idleStopAfterMs);
  switch (g.lifecycle.state) {
    case 'RUNNING': {
      const d = idleDecision(g, after, s.idleStopStartGraceMs, nowMs, s.stopGraceMs + TURN_END_HANDOFF_MARGIN_MS);
      return d.action === 'stop' ? { kind: 'stop' } : d.action === 'wait' ? { kind: 'wait', atMs: d.atMs } : { kind: 'none' };
    }
    case 'STOPPING': {
      const atMs = g.updatedAtMs + s.stopGraceMs + STOP_FINISH_MARGIN_MS;
      return nowMs >= atMs ? { kind: 'finish_stop' } : { kind: 'wait', atMs };
    }
    case 'STOPPED': {
      if (g.lifecycle.stop?.clean !== true || checkpointCovers) return { kind: 'none' };
      if (ownStop) return { kind: 'checkpoint' };
      const atMs = g.updatedAtMs + CHECKPOINT_RETRY_MS;
      return nowMs >= atMs ? { kind: 'checkpoint' } : { kind: 'wait', atMs };
    }
    default:
      return { kind: 'none' };
  }
}

/** Spaces idle stops out: at most `perSecond` starts a second (stops and checkpoints load hosts). */
class StartPacer {
  #nextMs = 0;

  constructor(private readonly perSecond: number) {}

  /** 0 when a start may go now (and is counted); else how long to wait. */
  take(nowMs: number): number {
    if (nowMs < this.#nextMs) return this.#nextMs - nowMs;
    this.#nextMs = Math.max(this.#nextMs, nowMs - 1_000) + 1_000 / this.perSecond;
    return 0;
  }
}

export type IdleStopperDeps = GroupOpsDeps;

export class IdleStopper {
  readonly #ops: GroupOps;
  readonly #queue: KeyedQueue;
  readonly #pacer: StartPacer;
  /** Groups the queue may have work on (kept from every change, on every replica, so a new leader starts from it). */
  readonly #candidates = new Set<string>();
  /** Groups this leader idle-stopped whose checkpoint is not taken yet. */
  readonly #ownStops = new Set<string>();
  /** Checkpoint attempts that failed in a row per group, and when the next one may run (backoff). */
  readonly #checkpointFailures = new Map<string, { readonly failures: number; readonly nextAtMs: number }>();
  readonly #unsubscribe: () => void;
  #leading = false;

  constructor(private readonly ctx: IdleStopperDeps) {
    this.#ops = new GroupOps(ctx);
    this.#pacer = new StartPacer(ctx.config.idleStopsPerSecond);
    this.#queue = new KeyedQueue((groupId) => {
      ctx.metrics.reconciles.inc({ queue: 'idle', result: 'ok' });
      return this.reconcile(groupId);
    }, {
      concurrency: ctx.config.idleStopParallelism,
      onError: (key, err) => {
        ctx.metrics.reconciles.inc({ queue: 'idle', result: 'error' });
        ctx.logger.warn({ key, queue: 'idle', ...describeError(err) }, 'idle stop failed; retried with backoff');
      },
      baseBackoffMs: 1_000,
      maxBackoffMs: 60_000,
      now: ctx.now,
    });
    this.#unsubscribe = ctx.fleet.onGroupChange((_key, _before, after) => this.#changed(after));
  }

  get depth(): number {
    return this.#queue.depth;
  }

  /** This replica leads: queue every candidate (the model is synced by the caller). */
  startLeading(): void {
    this.#leading = true;
    this.#queue.start();
    for (const id of this.#candidates) this.#queue.add(id);
  }

  stopLeading(): void {
    this.#leading = false;
    this.#queue.stop();
    this.#ownStops.clear();
    this.#checkpointFailures.clear();
  }

  whenIdle(): Promise<void> {
    return this.#queue.whenIdle();
  }

  close(): void {
    this.stopLeading();
    this.#unsubscribe();
  }

  #settings(): IdleWorkSettings {
    return this.ctx.config;
  }

  #covers(g: GroupRecord): boolean {
    const id = g.latestCheckpointId;
    if (id === undefined) return false;
    return this.ctx.fleet.checkpoint(Keys.checkpoint(g.groupId, id))?.activityVersion === g.lifecycle.activityVersion;
  }

  #changed(after: GroupRecord | undefined): void {
    if (after === undefined) return;
    const state = after.lifecycle.state;
    // Cheap filter on every change: only groups the queue could act on are kept.
    if (state !== 'STOPPED') this.#ownStops.delete(after.groupId);
    const uncovered = state === 'STOPPED' && after.lifecycle.stop?.clean === true && !this.#covers(after);
    const candidate = !isTerminal(after) && after.evacuation === undefined && (state === 'RUNNING' || state === 'STOPPING' || uncovered);
    if (!candidate) {
      this.#candidates.delete(after.groupId);
      this.#checkpointFailures.delete(after.groupId);
      return;
    }
    this.#candidates.add(after.groupId);
    if (this.#leading) this.#queue.add(after.groupId);
  }

  /**
   * One group: judge it from the read model; act (re-checked on the stored record) or park it until
   * its deadline. Exposed for tests that drive it directly.
   */
  async reconcile(groupId: string): Promise<ReconcileResult> {
    const cached = this.ctx.fleet.group(Keys.group(groupId))?.value;
    if (cached === undefined) return {};
    const now = this.ctx.now();
    const work = idleWork(cached, this.#covers(cached), this.#ownStops.has(groupId), this.#settings(), now);
    switch (work.kind) {
      case 'none':
        return {};
      case 'wait':
        return { requeueAfterMs: Math.max(1, work.atMs - now) };
      case 'finish_stop':
        await this.#ops.stop(groupId, this.ctx.config.stopGraceMs, 'idle stop (finishing an interrupted stop)');
        return this.#afterStop(groupId);
      case 'checkpoint': {
        const backoff = this.#checkpointFailures.get(groupId);
        if (backoff !== undefined && now < backoff.nextAtMs) return { requeueAfterMs: backoff.nextAtMs - now };
        return this.#checkpoint(groupId);
      }
      case 'stop':
        break;
    }
    const wait = this.#pacer.take(now);
    if (wait > 0) return { requeueAfterMs: wait };
    // The stop's compare-and-set re-checks the rule on the stored record: a turn that began (or any
    // activity) since the read model's copy wins, and nothing is stopped.
    const requested = await this.#ops.transition(groupId, { type: 'stop_requested' }, `idle stop: no activity for ${idleStopAfterOf(cached, this.ctx.config.idleStopAfterMs)} ms`,
      (c) => idleWork(c, false, false, this.#settings(), this.ctx.now()).kind === 'stop',
      (c) => ({ stops: c.stops + 1 }));
    if (requested === undefined) {
      this.ctx.metrics.idleStops.inc({ result: 'lost_race' });
      // Whatever changed announces itself through the read model, which re-queues the key.
      return {};
    }
    const stopped = await this.#ops.stop(groupId, this.ctx.config.stopGraceMs, 'idle stop');
    if (stopped.lifecycle.state !== 'STOPPED' || stopped.lifecycle.stop?.clean !== true) {
      this.ctx.metrics.idleStops.inc({ result: stopped.lifecycle.state === 'STOPPED' ? 'unclean' : 'failed' });
      return {};
    }
    return this.#afterStop(groupId);
  }

  /** After our stop: checkpoint right away when it was clean (R-G3). */
  async #afterStop(groupId: string): Promise<ReconcileResult> {
    const g = (await this.ctx.groups.get(groupId))?.value;
    if (g === undefined || g.lifecycle.state !== 'STOPPED' || g.lifecycle.stop?.clean !== true) return {};
    this.#ownStops.add(groupId);
    const r = await this.#checkpoint(groupId);
    this.ctx.metrics.idleStops.inc({ result: r.requeueAfterMs === undefined ? 'stopped' : 'failed' });
    return r;
  }

  async #checkpoint(groupId: string): Promise<ReconcileResult> {
    try {
      await this.#ops.checkpoint(groupId);
      this.#ownStops.delete(groupId);
      this.#checkpointFailures.delete(groupId);
      return {};
    } catch (err) {
      // A BeginTurn that started the group again makes this checkpoint moot (the agent refuses it);
      // anything else is retried while the group stays as it is.
      const g = (await this.ctx.groups.get(groupId))?.value;
      if (g === undefined || g.lifecycle.state !== 'STOPPED') {
        this.#ownStops.delete(groupId);
        this.#checkpointFailures.delete(groupId);
        return {};
      }
      const failures = (this.#checkpointFailures.get(groupId)?.failures ?? 0) + 1;
      const delayMs = checkpointRetryDelayMs(failures);
      this.#checkpointFailures.set(groupId, { failures, nextAtMs: this.ctx.now() + delayMs });
      this.ctx.logger.warn({ groupId, failures, retryInMs: delayMs, ...describeError(err) }, 'checkpoint of a clean stop failed; retried');
      return { requeueAfterMs: delayMs };
    }
  }
}

// ---- idleStopAfter 0: protected before the completion answers ----------------------------------

/** Steps one protection may take (stop, await a stop, checkpoint, and re-judging after a lost race). */
const AFTER_TURN_STEPS = 8;
/**
 * How long a completion waits out a chunk GC sweep that refuses its checkpoint (gc_in_progress):
 * sweeps are short and run only while no checkpoint does, so a steady stream of turns meets them;
 * past this the turn is answered unprotected and the idle queue takes the checkpoint later.
 */
const AFTER_TURN_GC_WAIT_MS = 10_000;

/** What protectAfterTurn reached. `acted`: this call stopped the group or took its checkpoint. */
export type AfterTurnProtection =
  | { readonly protected: true; readonly acted: boolean }
  | { readonly protected: false; readonly acted: boolean; readonly why: AfterTurnBlocker | 'failed'; readonly error?: string | undefined };

/**
 * With idleStopAfter 0: bring the group to "stopped cleanly with a checkpoint of its state" (R-G2,
 * R-G3, R-G6) before the completion answers, step by step as core's afterTurnStep says, each step
 * re-judged on the stored record. The stop is the same compare-and-set as the idle queue's: a turn
 * that began in between wins and nothing is stopped. Never throws for a failed stop or checkpoint:
 * the turn's answer stands, and the result says why the group is not protected yet (the idle queue
 * retries: a STOPPING group is finished, an uncovered clean stop checkpointed, a RUNNING one stopped).
 */
export async function protectAfterTurn(ctx: GroupOpsDeps, ops: GroupOps, groupId: string): Promise<AfterTurnProtection> {
  let acted = false;
  let error: string | undefined;
  const gcWaitUntil = ctx.now() + AFTER_TURN_GC_WAIT_MS;
  let gcDelayMs = 100;
  for (let i = 0; i < AFTER_TURN_STEPS; i++) {
    let gv;
    try {
      gv = await ops.get(groupId);
    } catch (err) {
      return { protected: false, acted, why: 'failed', error: errorText(err) };
    }
    const g = gv.value;
    const step = afterTurnStep({ ...idleView(g), checkpointCovers: await covered(ctx, g) }, ctx.now());
    try {
      switch (step.step) {
        case 'protected':
          return { protected: true, acted };
        case 'unprotected':
          return { protected: false, acted, why: step.why };
        case 'stop': {
          const requested = await ops.transition(groupId, { type: 'stop_requested' }, 'idle stop right after the turn (idle_stop_after 0)',
            (c) => afterTurnStep({ ...idleView(c), checkpointCovers: false }, ctx.now()).step === 'stop',
            (c) => ({ stops: c.stops + 1 }));
          // Lost the race (a begin, another stop): judged again from the stored record.
          if (requested === undefined) break;
          acted = true;
          await ops.stop(groupId, ctx.config.stopGraceMs, 'idle stop right after the turn (idle_stop_after 0)');
          break;
        }
        case 'await_stop':
          await awaitStopEnd(ctx, groupId, gv.revision);
          break;
        case 'checkpoint':
          acted = true;
          await ops.checkpoint(groupId);
          break;
      }
    } catch (err) {
      error = errorText(err);
      // A chunk GC sweep holds its lock: wait it out (bounded), the retry is not a step of its own.
      if (isFleetError(err) && err.reason === 'gc_in_progress' && ctx.now() + gcDelayMs < gcWaitUntil) {
        await new Promise((r) => setTimeout(r, gcDelayMs));
        gcDelayMs = Math.min(2 * gcDelayMs, 1_000);
        i -= 1;
        continue;
      }
      // A lost compare-and-set (e.g. two takers of one checkpoint) is judged again, and so is a
      // failure after which the group record moved on: a turn that began meanwhile started the group
      // again, and the agent refused to checkpoint a running group (seen with protect_in_background).
      // Anything else (host unreachable, a refused capture) leaves the group to the idle queue.
      if (!(err instanceof CasConflictError) && !(await movedOn(ops, groupId, gv.revision))) return { protected: false, acted, why: 'failed', error };
    }
  }
  return { protected: false, acted, why: 'failed', error: error ?? 'no progress' };
}

/** The group's stored record is no longer the one a step was decided on (unreadable: not known to have). */
async function movedOn(ops: GroupOps, groupId: string, decidedOn: number): Promise<boolean> {
  const now = await ops.get(groupId).catch(() => undefined);
  return now !== undefined && now.revision !== decidedOn;
}

function errorText(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).slice(0, 512);
}

/** The group's latest checkpoint is of its current state (read from the store: the model may lag). */
async function covered(ctx: GroupOpsDeps, g: GroupRecord): Promise<boolean> {
  if (g.lifecycle.state !== 'STOPPED' || g.latestCheckpointId === undefined) return false;
  return (await ctx.checkpoints.get(g.groupId, g.latestCheckpointId))?.activityVersion === g.lifecycle.activityVersion;
}

/** Someone else's stop is under way: wait (bounded by its grace plus 10 s) until the model shows its end. */
async function awaitStopEnd(ctx: GroupOpsDeps, groupId: string, seenRevision: number): Promise<void> {
  const until = ctx.now() + ctx.config.stopGraceMs + 10_000;
  const key = Keys.group(groupId);
  for (;;) {
    const m = ctx.fleet.group(key);
    if (m !== undefined && m.revision > seenRevision && m.value.lifecycle.state !== 'STOPPING') return;
    if (ctx.now() > until) throw new Error(`group ${groupId} is still stopping`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
