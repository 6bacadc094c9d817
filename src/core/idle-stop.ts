// Idle auto-stop and protection (R-G2, R-G3, R-G6): only a group that was stopped cleanly and has a
// checkpoint of its current state survives the loss of its host; a RUNNING group is LOST. So a
// group that sits idle between turns is stopped cleanly (and then checkpointed) once nothing has
// happened on it for its `idleStopAfter`, and the groups that are not protected are counted.
// Pure rules: the control plane's idle-stop reconciler (control-plane/idle-stop.ts) executes what
// `decideIdleStop` returns and re-checks it inside the compare-and-set that starts the stop, so a
// BeginTurn that got in first wins.
import { InvalidArgument } from './errors.ts';
import type { GroupState } from './group.ts';
import type { MemberPhase } from './member-session.ts';
import { err, ok, type Result } from './result.ts';

/** Milliseconds of inactivity before an idle group is stopped, or never. 0 = right after every completed turn. */
export type IdleStopAfter = number | 'never';

/** The longest idleStopAfter a group may ask for (a week: longer is `never` in practice). */
export const IDLE_STOP_MAX_MS = 7 * 24 * 3_600_000;

/** The wire form (int64 milliseconds; -1 = never) checked and mapped; undefined = the fleet default. */
export function parseIdleStopAfterMs(v: number | undefined, field = 'idleStopAfterMs'): Result<IdleStopAfter | undefined, InvalidArgument> {
  if (v === undefined) return ok(undefined);
  if (v === -1) return ok('never');
  if (!Number.isSafeInteger(v) || v < 0 || v > IDLE_STOP_MAX_MS) {
    return err(new InvalidArgument('out_of_range', `${field} must be -1 (never) or 0..${IDLE_STOP_MAX_MS} ms`, { details: { field } }));
  }
  return ok(v);
}

/** What the rule reads of a group (its stored record, as the read model or the store has it). */
export interface IdleStopView {
  readonly state: GroupState;
  /** Controller work (an evacuation mark) owns the group's stop: idle stop stays out. */
  readonly evacuating: boolean;
  /** The lifecycle's last activity (start, completed turn, stop). */
  readonly lastActivityAtMs: number;
  /** When the last turn completed (absent: none since the record exists). */
  readonly lastTurnCompletedAtMs?: number | undefined;
  readonly members: readonly {
    readonly phase: MemberPhase;
    /** R-S6: the last turn's process was not reused and nobody confirmed its exit (it may still write the session). */
    readonly exitUnconfirmed: boolean;
  }[];
}

export type IdleStopBlocker =
  | 'not_running'
  | 'never'
  | 'evacuating'
  | 'turn_in_flight'
  | 'exit_unconfirmed'
  | 'member_unconfirmed';

export type IdleStopDecision =
  /** Stop now (cleanly, R-G2), then checkpoint (R-G3). */
  | { readonly action: 'stop' }
  /** Idle, but not for long enough yet: look again at `atMs`. */
  | { readonly action: 'wait'; readonly atMs: number }
  /** Not a candidate until the group changes. */
  | { readonly action: 'none'; readonly why: IdleStopBlocker };

export interface IdleStopTiming {
  readonly after: IdleStopAfter;
  /**
   * A group started (or restarted by a BeginTurn) with no turn completed since is left running at
   * least this long: the turn that started it must get to begin, even with `after` 0.
   */
  readonly startGraceMs: number;
  /**
   * With `after` 0 the completion that made the group idle stops and checkpoints it itself before it
   * answers (afterTurnStep); the idle queue steps in only this long after that turn's end (the
   * completing call died or failed), so the two do not race for every turn. Absent or 0: decide as
   * the completing call does.
   */
  readonly turnEndHandoffMs?: number | undefined;
}

/**
 * Whether `g` is idle: RUNNING, not evacuating, no turn in flight, no member whose last process may
 * still be writing its native session (an exit nobody confirmed, R-S6, or a turn that did not
 * provably end), and no activity for `after` (a start with no completed turn since: at least
 * `startGraceMs`). A process kept idle for a LIVE next turn does not block: its turn provably ended
 * with its cleanup finished (R-S5), the clean stop ends it (SIGTERM, exit within the grace, R-G2),
 * and the next turn is RESTORED instead of LIVE — otherwise groups driven by RunTurn, which keeps
 * the CLI running between turns, would never be protected.
 */
export function decideIdleStop(g: IdleStopView, timing: IdleStopTiming, nowMs: number): IdleStopDecision {
  if (g.state !== 'RUNNING') return { action: 'none', why: 'not_running' };
  if (timing.after === 'never') return { action: 'none', why: 'never' };
  if (g.evacuating) return { action: 'none', why: 'evacuating' };
  for (const m of g.members) {
    if (m.phase === 'IN_TURN') return { action: 'none', why: 'turn_in_flight' };
    // A turn that did not provably end may still have its process writing the session.
    if (m.phase === 'UNCONFIRMED') return { action: 'none', why: 'member_unconfirmed' };
    if (m.exitUnconfirmed) return { action: 'none', why: 'exit_unconfirmed' };
  }
  const lastTurn = g.lastTurnCompletedAtMs ?? 0;
  // The last activity was a start, not a turn end: the turn that caused it gets its grace.
  const wait = g.lastActivityAtMs > lastTurn
    ? Math.max(timing.after, timing.startGraceMs)
    : timing.after === 0 ? timing.turnEndHandoffMs ?? 0 : timing.after;
  const atMs = g.lastActivityAtMs + wait;
  return nowMs >= atMs ? { action: 'stop' } : { action: 'wait', atMs };
}

