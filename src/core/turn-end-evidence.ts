// Turn-end evidence per native CLI (R-S5, R-S6) as data plus one classifier. A session survives a
// failed query only if the *native* turn is known to have ended; a rejected command, a transport
// disconnect, a timeout or a cancellation is never a turn end. The table says, per CLI, which native
// event ends a turn, whether it must name the current turn, and how success is read from it.

import { everyMemberOf } from './exhaustive.ts';

export type CliKind = 'claude_code' | 'codex' | 'pi' | 'opencode' | 'kilo';
export const CLI_KINDS = everyMemberOf<CliKind>()(['claude_code', 'codex', 'pi', 'opencode', 'kilo']);

/** A native event the driver saw, reduced to the fields the rules read. */
export interface NativeEndEvent {
  /** e.g. `result`, `system/api_retry`, `turn/completed`, `agent_end`, `settled`. */
  readonly type: string;
  /** Codex native turn id / bridge turn id the event belongs to, when the CLI has one. */
  readonly turnId?: string | undefined;
  /** Claude `result.is_error`; bridge `settled` error flag. */
  readonly isError?: boolean | undefined;
  /** Codex `turn/completed` status (`completed`, `failed`, `interrupted`). */
  readonly status?: string | undefined;
  /** Pi: `stopReason` of the last assistant message. */
  readonly stopReason?: string | undefined;
}

export interface TurnEndRule {
  /** Event types that end the native turn. */
  readonly endEvents: readonly string[];
  /** The end event must carry the current native/bridge turn id; others belong to earlier turns. */
  readonly mustMatchCurrentTurn: boolean;
  /** How the end event says success. Anything it does not recognise is a failure, never a success. */
  readonly succeeded: (event: NativeEndEvent) => boolean;
  /** The driver ends the turn and lets the process exit (R-S6): next turn is RESTORED, not LIVE. */
  readonly processExitsAfter: (event: NativeEndEvent) => boolean;
  /** Human-readable rule, for docs and error messages. */
  readonly describe: string;
}

const settled: TurnEndRule = {
  endEvents: ['settled'],
  mustMatchCurrentTurn: true,
  succeeded: (e) => e.isError === false,
  processExitsAfter: () => false,
  describe: "the bridge's `settled` for the current bridge turn (emitted when the native session is idle)",
};

/** R-S5's table, one row per CLI. */
export const TURN_END_RULES: Readonly<Record<CliKind, TurnEndRule>> = {
  claude_code: {
    // R-S6 (pinned 2.1.220): on `system/api_retry` the driver ends the turn itself and lets the
    // process exit, because the CLI's own retry would otherwise continue outside the turn.
    endEvents: ['result', 'system/api_retry'],
    mustMatchCurrentTurn: false,
    succeeded: (e) => e.type === 'result' && e.isError === false,
    processExitsAfter: (e) => e.type === 'system/api_retry',
    describe: 'a `result` event (`is_error` decides), or `system/api_retry` (driver-ended failure, process exits)',
  },
  codex: {
    endEvents: ['turn/completed'],
    mustMatchCurrentTurn: true,
    succeeded: (e) => e.status === 'completed',
    processExitsAfter: () => false,
    describe: '`turn/completed` for the current native turn id (`status` decides)',
  },
  pi: {
    endEvents: ['agent_end'],
    mustMatchCurrentTurn: false,
    // A terminal API error is a failure, never an empty success: only an explicit `stop` succeeds.
    succeeded: (e) => e.stopReason === 'stop',
    processExitsAfter: () => false,
    describe: "`agent_end`; failure read from the last assistant message's `stopReason`",
  },
  opencode: settled,
  kilo: settled,
};

/** Why no native turn end was established. */
export type NotEndedCause = 'command_rejected' | 'transport_disconnect' | 'timeout' | 'cancelled' | 'no_end_event';

/** What the driver observed for one turn. */
export interface TurnObservation {
  readonly cli: CliKind;
  /** The current native (Codex) or bridge (OpenCode/Kilo) turn id. */
  readonly currentTurnId?: string | undefined;
  /** Candidate end events seen during the turn, in order. */
  readonly events: readonly NativeEndEvent[];
  /** Something that interrupted the turn from our side, if any. */
  readonly interruption?: Exclude<NotEndedCause, 'no_end_event'> | undefined;
  /** Activation cleanup finished (R-S5 b). */
  readonly cleanupFinished: boolean;
  /** Transport still usable after the turn (R-S5 c). */
  readonly transportUsable: boolean;
}

/** The classified end of a turn, consumed by member-session.ts `completeTurn`. */
export type TurnEnd =
  | {
      readonly kind: 'ended';
      readonly success: boolean;
      readonly cleanupFinished: boolean;
      readonly transportUsable: boolean;
      /** The process exits after this turn (R-S6): it must not be reused as LIVE. */
      readonly processExits: boolean;
      /**
       * The runner saw the process exit (R-S6). Without it, a process that is not reused is
       * reclaimed before the next start. Absent = not confirmed.
       */
      readonly exitConfirmed?: boolean;
    }
  | { readonly kind: 'not_ended'; readonly cause: NotEndedCause };

/** Classify a turn by its CLI's rule. The first matching end event decides. */
export function classifyTurnEnd(observation: TurnObservation): TurnEnd {
  const rule = TURN_END_RULES[observation.cli];
  const end = observation.events.find(
    (e) =>
      rule.endEvents.includes(e.type) &&
      (!rule.mustMatchCurrentTurn || (observation.currentTurnId !== undefined && e.turnId === observation.currentTurnId)),
  );
  if (end === undefined) return { kind: 'not_ended', cause: observation.interruption ?? 'no_end_event' };
  return {
    kind: 'ended',
    success: rule.succeeded(end),
    cleanupFinished: observation.cleanupFinished,
    transportUsable: observation.transportUsable,
    processExits: rule.processExitsAfter(end),
  };
}
