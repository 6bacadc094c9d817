// Member session identity and context state (R-S1..R-S3, R-S5, R-S6, R-S8). The control plane keeps
// one MemberSession per member and changes it only through these functions; each returns the record
// to write back (compare-and-set) together with the decision, including on refusals, because a
// refusal can itself change the record (e.g. an unconfirmed member becomes LOST).
//
// The rules in one place:
// - NEW only before the first completed native turn; LIVE only on the very process that ran the last
//   turn and is still running, and only for a driver that can reach it; RESTORED only when a new
//   process attaches to retained native state with a saved locator; anything that cannot be
//   confirmed is LOST and the turn is refused.
// - Before a new process starts on retained state, any process that ran a turn on it and may still
//   run (the last turn's process that is not reused, or one whose exit nobody confirmed) is ended
//   (R-S6: never two processes on one native session).
// - The locator is saved only at a turn end, after the observed id is checked; a saved locator is
//   never replaced by a different one (R-S2, R-R2).
import { IdentityRefused, InvalidArgument, NotFound, Unavailable } from './errors.ts';
import { parseLocator, type Locator } from './ids.ts';
import type { CliKind, NotEndedCause, TurnEnd } from './turn-end-evidence.ts';
import { everyMemberOf } from './exhaustive.ts';

/**
 * Which process ran a turn. Two granularities, told apart by the incarnation's form:
 * - a container incarnation, `<container start ms>`: the process a runner drives itself (its own exec)
 *   in that container run. The control plane cannot see that process, only the container it lives
 *   in, so the container run stands for it (containers are never restarted behind our back);
 * - a turn process, `<container start ms>/<process id>`: one CLI process the host agent keeps in that
 *   container run between turns (RunTurn, R-I9), which the agent lists by that id while it runs.
 */
export interface ProcessIdentity {
  readonly containerId: string;
  /** `<container start ms>` or `<container start ms>/<process id>` (see above). */
  readonly incarnation: string;
}

/** The container run a process lives in (itself for a container incarnation). */
export function containerRunOf(p: ProcessIdentity): ProcessIdentity {
  const slash = p.incarnation.indexOf('/');
  return slash < 0 ? p : { containerId: p.containerId, incarnation: p.incarnation.slice(0, slash) };
}

/** True for a CLI process the host agent keeps between turns (`<container start>/<process id>`). */
export function isTurnProcess(p: ProcessIdentity): boolean {
  return p.incarnation.includes('/');
}

/** The identity of turn process `processId` in container run `container` (a container incarnation). */
export function turnProcessIn(container: ProcessIdentity, processId: string): ProcessIdentity {
  return { containerId: container.containerId, incarnation: `${containerRunOf(container).incarnation}/${processId}` };
}

export type MemberPhase =
  /** No native turn has completed: no saved locator. The next begin reports NEW. */
  | 'FRESH'
  /** A turn was begun and not yet completed (R-S8: no second begin). */
  | 'IN_TURN'
  /** ≥1 completed native turn; `savedLocator` set; the native state is retained in the container. */
  | 'RETAINED'
  /**
   * The last turn did not provably end (disconnect, timeout, cancel, rejected command), or its end
   * could not be confirmed (cleanup unfinished, transport unusable, locator not observed). The next
   * begin reports LOST and the member becomes LOST (R-S5).
   */
  | 'UNCONFIRMED'
  /** Terminal: native state or container integrity cannot be confirmed; every begin is refused. */
  | 'LOST';

export const MEMBER_PHASES = everyMemberOf<MemberPhase>()(['FRESH', 'IN_TURN', 'RETAINED', 'UNCONFIRMED', 'LOST']);

/** Context state reported to the runner on every turn (R-S1). */
export type ContextState = 'NEW' | 'LIVE' | 'RESTORED' | 'LOST';

export const CONTEXT_STATES = everyMemberOf<ContextState>()(['NEW', 'LIVE', 'RESTORED', 'LOST']);