// ---- protection right after a turn (idleStopAfter 0) ------------------------------------------

/** What the after-turn rule reads: the idle view plus the stop and checkpoint facts. */
export interface AfterTurnView extends IdleStopView {
  /** Set in STOPPED: whether the last stop was clean. */
  readonly stopClean?: boolean | undefined;
  /** The group's latest checkpoint is of its current state (activity version). */
  readonly checkpointCovers: boolean;
}

export type AfterTurnBlocker = IdleStopBlocker | 'activity_since_turn' | 'stopped_unclean' | 'terminal';

export type AfterTurnStep =
  /** Stopped cleanly with a checkpoint of its state (or moving from one): survives its host. */
  | { readonly step: 'protected' }
  /** Idle right after the turn: stop it cleanly now (compare-and-set, re-checked on the stored record). */
  | { readonly step: 'stop' }
  /** A stop (someone's) is under way: wait for its end. */
  | { readonly step: 'await_stop' }
  /** Stopped cleanly, no checkpoint of this state yet: take it (R-G3). */
  | { readonly step: 'checkpoint' }
  /** Cannot be protected now (a turn in flight, started again, stopped unclean, ...): say why. */
  | { readonly step: 'unprotected'; readonly why: AfterTurnBlocker };

/**
 * With idleStopAfter 0 a completion answers only once its group is protected (R-G6): the next step
 * towards "stopped cleanly with a checkpoint of its state" from the group as it is now, or why that
 * cannot be reached now. The idle rule itself (decideIdleStop, with no hand-off wait) decides
 * whether a RUNNING group may be stopped: another member's turn in flight, an unconfirmed exit, an
 * evacuation keep it running, and so does a start after the turn (a next turn got in first).
 */
export function afterTurnStep(g: AfterTurnView, nowMs: number): AfterTurnStep {
  switch (g.state) {
    case 'MIGRATING':
      return { step: 'protected' };
    case 'STOPPED':
      if (g.stopClean !== true) return { step: 'unprotected', why: 'stopped_unclean' };
      return g.checkpointCovers ? { step: 'protected' } : { step: 'checkpoint' };
    case 'STOPPING':
      return { step: 'await_stop' };
    case 'RUNNING': {
      const d = decideIdleStop(g, { after: 0, startGraceMs: 0, turnEndHandoffMs: 0 }, nowMs);
      if (d.action === 'stop') {
        // A start after the last completed turn: a next turn got in first (its own end saves it).
        return g.lastActivityAtMs > (g.lastTurnCompletedAtMs ?? 0) ? { step: 'unprotected', why: 'activity_since_turn' } : { step: 'stop' };
      }
      return { step: 'unprotected', why: d.action === 'none' ? d.why : 'activity_since_turn' };
    }
    case 'PENDING':
      return { step: 'unprotected', why: 'not_running' };
    case 'LOST':
    case 'DESTROYED':
      return { step: 'unprotected', why: 'terminal' };
  }
}

// ---- protection -------------------------------------------------------------------------------

/** What the protection rule reads of a group and its latest checkpoint. */
export interface ProtectionView {
  readonly state: GroupState;
  /** Set in STOPPED/MIGRATING: whether the last stop was clean. */
  readonly stopClean?: boolean | undefined;
  readonly activityVersion: number;
  readonly lastActivityAtMs: number;
  /** When the group last started running (absent in records written before it was kept). */
  readonly runningSinceMs?: number | undefined;
  readonly createdAtMs: number;
  /** The activity version of the group's latest checkpoint; undefined: none (or not known yet). */
  readonly checkpointActivityVersion?: number | undefined;
}

export type Protection =
  /** Terminal: nothing left to protect. */
  | { readonly protected: 'terminal' }
  /** Survives the loss of its host: stopped cleanly with a checkpoint of its state (or moving). */
  | { readonly protected: true }
  /** LOST if its host dies now; unprotected since `sinceMs`. */
  | { readonly protected: false; readonly sinceMs: number };

export function protection(g: ProtectionView): Protection {
  switch (g.state) {
    case 'LOST':
    case 'DESTROYED':
      return { protected: 'terminal' };
    case 'MIGRATING':
      // Started from a clean stop with a usable checkpoint (core refuses anything else).
      return { protected: true };
    case 'PENDING':
      return { protected: false, sinceMs: g.createdAtMs };
    case 'RUNNING':
    case 'STOPPING':
      // Until the start is known, the last activity is a lower bound of the exposure.
      return { protected: false, sinceMs: g.runningSinceMs ?? g.lastActivityAtMs };
    case 'STOPPED':
      if (g.stopClean === true && g.checkpointActivityVersion === g.activityVersion) return { protected: true };
      // Stopped unclean, or clean without a checkpoint of this state: exposed since the stop.
      return { protected: false, sinceMs: g.lastActivityAtMs };
  }
}