export type MemberLossReason =
  | 'turn_unconfirmed'
  | 'container_missing'
  | 'writable_layer_missing'
  | 'session_files_missing'
  | 'locator_missing'
  | 'group_lost';

export type UnconfirmedCause = NotEndedCause | 'stopped_mid_turn' | 'cleanup_unfinished' | 'transport_unusable' | 'locator_unobserved';

export const UNCONFIRMED_CAUSES = everyMemberOf<UnconfirmedCause>()(['command_rejected', 'transport_disconnect', 'timeout', 'cancelled', 'no_end_event', 'stopped_mid_turn', 'cleanup_unfinished', 'transport_unusable', 'locator_unobserved']);

export interface InFlightTurn {
  readonly turnId: string;
  readonly contextState: 'NEW' | 'LIVE' | 'RESTORED';
  /** The locator the turn runs with (undefined for NEW). */
  readonly locator?: Locator;
  /** For LIVE: the reused process. */
  readonly process?: ProcessIdentity;
  readonly startedAtMs: number;
}

export type TurnOutcome =
  /** Ended successfully; locator checked and saved. */
  | 'completed'
  /** Ended with a failure, with all three R-S5 confirmations: the session is kept. */
  | 'failed_kept'
  /** A first turn failed before any native session existed: the member stays FRESH. */
  | 'failed_before_session'
  /** No confirmed native turn end: the member is UNCONFIRMED (next begin reports LOST). */
  | 'unconfirmed'
  /** The observed locator differs from the saved one: refused, saved locator kept (R-S2). */
  | 'locator_mismatch'
  /** No (valid) locator observed at the turn end: refused, member UNCONFIRMED. */
  | 'locator_missing';

export const TURN_OUTCOMES = everyMemberOf<TurnOutcome>()(['completed', 'failed_kept', 'failed_before_session', 'unconfirmed', 'locator_mismatch', 'locator_missing']);

export interface MemberSession {
  readonly memberId: string;
  readonly cli: CliKind;
  readonly phase: MemberPhase;
  /** Set only by a checked turn end; never replaced by a different value. */
  readonly savedLocator?: Locator;
  /** Native turns that ended with a checked locator (success or kept failure). */
  readonly completedTurns: number;
  /** The process that ran the last turn and may be reused LIVE; undefined when none may be. */
  readonly process?: ProcessIdentity;
  /**
   * R-S6 slot reclaim: the process that ran the last turn is not reused, and nobody confirmed that
   * it exited (a Claude api_retry whose exit the runner could not see, a transport lost at the end,
   * a process attached to another session). It may still be running on the native session, so it
   * must be ended before another process starts on that session.
   */
  readonly reclaim?: ProcessIdentity;
  /** Set in IN_TURN. */
  readonly inFlight?: InFlightTurn;
  /** The last completed turn, so a repeated CompleteTurn is answered idempotently. */
  readonly lastTurn?: { readonly turnId: string; readonly outcome: TurnOutcome };
  /** Set in UNCONFIRMED. */
  readonly unconfirmedCause?: UnconfirmedCause;
  /** Set in LOST. */
  readonly lostReason?: MemberLossReason;
}

export function newMemberSession(memberId: string, cli: CliKind): MemberSession {
  return { memberId, cli, phase: 'FRESH', completedTurns: 0 };
}

/** What the host agent observed about the member right before the turn. */
export interface MemberObservation {
  readonly containerPresent: boolean;
  readonly layerIntact: boolean;
  /** The member's container run, when the container runs (a container incarnation, `<start ms>`). */
  readonly runningProcess?: ProcessIdentity | undefined;
  /**
   * The turn processes the host agent keeps for this member in that container run that THIS begin's
   * driver could reuse (RunTurn, with the same command); none for a runner's own begin.
   */
  readonly turnProcesses?: readonly ProcessIdentity[] | undefined;
  /** Cold-start check (R-G5): the native session files for the saved locator exist. Unknown = undefined. */
  readonly sessionFilesPresent?: boolean | undefined;
}

export interface BeginRequest {
  readonly turnId: string;
  /** The runner's locator, if it sent one (already parsed with parseOptionalLocator). */
  readonly locator?: Locator | undefined;
  /**
   * The fleet drives this turn itself (RunTurn): it can reuse only a turn process the host agent
   * keeps (`turnProcesses`), never a process a runner drove itself — and a runner's own begin can
   * never reuse a turn process (it cannot reach it).
   */
  readonly fleetDriven?: boolean | undefined;
}

export type BeginOutcome =
  | {
      readonly ok: true;
      /** Write back with CAS. */
      readonly member: MemberSession;
      readonly contextState: 'NEW' | 'LIVE' | 'RESTORED';
      /** The locator to resume (undefined for NEW). */
      readonly effectiveLocator?: Locator;
      /** A new process must be started for this turn (NEW without a running process, or RESTORED). */
      readonly startProcess: boolean;
      /**
       * R-S6: the container run to restart before the new process starts, because a process that
       * ran a turn on this session may still run in it (the member's `reclaim`, or its last process
       * that is not reused here). Always a container incarnation. Write `member` back only once the
       * container has been restarted.
       */
      readonly reclaimProcess?: ProcessIdentity;
      /** This begin repeats the in-flight one (same turnId): nothing changed. */
      readonly replayed: boolean;
    }
  | {
      readonly ok: false;
      /** Write back with CAS (a refusal may have made the member LOST). */
      readonly member: MemberSession;
      /** 'LOST' when the refusal is a lost context; undefined for request-level refusals. */
      readonly contextState?: 'LOST';
      readonly error: IdentityRefused | Unavailable;
    };

function sameProcess(a: ProcessIdentity | undefined, b: ProcessIdentity | undefined): boolean {
  return a !== undefined && b !== undefined && a.containerId === b.containerId && a.incarnation === b.incarnation;
}

/**
 * R-S1: may this begin reuse `p` (the process the last turn left reusable)? Only if it still runs and
 * this driver can reach it: a turn process the agent lists in the running container run, for the
 * fleet; the very container run the runner's own process lived in, for a runner.
 */
function reusable(p: ProcessIdentity, observation: MemberObservation, fleetDriven: boolean): boolean {
  if (!isTurnProcess(p)) return !fleetDriven && sameProcess(p, observation.runningProcess);
  return fleetDriven && sameProcess(containerRunOf(p), observation.runningProcess) && (observation.turnProcesses ?? []).some((q) => sameProcess(q, p));
}

/** A process that may still run on the session: its container run is the one running now. */
function mayStillRun(p: ProcessIdentity | undefined, observation: MemberObservation): boolean {
  return p !== undefined && sameProcess(containerRunOf(p), observation.runningProcess);
}

function lose(member: MemberSession, reason: MemberLossReason): MemberSession {
  if (member.phase === 'LOST') return member;
  return {
    memberId: member.memberId,
    cli: member.cli,
    phase: 'LOST',
    completedTurns: member.completedTurns,
    ...(member.savedLocator !== undefined ? { savedLocator: member.savedLocator } : {}),
    ...(member.lastTurn !== undefined ? { lastTurn: member.lastTurn } : {}),
    lostReason: reason,
  };
}

function lostRefusal(member: MemberSession, reason: MemberLossReason, identityReason: 'context_lost' | 'locator_missing' = 'context_lost'): BeginOutcome {
  const lost = lose(member, reason);
  return {
    ok: false,
    member: lost,
    contextState: 'LOST',
    error: new IdentityRefused(identityReason, `member ${member.memberId} context is LOST: ${lost.lostReason ?? reason}`, {
      details: { memberId: member.memberId, lostReason: lost.lostReason ?? reason },
    }),
  };
}

function refusal(member: MemberSession, reason: 'locator_mismatch' | 'turn_in_flight', message: string): BeginOutcome {
  return { ok: false, member, error: new IdentityRefused(reason, message, { details: { memberId: member.memberId } }) };
}

/** Begin a turn (R-S1, R-S3, R-S8). */
export function beginTurn(member: MemberSession, request: BeginRequest, observation: MemberObservation, nowMs: number): BeginOutcome {
  switch (member.phase) {
    case 'LOST':
      return lostRefusal(member, member.lostReason ?? 'turn_unconfirmed');
    case 'IN_TURN': {
      const inFlight = member.inFlight;
      if (inFlight !== undefined && inFlight.turnId === request.turnId) {
        if (request.locator !== undefined && request.locator !== inFlight.locator) {
          return refusal(member, 'locator_mismatch', 'request locator differs from the turn in flight');
        }
        return {
          ok: true,
          member,
          contextState: inFlight.contextState,
          ...(inFlight.locator !== undefined ? { effectiveLocator: inFlight.locator } : {}),
          startProcess: false,
          replayed: true,
        };
      }
      return refusal(member, 'turn_in_flight', `member ${member.memberId} already has a turn in flight`);
    }
    case 'UNCONFIRMED':
      return lostRefusal(member, 'turn_unconfirmed');
    case 'FRESH':
    case 'RETAINED':
      break;
  }

  const retained = member.phase === 'RETAINED' || member.completedTurns > 0 || member.savedLocator !== undefined;
  if (retained) {
    if (!observation.containerPresent) return lostRefusal(member, 'container_missing');
    if (!observation.layerIntact) return lostRefusal(member, 'writable_layer_missing');
    // R-S3: a retained member without a recoverable locator is refused, never silently started fresh.
    if (member.savedLocator === undefined) return lostRefusal(member, 'locator_missing', 'locator_missing');
    if (observation.sessionFilesPresent === false) return lostRefusal(member, 'session_files_missing');
  } else if (!observation.containerPresent || !observation.layerIntact) {
    // Nothing native exists yet, so nothing is lost: the control plane recreates the container.
    return {
      ok: false,
      member,
      error: new Unavailable('container_missing', `member ${member.memberId} has no container yet`, { details: { memberId: member.memberId } }),
    };
  }

  // R-S3: a request locator must equal the saved one; a fresh member has no session to name.
  if (request.locator !== undefined && request.locator !== member.savedLocator) {
    return refusal(member, 'locator_mismatch', 'request locator differs from the saved locator');
  }

  if (!retained) {
    const running = observation.runningProcess;
    // R-S6 holds before a first session too: the process of a turn that failed before creating one
    // and whose exit nobody confirmed is ended (its container run restarted) before the next start.
    const lingering = mayStillRun(member.reclaim, observation) ? running : undefined;
    if (lingering !== undefined) return begun(member, { turnId: request.turnId, contextState: 'NEW', startedAtMs: nowMs }, true, lingering);
    return begun(member, { turnId: request.turnId, contextState: 'NEW', startedAtMs: nowMs, ...(running ? { process: running } : {}) }, running === undefined, undefined);
  }
  const locator = member.savedLocator as Locator;
  const last = member.process;
  if (last !== undefined && reusable(last, observation, request.fleetDriven === true)) {
    return begun(member, { turnId: request.turnId, contextState: 'LIVE', locator, process: last, startedAtMs: nowMs }, false, undefined);
  }
  // A new process attaches to the retained session. A process that ran a turn on it and may still run
  // there — the last turn's process whose exit nobody confirmed (R-S6), or the reusable one this
  // driver cannot reuse (a runner's own process for the fleet, a turn process the agent does not
  // list or that was started with another command) — is ended first by restarting its container
  // run; a container that restarted since ended it already.
  const lingering = mayStillRun(member.reclaim, observation) || mayStillRun(last, observation) ? observation.runningProcess : undefined;
  return begun(member, { turnId: request.turnId, contextState: 'RESTORED', locator, startedAtMs: nowMs }, true, lingering);
}

function begun(member: MemberSession, inFlight: InFlightTurn, startProcess: boolean, reclaim: ProcessIdentity | undefined): BeginOutcome {
  // The reclaim is settled by this begin: performed (reclaimProcess) or found moot.
  const { unconfirmedCause: _u, reclaim: _r, ...rest } = member;
  return {
    ok: true,
    member: { ...rest, phase: 'IN_TURN', inFlight },
    contextState: inFlight.contextState,
    ...(inFlight.locator !== undefined ? { effectiveLocator: inFlight.locator } : {}),
    startProcess,
    ...(reclaim !== undefined ? { reclaimProcess: reclaim } : {}),
    replayed: false,
  };
}

export interface TurnCompletion {
  readonly turnId: string;
  /** The native session id the driver observed for this turn (R-S4: root session only), if any. */
  readonly observedLocator?: string | undefined;
  /** From classifyTurnEnd. */
  readonly end: TurnEnd;
  /** The process that ran the turn (for NEW/RESTORED the one started; LIVE uses the reused one). */
  readonly process?: ProcessIdentity | undefined;
}

export type CompleteOutcome =
  | {
      readonly ok: true;
      /** Write back with CAS. Every completion, whatever its outcome, is a group `turn_completed`. */
      readonly member: MemberSession;
      readonly outcome: TurnOutcome;
      /** Set for locator_mismatch / locator_missing: report the turn as refused (FAILED_PRECONDITION). */
      readonly refusal?: IdentityRefused;
      /** The same turn was already completed: nothing changed. */
      readonly duplicate: boolean;
    }
  | { readonly ok: false; readonly error: NotFound | InvalidArgument };

/** Complete a turn (R-S2, R-S5, R-S6). */
export function completeTurn(member: MemberSession, completion: TurnCompletion): CompleteOutcome {
  const inFlight = member.inFlight;
  if (member.phase !== 'IN_TURN' || inFlight === undefined || inFlight.turnId !== completion.turnId) {
    const last = member.lastTurn;
    if (last?.turnId === completion.turnId) {
      // A repeated end of a refused turn is refused again, with the same reason: the runner must
      // see the same answer however it retries (R-S2, idempotency).
      const refused = last.outcome === 'locator_mismatch' || last.outcome === 'locator_missing';
      return {
        ok: true,
        member,
        outcome: last.outcome,
        ...(refused ? { refusal: new IdentityRefused(last.outcome, `turn ${completion.turnId} was refused at its end: ${last.outcome}`, { details: { memberId: member.memberId, phase: 'end' } }) } : {}),
        duplicate: true,
      };
    }
    return { ok: false, error: new NotFound('turn_not_found', `no turn ${completion.turnId} in flight`, { details: { memberId: member.memberId } }) };
  }
  const { inFlight: _f, process: _p, unconfirmedCause: _u, reclaim: _r, ...rest } = member;
  const done = (patch: Partial<MemberSession> & Pick<MemberSession, 'phase'>, outcome: TurnOutcome, refusal?: IdentityRefused): CompleteOutcome => ({
    ok: true,
    member: { ...rest, ...patch, lastTurn: { turnId: completion.turnId, outcome } },
    outcome,
    ...(refusal !== undefined ? { refusal } : {}),
    duplicate: false,
  });
  const unconfirmed = (cause: UnconfirmedCause, outcome: TurnOutcome = 'unconfirmed', refusal?: IdentityRefused, saved?: Locator) =>
    done({ phase: 'UNCONFIRMED', unconfirmedCause: cause, ...(saved !== undefined ? { savedLocator: saved } : {}) }, outcome, refusal);
  const identity = (reason: 'locator_mismatch' | 'locator_missing' | 'locator_invalid', message: string) =>
    new IdentityRefused(reason, message, { details: { memberId: member.memberId, phase: 'end' } });

  const end = completion.end;
  if (end.kind === 'not_ended') return unconfirmed(end.cause);

  const expected = inFlight.locator;
  const raw = completion.observedLocator;
  const parsed = raw === undefined || raw === '' ? undefined : parseLocator(raw, 'observedLocator');
  if (parsed !== undefined && !parsed.ok) {
    return unconfirmed('locator_unobserved', 'locator_missing', identity('locator_invalid', 'observed locator is not a valid session id'));
  }
  const observed = parsed?.value;
  const turnProcess = inFlight.contextState === 'LIVE' ? inFlight.process : completion.process;
  // R-S6: a process that is not reused and whose exit nobody confirmed is reclaimed before the next start.
  const reclaimUnlessExited = (reused: boolean): Partial<MemberSession> =>
    !reused && turnProcess !== undefined && end.exitConfirmed !== true ? { reclaim: turnProcess } : {};

  if (observed === undefined) {
    // A first turn that failed before the CLI created a session leaves nothing native behind; its
    // process is not reused (a NEW turn starts clean) and is reclaimed unless its exit was confirmed.
    if (expected === undefined && !end.success && end.cleanupFinished && end.transportUsable) {
      return done({ phase: 'FRESH', ...reclaimUnlessExited(false) }, 'failed_before_session');
    }
    return unconfirmed('locator_unobserved', 'locator_missing', identity('locator_missing', 'no session id observed at turn end'));
  }
  if (expected !== undefined && observed !== expected) {
    // R-S2: the turn fails, the saved locator stays. The process that ran it is attached to another
    // session, so it is not reused: the next turn starts a new process on the saved session.
    return done({ phase: 'RETAINED', ...reclaimUnlessExited(false) }, 'locator_mismatch', identity('locator_mismatch', 'resumed session reported a different id'));
  }
  const saved = expected ?? observed;
  if (!end.success && !(end.cleanupFinished && end.transportUsable)) {
    // R-S5: a failure keeps the session only with all three confirmations.
    return unconfirmed(end.cleanupFinished ? 'transport_unusable' : 'cleanup_unfinished', 'unconfirmed', undefined, saved);
  }
  const reusable = !end.processExits && end.transportUsable && turnProcess !== undefined;
  return done(
    { phase: 'RETAINED', savedLocator: saved, completedTurns: member.completedTurns + 1, ...(reusable ? { process: turnProcess } : reclaimUnlessExited(false)) },
    end.success ? 'completed' : 'failed_kept',
  );
}

/** A member's process exited outside our control; it can no longer be LIVE. */
export function onProcessExited(member: MemberSession, process: ProcessIdentity): MemberSession {
  if (sameProcess(member.reclaim, process)) {
    const { reclaim: _r, ...rest } = member;
    return rest;
  }
  if (!sameProcess(member.process, process)) return member;
  const { process: _p, ...rest } = member;
  return rest;
}

/** The member's container was stopped (group stop): no process survives; a turn cut off is unconfirmed. */
export function onContainerStopped(member: MemberSession): MemberSession {
  // A stopped container ends every process in it: nothing is left to reclaim either.
  const { process: _p, inFlight: _f, reclaim: _r, ...rest } = member;
  if (member.phase === 'IN_TURN') return { ...rest, phase: 'UNCONFIRMED', unconfirmedCause: 'stopped_mid_turn' };
  return member.process === undefined && member.reclaim === undefined ? member : rest;
}

/** The member was restored on a new host (R-G5 proven): the same native state, no process yet. */
export function onRestored(member: MemberSession): MemberSession {
  return onContainerStopped(member);
}

/** The member's group was declared LOST (or its state is otherwise gone). Keeps the first reason. */
export function markMemberLost(member: MemberSession, reason: MemberLossReason): MemberSession {
  return lose(member, reason);
}
